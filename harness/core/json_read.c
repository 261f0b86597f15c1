/* json_read.c: see json_read.h. Recursive descent with a depth limit; every allocation checked. */
#include "harness/core/json_read.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "reference/kvb.h"
#include "harness/core/files.h"
#include "harness/core/json.h"

#define MAX_DEPTH 64

typedef struct parser {
    const char *p, *start;
    int flags;
    const char *why; /* the first error: what was expected or found */
} parser;

static void skip_ws(parser *j)
{
    while (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r') j->p++;
}

static int bad(parser *j, const char *why)
{
    if (!j->why) j->why = why;
    return -1;
}

static int parse_value(parser *j, kvb_jval *v, int depth);

typedef struct sbuf {
    char *s;
    size_t len, cap;
} sbuf;

static int sbuf_put(sbuf *b, const char *bytes, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (b->len + n + 1 > cap) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) return -1;
        b->s = s, b->cap = cap;
    }
    memcpy(b->s + b->len, bytes, n);
    b->len += n;
    b->s[b->len] = '\0';
    return 0;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char h = p[k];
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + (unsigned)d;
    }
    *out = v;
    return 0;
}

static size_t utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000)
        return out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 0x3F)), out[2] = (char)(0x80 | (cp & 0x3F)), 3;
    out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F)), out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static char *parse_string(parser *j)
{
    if (*j->p != '"') return bad(j, "expected a string"), NULL;
    j->p++;
    sbuf b = {0};
    /* the usual string: no escape, one allocation of its size */
    const char *end = j->p;
    while (*end && *end != '"' && *end != '\\' && (unsigned char)*end >= 0x20) end++;
    const size_t plain = (size_t)(end - j->p);
    if (*end == '"' && kvb_utf8_invalid_at(j->p, plain) == plain) {
        char *s = malloc(plain + 1);
        if (!s) return bad(j, "out of memory"), NULL;
        memcpy(s, j->p, plain);
        s[plain] = '\0';
        j->p = end + 1;
        return s;
    }
    if (sbuf_put(&b, "", 0)) return bad(j, "out of memory"), NULL;
    for (;;) {
        const char *run = j->p; /* plain characters up to a quote, a backslash or a control character */
        while (*j->p && *j->p != '"' && *j->p != '\\' && (unsigned char)*j->p >= 0x20) j->p++;
        size_t n = (size_t)(j->p - run);
        size_t invalid = kvb_utf8_invalid_at(run, n);
        if (invalid < n) {
            j->p = run + invalid;
            return free(b.s), bad(j, "a string that is not valid UTF-8"), NULL;
        }
        if (sbuf_put(&b, run, n)) return free(b.s), bad(j, "out of memory"), NULL;
        char c = *j->p;
        if (c == '"') break;
        if (!c) return free(b.s), bad(j, "an unterminated string"), NULL;
        if (c != '\\') return free(b.s), bad(j, "a control character in a string (JSON escapes it)"), NULL;
        char e = j->p[1], out[4];
        size_t len = 1;
        j->p += 2;
        switch (e) {
        case 'n': out[0] = '\n'; break;
        case 't': out[0] = '\t'; break;
        case 'r': out[0] = '\r'; break;
        case 'b': out[0] = '\b'; break;
        case 'f': out[0] = '\f'; break;
        case '"': case '\\': case '/': out[0] = e; break;
        case 'u': {
            unsigned cp, lo;
            if (hex4(j->p, &cp)) return free(b.s), bad(j, "\\u without 4 hex digits"), NULL;
            j->p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return free(b.s), bad(j, "a lone low surrogate \\u escape"), NULL;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair: the low half must follow */
                if (j->p[0] != '\\' || j->p[1] != 'u' || hex4(j->p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return free(b.s), bad(j, "a high surrogate \\u escape without its low half"), NULL;
                j->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp == 0) return free(b.s), bad(j, "\\u0000 in a string"), NULL;
            len = utf8_encode(cp, out);
            break;
        }
        default: j->p -= 2; return free(b.s), bad(j, "an unknown escape in a string"), NULL;
        }
        if (sbuf_put(&b, out, len)) return free(b.s), bad(j, "out of memory"), NULL;
    }
    j->p++;
    return b.s;
}

/* RFC 8259: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?, and a finite double */
static int parse_number(parser *j, kvb_jval *v)
{
    const char *s = j->p, *p = s;
    if (*p == '-') p++;
    if (j->flags & KVB_JSON_NONFINITE) { /* Google Benchmark's non-finite doubles */
        if (!strncmp(p, "NaN", 3)) return j->p = p + 3, v->type = KVB_J_NUM, v->num = NAN, 0;
        if (!strncmp(p, "Infinity", 8)) return j->p = p + 8, v->type = KVB_J_NUM, v->num = *s == '-' ? -INFINITY : INFINITY, 0;
    }
    if (*p == '0') {
        p++;
        if (*p >= '0' && *p <= '9') return j->p = p, bad(j, "a number with a leading zero (not JSON)");
    } else if (*p >= '1' && *p <= '9') {
        while (*p >= '0' && *p <= '9') p++;
    } else {
        return bad(j, *s == '+' ? "a number with a leading '+' (not JSON)"
                      : !strncmp(p, "NaN", 3) || !strncmp(p, "Infinity", 8) || !strncmp(p, "inf", 3) || !strncmp(p, "nan", 3)
                          ? "a non-finite number (NaN and Infinity are not JSON)"
                          : *s == '.' ? "a number without a digit before '.' (not JSON)" : "expected a value");
    }
    if ((*p == 'x' || *p == 'X') && p[-1] == '0') return j->p = p, bad(j, "a hexadecimal number (not JSON)");
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9')) return j->p = p, bad(j, "a number without a digit after '.' (not JSON)");
        while (*p >= '0' && *p <= '9') p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!(*p >= '0' && *p <= '9')) return j->p = p, bad(j, "a number with an empty exponent");
        while (*p >= '0' && *p <= '9') p++;
    }
    errno = 0;
    char *end;
    double x = strtod(s, &end);
    if (end != p) return bad(j, "a malformed number");
    if (!isfinite(x)) return bad(j, "a number beyond the range of a double");
    v->type = KVB_J_NUM;
    v->num = x;
    j->p = p;
    return 0;
}

