/* case.c: the case-line parser and case files (see case.h). */
#include "harness/core/case.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "reference/kvb.h"
#include "harness/core/files.h"
#include "harness/core/json.h"
#include "harness/core/op.h"

const char *kvb_tier_name(int tier)
{
    switch (tier) {
    case KVB_TIER_SMOKE: return "smoke";
    case KVB_TIER_CHECK: return "check";
    case KVB_TIER_BENCH: return "bench";
    case KVB_TIER_SANITIZE: return "sanitize";
    }
    return "none";
}

int kvb_tier_parse(const char *s)
{
    if (!strcmp(s, "smoke")) return KVB_TIER_SMOKE;
    if (!strcmp(s, "check")) return KVB_TIER_CHECK;
    if (!strcmp(s, "bench")) return KVB_TIER_BENCH;
    if (!strcmp(s, "sanitize")) return KVB_TIER_SANITIZE;
    return 0;
}

static int find_param(const kvb_op *op, const char *name, size_t len)
{
    for (int i = 0; i < op->n_params; i++)
        if (strlen(op->params[i].name) == len && !strncmp(op->params[i].name, name, len)) return i;
    return -1;
}

/* The i-th choice of "a|b|c" into buf; returns 0 when i is past the end. */
static int enum_choice(const char *choices, int i, char *buf, size_t n)
{
    const char *p = choices;
    for (int k = 0; k < i; k++) {
        p = strchr(p, '|');
        if (!p) return 0;
        p++;
    }
    size_t len = strcspn(p, "|");
    if (len >= n) len = n - 1;
    memcpy(buf, p, len);
    buf[len] = '\0';
    return 1;
}

/* The i-th choice of an enum key; a key without choices takes them from the op's impl table. */
static int param_choice(const kvb_op *op, const kvb_param *p, int i, char *buf, size_t n)
{
    if (p->choices) return enum_choice(p->choices, i, buf, n);
    if (i < 0 || i >= op->n_impls) return 0;
    snprintf(buf, n, "%s", op->impls[i].name);
    return 1;
}

static int enum_index(const kvb_op *op, const kvb_param *p, const char *value)
{
    char buf[64];
    for (int i = 0; param_choice(op, p, i, buf, sizeof buf); i++)
        if (!strcmp(buf, value)) return i;
    return -1;
}

/* Whether v is one of an int key's choices "64|128". */
static int int_choice(const char *choices, long long v)
{
    for (const char *p = choices;; p++) {
        if (strtoll(p, NULL, 10) == v) return 1;
        if (!(p = strchr(p, '|'))) return 0;
    }
}

/* An int key's choices "64|128" as "{64, 128}", for messages and listings. */
static void int_choices_text(const char *choices, char *buf, size_t n)
{
    size_t len = (size_t)snprintf(buf, n, "{");
    for (const char *p = choices; *p && len < n; p++)
        len += *p == '|' ? (size_t)snprintf(buf + len, n - len, ", ") : (size_t)snprintf(buf + len, n - len, "%c", *p);
    if (len < n) snprintf(buf + len, n - len, "}");
}

/* "a|b|c" of an enum key, for messages. */
static void choices_text(const kvb_op *op, const kvb_param *p, char *buf, size_t n)
{
    size_t len = 0;
    char c[64];
    buf[0] = '\0';
    for (int i = 0; len < n && param_choice(op, p, i, c, sizeof c); i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? "|" : "", c);
}

/* Integers: optional sign, decimal digits, optional K (x1024) or M (x1048576) suffix. Returns 1 with
 * the value, 0 when the text is not such an integer, and -1 when it is one whose value (digits times
 * suffix) does not fit in 64 bits: never a wrapped value. */
static int parse_int(const char *s, long long *out)
{
    errno = 0;
    char *end;
    if (!*s || isspace((unsigned char)*s)) return 0;
    long long v = strtoll(s, &end, 10);
    if (end == s) return 0;
    const int range = errno == ERANGE;
    if (errno && !range) return 0;
    long long mul = 1;
    if (*end == 'K') mul = 1024, end++;
    else if (*end == 'M') mul = 1048576, end++;
    if (*end) return 0;
    if (range || __builtin_mul_overflow(v, mul, &v)) return -1;
    *out = v;
    return 1;
}

