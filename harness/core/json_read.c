/* json_read.c: see json_read.h. Recursive descent with a depth limit; strict: no trailing garbage,
 * no unterminated strings or containers. \u escapes outside ASCII become '?' (ids are ASCII). */
#include "harness/core/json_read.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/kvb.h"

#define MAX_DEPTH 64

typedef struct parser {
    const char *p, *start;
    int error;
} parser;

static void skip_ws(parser *j)
{
    while (isspace((unsigned char)*j->p)) j->p++;
}

static int bad(parser *j)
{
    j->error = 1;
    return -1;
}

static int parse_value(parser *j, kvb_jval *v, int depth);

static char *parse_string(parser *j)
{
    if (*j->p != '"') return bad(j), NULL;
    j->p++;
    size_t cap = 32, len = 0;
    char *s = malloc(cap);
    while (*j->p && *j->p != '"') {
        char c = *j->p++;
        if ((unsigned char)c < 0x20) return free(s), bad(j), NULL;
        if (c == '\\') {
            char e = *j->p++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case '"': case '\\': case '/': c = e; break;
            case 'u': {
                unsigned code = 0;
                for (int k = 0; k < 4; k++) {
                    char h = *j->p++;
                    if (!isxdigit((unsigned char)h)) return free(s), bad(j), NULL;
                    code = code * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
                }
                c = code < 0x80 ? (char)code : '?';
                break;
            }
            default: return free(s), bad(j), NULL;
            }
        }
        if (len + 2 > cap) s = realloc(s, cap *= 2);
        s[len++] = c;
    }
    if (*j->p != '"') return free(s), bad(j), NULL;
    j->p++;
    s[len] = '\0';
    return s;
}

static int parse_container(parser *j, kvb_jval *v, int object, int depth)
{
    if (depth > MAX_DEPTH) return bad(j);
    v->type = object ? KVB_J_OBJ : KVB_J_ARR;
    j->p++;
    int cap = 8;
    v->items = calloc((size_t)cap, sizeof(kvb_jval));
    v->keys = object ? calloc((size_t)cap, sizeof(char *)) : NULL;
    skip_ws(j);
    if (*j->p == (object ? '}' : ']')) return j->p++, 0;
    for (;;) {
        if (v->n == cap) {
            cap *= 2;
            v->items = realloc(v->items, sizeof(kvb_jval) * (size_t)cap);
            if (object) v->keys = realloc(v->keys, sizeof(char *) * (size_t)cap);
        }
        skip_ws(j);
        if (object) {
            char *k = parse_string(j);
            if (!k) return -1;
            v->keys[v->n] = k;
            skip_ws(j);
            if (*j->p++ != ':') {
                free(k);
                return bad(j);
            }
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
        if (*j->p == (object ? '}' : ']')) return j->p++, 0;
        return bad(j);
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
    if (!strncmp(j->p, "true", 4) || !strncmp(j->p, "null", 4)) {
        v->type = c == 't' ? KVB_J_BOOL : KVB_J_NULL;
        v->num = c == 't';
        j->p += 4;
        return 0;
    }
    if (!strncmp(j->p, "false", 5)) {
        v->type = KVB_J_BOOL;
        j->p += 5;
        return 0;
    }
    /* numbers (and the NaN / Infinity some writers emit) */
    if (!strncmp(j->p, "NaN", 3) || !strncmp(j->p, "-Infinity", 9) || !strncmp(j->p, "Infinity", 8)) {
        v->type = KVB_J_NUM;
        v->num = c == 'N' ? NAN : c == '-' ? -INFINITY : INFINITY;
        j->p += c == 'N' ? 3 : c == '-' ? 9 : 8;
        return 0;
    }
    if (c != '-' && !isdigit((unsigned char)c)) return bad(j);
    char *end;
    v->num = strtod(j->p, &end);
    if (end == j->p) return bad(j);
    v->type = KVB_J_NUM;
    j->p = end;
    return 0;
}

void kvb_json_free(kvb_jval *v)
{
    if (!v) return;
    for (int i = 0; i < v->n; i++) {
        kvb_json_free(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    memset(v, 0, sizeof *v);
}

int kvb_json_read_text(const char *text, const char *what, kvb_jval *root)
{
    parser j = {text, text, 0};
    memset(root, 0, sizeof *root);
    skip_ws(&j);
    if (!*j.p) return kvb_fail(KVB_EINVAL, "%s: empty, not JSON", what);
    int rc = parse_value(&j, root, 0);
    if (!rc) {
        skip_ws(&j);
        if (*j.p) rc = bad(&j);
    }
    if (rc || j.error) {
        kvb_json_free(root);
        return kvb_fail(KVB_EINVAL, "%s: malformed JSON at byte %ld", what, (long)(j.p - j.start));
    }
    return KVB_OK;
}

int kvb_json_read_file(const char *path, kvb_jval *root)
{
    memset(root, 0, sizeof *root);
    FILE *f = fopen(path, "rb");
    if (!f) return kvb_fail(KVB_EIO, "%s: cannot read", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0) {
        fclose(f);
        return kvb_fail(KVB_EIO, "%s: cannot read", path);
    }
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    if (strlen(s) != got) {
        free(s);
        return kvb_fail(KVB_EINVAL, "%s: binary data, not JSON", path);
    }
    int rc = kvb_json_read_text(s, path, root);
    free(s);
    return rc;
}

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