static int cmp_key(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* a duplicate key: which value is meant is not defined (RFC 8259 4): refused */
static const char *duplicate_key(const kvb_jval *v)
{
    if (v->n < 2) return NULL;
    if (v->n <= 16) { /* the usual object: a few keys, compared pairwise */
        for (int i = 1; i < v->n; i++)
            for (int k = 0; k < i; k++)
                if (!strcmp(v->keys[i], v->keys[k])) return v->keys[i];
        return NULL;
    }
    char **k = malloc(sizeof *k * (size_t)v->n);
    if (!k) return NULL;
    memcpy(k, v->keys, sizeof *k * (size_t)v->n);
    qsort(k, (size_t)v->n, sizeof *k, cmp_key);
    const char *dup = NULL;
    for (int i = 1; i < v->n && !dup; i++)
        if (!strcmp(k[i - 1], k[i])) dup = k[i];
    free(k);
    return dup;
}

static int parse_container(parser *j, kvb_jval *v, int object, int depth)
{
    if (depth > MAX_DEPTH) return bad(j, "nested more than 64 deep");
    v->type = object ? KVB_J_OBJ : KVB_J_ARR;
    j->p++;
    int cap = 4; /* grown by doubling; elements are set as they are parsed (kvb_json_free reads the first n) */
    v->items = malloc((size_t)cap * sizeof(kvb_jval));
    v->keys = object ? malloc((size_t)cap * sizeof(char *)) : NULL;
    if (!v->items || (object && !v->keys)) return bad(j, "out of memory");
    skip_ws(j);
    if (*j->p == (object ? '}' : ']')) return j->p++, 0;
    for (;;) {
        if (v->n == cap) {
            if (cap > (1 << 28)) return bad(j, "more than 2^28 elements in one array or object");
            kvb_jval *items = realloc(v->items, sizeof(kvb_jval) * (size_t)cap * 2);
            if (!items) return bad(j, "out of memory");
            v->items = items;
            if (object) {
                char **keys = realloc(v->keys, sizeof(char *) * (size_t)cap * 2);
                if (!keys) return bad(j, "out of memory");
                v->keys = keys;
            }
            cap *= 2;
        }
        skip_ws(j);
        if (object) {
            char *k = parse_string(j);
            if (!k) return -1;
            skip_ws(j);
            if (*j->p != ':') {
                free(k);
                return bad(j, "expected ':' after a key");
            }
            j->p++;
            v->keys[v->n] = k;
        }
        if (parse_value(j, &v->items[v->n], depth + 1)) {
            if (object) free(v->keys[v->n]);
            kvb_json_free(&v->items[v->n]);
            return -1;
        }
        v->n++;
        skip_ws(j);
        if (*j->p == ',') {
            j->p++;
            continue;
        }
        if (*j->p == (object ? '}' : ']')) {
            if (object && duplicate_key(v)) return bad(j, "an object with a duplicate key");
            return j->p++, 0;
        }
        return bad(j, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int parse_value(parser *j, kvb_jval *v, int depth)
{
    memset(v, 0, sizeof *v);
    skip_ws(j);
    char c = *j->p;
    if (c == '{' || c == '[') return parse_container(j, v, c == '{', depth);
    if (c == '"') {
        v->type = KVB_J_STR;
        return (v->str = parse_string(j)) ? 0 : -1;
    }
    if ((c == 't' && !strncmp(j->p, "true", 4)) || (c == 'n' && !strncmp(j->p, "null", 4))) {
        v->type = c == 't' ? KVB_J_BOOL : KVB_J_NULL;
        v->num = c == 't';
        j->p += 4;
        return 0;
    }
    if (c == 'f' && !strncmp(j->p, "false", 5)) {
        v->type = KVB_J_BOOL;
        j->p += 5;
        return 0;
    }
    if (!c) return bad(j, "unexpected end of the text");
    return parse_number(j, v);
}

void kvb_json_free(kvb_jval *v)
{
    if (!v) return;
    for (int i = 0; i < v->n; i++) {
        if (v->items) kvb_json_free(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    memset(v, 0, sizeof *v);
}

int kvb_json_read_text_flags(const char *text, const char *what, kvb_jval *root, int flags)
{
    parser j = {text, text, flags, NULL};
    memset(root, 0, sizeof *root);
    skip_ws(&j);
    if (!*j.p) return kvb_fail(KVB_EINVAL, "%s: empty, not JSON", what);
    int rc = parse_value(&j, root, 0);
    if (!rc) {
        skip_ws(&j);
        if (*j.p) rc = bad(&j, "text after the end of the document");
    }
    if (rc || j.why) {
        kvb_json_free(root);
        long line = 1, col = 1;
        for (const char *p = text; p < j.p; p++) {
            if (*p == '\n') line++, col = 1;
            else col++;
        }
        return kvb_fail(KVB_EINVAL, "%s: malformed JSON at byte %ld (line %ld, column %ld): %s", what,
                        (long)(j.p - j.start), line, col, j.why ? j.why : "unexpected text");
    }
    return KVB_OK;
}

int kvb_json_read_text(const char *text, const char *what, kvb_jval *root)
{
    return kvb_json_read_text_flags(text, what, root, 0);
}

int kvb_json_read_file_flags(const char *path, kvb_jval *root, int flags)
{
    memset(root, 0, sizeof *root);
    char *s;
    size_t n;
    int rc = kvb_read_file(path, &s, &n);
    if (rc) return rc;
    if (strlen(s) != n) {
        free(s);
        return kvb_fail(KVB_EINVAL, "%s: binary data (a NUL byte), not JSON", path);
    }
    rc = kvb_json_read_text_flags(s, path, root, flags);
    free(s);
    return rc;
}

int kvb_json_read_file(const char *path, kvb_jval *root) { return kvb_json_read_file_flags(path, root, 0); }

const kvb_jval *kvb_jget(const kvb_jval *o, const char *key)
{
    if (!o || o->type != KVB_J_OBJ) return NULL;
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->keys[i], key)) return &o->items[i];
    return NULL;
}

double kvb_jnum(const kvb_jval *o, const char *key, double dflt)
{
    const kvb_jval *v = kvb_jget(o, key);
    return v && (v->type == KVB_J_NUM || v->type == KVB_J_BOOL) ? v->num : dflt;
}

const char *kvb_jstr(const kvb_jval *o, const char *key)
{
    const kvb_jval *v = kvb_jget(o, key);
    return v && v->type == KVB_J_STR ? v->str : NULL;
}

static void write_tree(FILE *f, const kvb_jval *v, int depth)
{
    switch (v->type) {
    case KVB_J_NULL: fputs("null", f); return;
    case KVB_J_BOOL: fputs(v->num ? "true" : "false", f); return;
    case KVB_J_STR: kvb_json_put_string(f, v->str); return;
    case KVB_J_NUM:
        if (isnan(v->num)) fputs("NaN", f);
        else if (isinf(v->num)) fputs(v->num < 0 ? "-Infinity" : "Infinity", f);
        else kvb_json_put_number(f, v->num);
        return;
    case KVB_J_ARR:
    case KVB_J_OBJ: {
        const int obj = v->type == KVB_J_OBJ;
        fputc(obj ? '{' : '[', f);
        for (int i = 0; i < v->n; i++) {
            fprintf(f, "%s\n%*s", i ? "," : "", 2 * (depth + 1), "");
            if (obj) {
                kvb_json_put_string(f, v->keys[i]);
                fputs(": ", f);
            }
            write_tree(f, &v->items[i], depth + 1);
        }
        if (v->n) fprintf(f, "\n%*s", 2 * depth, "");
        fputc(obj ? '}' : ']', f);
        return;
    }
    }
}

void kvb_json_write_tree(FILE *f, const kvb_jval *v)
{
    write_tree(f, v, 0);
    fputc('\n', f);
}