static int parse_float(const char *s, double *out)
{
    errno = 0;
    char *end;
    if (!*s || isspace((unsigned char)*s)) return 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v)) return 0;
    *out = v == 0 ? 0.0 : v; /* -0 is 0: one value, one id */
    return 1;
}

static void list_keys(const kvb_op *op, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < op->n_params && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "", op->params[i].name);
    if (len < n) snprintf(buf + len, n - len, "; also tier, atol, rtol, l2");
}

void kvb_list_kernels(char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < kvb_op_count() && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "", kvb_op_at(i)->name);
}

/* a float in its shortest exact form (json.h): two values never share an id, and the id parses back
 * to the value it names */
static void format_value(const kvb_op *op, const kvb_param *p, double v, char *buf, size_t n)
{
    if (p->type == KVB_P_INT) snprintf(buf, n, "%lld", (long long)v);
    else if (p->type == KVB_P_FLOAT) kvb_format_double(buf, n, v);
    else if (!param_choice(op, p, (int)v, buf, n)) snprintf(buf, n, "?");
}

void kvb_param_value_text(const kvb_op *op, const kvb_param *p, double v, char *buf, size_t n)
{
    format_value(op, p, v, buf, n);
}

void kvb_param_range_text(const kvb_op *op, const kvb_param *p, char *buf, size_t n)
{
    if (p->type == KVB_P_ENUM) {
        choices_text(op, p, buf, n);
        return;
    }
    if (p->type == KVB_P_INT && p->choices) {
        int_choices_text(p->choices, buf, n);
        return;
    }
    char lo[40], hi[40];
    format_value(op, p, p->lo, lo, sizeof lo);
    format_value(op, p, p->hi, hi, sizeof hi);
    snprintf(buf, n, "[%s, %s]", lo, hi);
}

static void make_id(kvb_case *c)
{
    size_t len = (size_t)snprintf(c->id, sizeof c->id, "%s", c->op->name);
    for (int i = 0; i < c->op->n_params && len < sizeof c->id; i++) {
        char v[64];
        format_value(c->op, &c->op->params[i], c->v[i], v, sizeof v);
        len += (size_t)snprintf(c->id + len, sizeof c->id - len, " %s=%s", c->op->params[i].name, v);
    }
}

#define FAIL(...)                                                                                \
    do {                                                                                         \
        char msg_[3072];                                                                         \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                                                \
        return kvb_fail(KVB_EINVAL, "%s: %s", where, msg_);                                      \
    } while (0)

/* Whether `value` is one of the '|'-separated words of `list`. */
static int listed(const char *list, const char *value)
{
    const size_t n = strlen(value);
    for (const char *w = list; w; w = strchr(w, '|') ? strchr(w, '|') + 1 : NULL)
        if (strcspn(w, "|") == n && !strncmp(w, value, n)) return 1;
    return 0;
}

const char *kvb_param_only_with(const kvb_op *op, const kvb_param *p)
{
    for (int i = 0; i < op->n_scopes; i++)
        if (!strcmp(op->scopes[i].key, p->name)) return op->scopes[i].only_with;
    return NULL;
}

/* A key read only with some values of an enum key (kvb_op.scopes) is refused at any other value
 * than its default elsewhere, naming the key, the value it must keep and the values that read it. */
static int check_only_with(const kvb_case *c, const char *where)
{
    const kvb_op *op = c->op;
    for (int i = 0; i < op->n_params; i++) {
        const kvb_param *p = &op->params[i];
        const char *only_with = kvb_param_only_with(op, p);
        if (!only_with || c->v[i] == p->def) continue;
        const char *users = strchr(only_with, '=') + 1; /* the declaration's form is tested (test_case) */
        const kvb_param *cond = &op->params[find_param(op, only_with, (size_t)(users - 1 - only_with))];
        char cond_value[64], value[64], def[64], names[256];
        param_choice(op, cond, (int)c->v[cond - op->params], cond_value, sizeof cond_value);
        if (listed(users, cond_value)) continue;
        format_value(op, p, c->v[i], value, sizeof value);
        format_value(op, p, p->def, def, sizeof def);
        size_t len = 0; /* "rocketkv|omnikv" as "rocketkv, omnikv" */
        for (const char *u = users; *u && len + 3 < sizeof names; u++) {
            if (*u == '|') names[len++] = ',', names[len++] = ' ';
            else names[len++] = *u;
        }
        names[len] = '\0';
        const char *verb = strchr(users, '|') ? "do" : "does";
        if (p->type == KVB_P_ENUM)
            FAIL("%s %s=%s: %s=%s is not one of {%s}: %s=%s does not read %s (%s %s): leave it at its default, one "
                 "case has one id", op->name, cond->name, cond_value, p->name, value, def, cond->name, cond_value,
                 p->name, names, verb);
        FAIL("%s %s=%s: %s=%s out of range [%s, %s]: %s=%s does not read %s (%s %s): leave it at its default, one "
             "case has one id", op->name, cond->name, cond_value, p->name, value, def, def, cond->name, cond_value,
             p->name, names, verb);
    }
    return KVB_OK;
}


int kvb_case_parse(const char *line, const char *where, kvb_case *out)
{
    /* the line ends at a comment or a line break; the text before it must fit, never cut short
     * (a cut token would parse as another value) */
    char buf[4096];
    const size_t len = strcspn(line, "#\r\n");
    if (len >= sizeof buf)
        return kvb_fail(KVB_EINVAL, "%s: case line of %zu characters out of range [0, %zu]", where, len, sizeof buf - 1);
    memcpy(buf, line, len);
    buf[len] = '\0';
    char *save = NULL, *tok = strtok_r(buf, " \t", &save);
    if (!tok) return KVB_CASE_BLANK;

    kvb_case c;
    memset(&c, 0, sizeof c);
    c.atol = c.rtol = c.l2 = -1;
    snprintf(c.where, sizeof c.where, "%s", where);
    if (strchr(tok, '=')) FAIL("a case starts with a kernel name, got '%s'", tok);
    c.op = kvb_op_find(tok);
    if (!c.op) {
        char known[2048];
        kvb_list_kernels(known, sizeof known);
        FAIL("unknown kernel '%s'; kernels: %s", tok, known);
    }
    const kvb_op *op = c.op;
    int set[KVB_MAX_PARAMS] = {0}, set_tier = 0, set_tol[3] = {0};

    while ((tok = strtok_r(NULL, " \t", &save))) {
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok || !eq[1]) FAIL("%s: malformed token '%s': expected key=value", op->name, tok);
        size_t klen = (size_t)(eq - tok);
        const char *val = eq + 1;
        if (klen == 4 && !strncmp(tok, "tier", 4)) {
            if (set_tier++) FAIL("%s: key 'tier' given twice", op->name);
            if (!(c.tier = kvb_tier_parse(val))) FAIL("%s: tier=%s is not one of smoke|check|bench|sanitize", op->name, val);
            continue;
        }
        static const char *tol_keys[3] = {"atol", "rtol", "l2"};
        int tk = -1;
        for (int i = 0; i < 3; i++)
            if (strlen(tol_keys[i]) == klen && !strncmp(tok, tol_keys[i], klen)) tk = i;
        if (tk >= 0) {
            double v;
            if (set_tol[tk]++) FAIL("%s: key '%s' given twice", op->name, tol_keys[tk]);
            if (!parse_float(val, &v) || v < 0)
                FAIL("%s: %s=%s is not a non-negative number", op->name, tol_keys[tk], val);
            if (tk == 0) c.atol = v;
            else if (tk == 1) c.rtol = v;
            else c.l2 = v;
            continue;
        }
        int pi = find_param(op, tok, klen);
        if (pi < 0) {
            char keys[512];
            list_keys(op, keys, sizeof keys);
            FAIL("%s: unknown key '%.*s' (keys: %s)", op->name, (int)klen, tok, keys);
        }
        const kvb_param *p = &op->params[pi];
        if (set[pi]++) FAIL("%s: key '%s' given twice", op->name, p->name);
        if (p->type == KVB_P_INT) {
            long long v;
            const int ok = parse_int(val, &v);
            if (!ok) FAIL("%s: %s=%s is not an integer", op->name, p->name, val);
            /* the declared range is integral: compare as integers (a bound past 64 bits is no bound) */
            const long long lo = p->lo <= (double)LLONG_MIN ? LLONG_MIN : (long long)p->lo;
            const long long hi = p->hi >= (double)LLONG_MAX ? LLONG_MAX : (long long)p->hi;
            if (ok < 0)
                FAIL("%s: %s=%s out of range [%lld, %lld] (beyond a 64-bit integer)", op->name, p->name, val, lo, hi);
            if (p->choices && !int_choice(p->choices, v)) { /* the listed values lie in [lo, hi] (test_case) */
                char set[256];
                int_choices_text(p->choices, set, sizeof set);
                FAIL("%s: %s=%s is not one of %s", op->name, p->name, val, set);
            }
            if (v < lo || v > hi) {
                char num[32];
                snprintf(num, sizeof num, "%lld", v);
                if (strcmp(num, val)) /* a suffix or another spelling: show both */
                    FAIL("%s: %s=%s (= %lld) out of range [%lld, %lld]", op->name, p->name, val, v, lo, hi);
                FAIL("%s: %s=%lld out of range [%lld, %lld]", op->name, p->name, v, lo, hi);
            }
            c.v[pi] = (double)v;
        } else if (p->type == KVB_P_FLOAT) {
            double v;
            if (!parse_float(val, &v)) FAIL("%s: %s=%s is not a number", op->name, p->name, val);
            if (v < p->lo || v > p->hi) {
                char vs[32], los[32], his[32];
                kvb_format_double(vs, sizeof vs, v);
                kvb_format_double(los, sizeof los, p->lo);
                kvb_format_double(his, sizeof his, p->hi);
                FAIL("%s: %s=%s out of range [%s, %s]", op->name, p->name, vs, los, his);
            }
            c.v[pi] = v;
        } else {
            int e = enum_index(op, p, val);
            if (e < 0) {
                char choices[512];
                choices_text(op, p, choices, sizeof choices);
                FAIL("%s: %s=%s is not one of %s", op->name, p->name, val, choices);
            }
            c.v[pi] = e;
        }
    }
    for (int i = 0; i < op->n_params; i++)
        if (!set[i]) c.v[i] = op->params[i].def;
    int rc = check_only_with(&c, where);
    if (rc) return rc;
    if (op->validate && op->validate(&c)) {
        char msg[3072];
        snprintf(msg, sizeof msg, "%s", kvb_last_error());
        return kvb_fail(KVB_EINVAL, "%s: %s", where, msg);
    }
    make_id(&c);
    *out = c;
    return KVB_OK;
}

double kvb_case_get(const kvb_case *c, const char *name)
{
    int i = find_param(c->op, name, strlen(name));
    if (i < 0) {
        fprintf(stderr, "kvbench: internal error: %s has no key '%s'\n", c->op->name, name);
        abort();
    }
    return c->v[i];
}

const char *kvb_case_enum(const kvb_case *c, const char *name)
{
    static _Thread_local char buf[4][64];
    static _Thread_local int next;
    int i = find_param(c->op, name, strlen(name));
    if (i < 0 || c->op->params[i].type != KVB_P_ENUM) {
        fprintf(stderr, "kvbench: internal error: %s has no enum key '%s'\n", c->op->name, name);
        abort();
    }
    char *b = buf[next++ & 3];
    param_choice(c->op, &c->op->params[i], (int)c->v[i], b, 64);
    return b;
}

static uint64_t hash_id(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

int kvb_cases_find(const kvb_case_list *list, const char *id)
{
    if (!list->n_slot) return -1;
    const int mask = list->n_slot - 1;
    for (int s = (int)(hash_id(id) & (uint64_t)mask);; s = (s + 1) & mask) {
        const int i = list->slot[s];
        if (i < 0) return -1;
        if (!strcmp(list->v[i].id, id)) return i;
    }
}

static void index_insert(kvb_case_list *list, int i)
{
    const int mask = list->n_slot - 1;
    int s = (int)(hash_id(list->v[i].id) & (uint64_t)mask);
    while (list->slot[s] >= 0) s = (s + 1) & mask;
    list->slot[s] = i;
}

int kvb_cases_add(kvb_case_list *list, const kvb_case *c)
{
    if (list->n == list->cap) {
        if (list->cap > INT_MAX / 4) return kvb_fail(KVB_EINVAL, "more than %d cases", list->cap);
        int cap = list->cap ? 2 * list->cap : 64;
        kvb_case *v = realloc(list->v, sizeof *v * (size_t)cap);
        if (!v) return kvb_fail(KVB_ENOMEM, "out of memory loading cases");
        list->v = v, list->cap = cap;
    }
    if (2 * (list->n + 1) > list->n_slot) { /* grow the index: at most half full */
        int n_slot = list->n_slot ? 2 * list->n_slot : 128;
        int *slot = malloc(sizeof *slot * (size_t)n_slot);
        if (!slot) return kvb_fail(KVB_ENOMEM, "out of memory loading cases");
        free(list->slot);
        list->slot = slot, list->n_slot = n_slot;
        for (int s = 0; s < n_slot; s++) slot[s] = -1;
        for (int i = 0; i < list->n; i++) index_insert(list, i);
    }
    list->v[list->n++] = *c;
    index_insert(list, list->n - 1);
    return KVB_OK;
}

void kvb_cases_free(kvb_case_list *list)
{
    free(list->v);
    free(list->slot);
    memset(list, 0, sizeof *list);
}

/* a line ends at LF, CRLF or a lone CR (a file saved with old Mac line ends is not one long line) */
const char *kvb_line_next(const char *line, size_t *len)
{
    *len = strcspn(line, "\r\n");
    const char *next = line + *len;
    if (next[0] == '\r' && next[1] == '\n') return next + 2;
    return *next ? next + 1 : next;
}

int kvb_cases_parse_text(kvb_case_list *list, const char *text, const char *name)
{
    int lineno = 0;
    for (const char *line = text, *next; *line; line = next) {
        size_t len;
        next = kvb_line_next(line, &len);
        lineno++;
        char where[160];
        snprintf(where, sizeof where, "%s:%d", name, lineno);
        const size_t bad = kvb_utf8_invalid_at(line, len);
        if (bad < len)
            return kvb_fail(KVB_EINVAL, "%s: not valid UTF-8 (byte 0x%02x at column %zu)", where,
                            (unsigned char)line[bad], bad + 1);
        kvb_case c;
        int r = kvb_case_parse(line, where, &c); /* reads up to the line's end only */
        if (r == KVB_CASE_BLANK) continue;
        if (r != KVB_OK) return r;
        const int dup = kvb_cases_find(list, c.id);
        if (dup >= 0) return kvb_fail(KVB_EINVAL, "%s: duplicate case (same id as %s)", where, list->v[dup].where);
        if ((r = kvb_cases_add(list, &c)) != KVB_OK) return r;
    }
    return KVB_OK;
}

/* The whole file into memory, then parsed as text: one parser for files and for text. */
static int load_file(kvb_case_list *list, const char *path)
{
    char *text;
    size_t len;
    int rc = kvb_read_file(path, &text, &len);
    if (rc != KVB_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", kvb_last_error());
        return kvb_fail(rc, "case file %s", msg);
    }
    if (strlen(text) != len) /* a NUL would end the text early and silently drop the rest */
        rc = kvb_fail(KVB_EINVAL, "%s: a NUL byte at offset %zu: not a text file", path, strlen(text));
    else
        rc = kvb_cases_parse_text(list, text, path);
    free(text);
    return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int kvb_cases_load(kvb_case_list *list, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) return kvb_fail(KVB_EIO, "cannot open %s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return load_file(list, path);
    DIR *dir = opendir(path);
    if (!dir) return kvb_fail(KVB_EIO, "cannot open directory %s: %s", path, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0, rc = KVB_OK;
    struct dirent *e;
    while (rc == KVB_OK && (e = readdir(dir))) { /* every case file, however many */
        size_t len = strlen(e->d_name);
        if (len <= 6 || strcmp(e->d_name + len - 6, ".cases")) continue;
        if (n == cap) {
            char **grown = realloc(names, sizeof *names * (size_t)(cap = cap ? 2 * cap : 64));
            if (!grown) {
                rc = kvb_fail(KVB_ENOMEM, "out of memory listing %s", path);
                break;
            }
            names = grown;
        }
        if (!(names[n] = strdup(e->d_name))) rc = kvb_fail(KVB_ENOMEM, "out of memory listing %s", path);
        else n++;
    }
    closedir(dir);
    if (n) qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n; i++) {
        char full[4096];
        if ((size_t)snprintf(full, sizeof full, "%s/%s", path, names[i]) >= sizeof full && rc == KVB_OK)
            rc = kvb_fail(KVB_EINVAL, "%s/%s: path too long", path, names[i]);
        if (rc == KVB_OK) rc = load_file(list, full);
        free(names[i]);
    }
    free(names);
    return rc;
}
