/* compare_results.c: `kvbench compare BASE.json NEW.json [--threshold PCT]`.
 *
 * Reads two Google Benchmark JSON files written by `kvbench bench --json`, matches cases by id, and
 * reports each case's change of median time. A change counts only beyond the noise: more than twice
 * the larger of the two runs' noise (relative stddev of the samples). A case slower than the
 * threshold (default 5%) beyond the noise is a regression, and the exit status is 1.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a minimal JSON reader: enough for Google Benchmark's output ---- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
    jtype type;
    double num;
    char *str;           /* J_STR */
    struct jval *items;  /* J_ARR, J_OBJ values */
    char **keys;         /* J_OBJ */
    int n;
} jval;

typedef struct jparser {
    const char *p;
    int error;
} jparser;

static void skip_ws(jparser *j)
{
    while (isspace((unsigned char)*j->p)) j->p++;
}

static int parse_value(jparser *j, jval *v);

static char *parse_string(jparser *j)
{
    if (*j->p != '"') return j->error = 1, NULL;
    j->p++;
    size_t cap = 64, len = 0;
    char *s = malloc(cap);
    while (*j->p && *j->p != '"') {
        char c = *j->p++;
        if (c == '\\') {
            char e = *j->p++;
            c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'u' ? '?' : e;
            if (e == 'u') j->p += 4 <= (int)strlen(j->p) ? 4 : 0;
        }
        if (len + 2 > cap) s = realloc(s, cap *= 2);
        s[len++] = c;
    }
    if (*j->p != '"') return free(s), j->error = 1, NULL;
    j->p++;
    s[len] = '\0';
    return s;
}

static int parse_container(jparser *j, jval *v, int object)
{
    v->type = object ? J_OBJ : J_ARR;
    j->p++;
    int cap = 8;
    v->items = malloc(sizeof(jval) * (size_t)cap);
    v->keys = object ? malloc(sizeof(char *) * (size_t)cap) : NULL;
    skip_ws(j);
    if (*j->p == (object ? '}' : ']')) return j->p++, 0;
    for (;;) {
        if (v->n == cap) {
            cap *= 2;
            v->items = realloc(v->items, sizeof(jval) * (size_t)cap);
            if (object) v->keys = realloc(v->keys, sizeof(char *) * (size_t)cap);
        }
        skip_ws(j);
        if (object) {
            char *k = parse_string(j);
            if (!k) return -1;
            v->keys[v->n] = k;
            skip_ws(j);
            if (*j->p++ != ':') return j->error = 1, -1;
        }
        if (parse_value(j, &v->items[v->n])) return -1;
        v->n++;
        skip_ws(j);
        if (*j->p == ',') {
            j->p++;
            continue;
        }
        if (*j->p == (object ? '}' : ']')) return j->p++, 0;
        return j->error = 1, -1;
    }
}

static int parse_value(jparser *j, jval *v)
{
    memset(v, 0, sizeof *v);
    skip_ws(j);
    char c = *j->p;
    if (c == '{' || c == '[') return parse_container(j, v, c == '{');
    if (c == '"') {
        v->type = J_STR;
        return (v->str = parse_string(j)) ? 0 : -1;
    }
    if (!strncmp(j->p, "true", 4) || !strncmp(j->p, "null", 4)) {
        v->type = c == 't' ? J_BOOL : J_NULL;
        v->num = c == 't';
        j->p += 4;
        return 0;
    }
    if (!strncmp(j->p, "false", 5)) {
        v->type = J_BOOL;
        j->p += 5;
        return 0;
    }
    char *end;
    v->num = strtod(j->p, &end);
    if (end == j->p) return j->error = 1, -1;
    v->type = J_NUM;
    j->p = end;
    return 0;
}

static const jval *jget(const jval *o, const char *key)
{
    if (!o || o->type != J_OBJ) return NULL;
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->keys[i], key)) return &o->items[i];
    return NULL;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    return s;
}

static int load(const char *path, jval *root)
{
    char *text = slurp(path);
    if (!text) {
        fprintf(stderr, "kvbench compare: cannot read %s\n", path);
        return -1;
    }
    jparser j = {text, 0};
    int rc = parse_value(&j, root);
    free(text);
    if (rc || j.error || !jget(root, "benchmarks")) {
        fprintf(stderr, "kvbench compare: %s is not a Google Benchmark JSON file\n", path);
        return -1;
    }
    return 0;
}

/* median (us) and noise (fraction) of one benchmark entry */
static int timing_of(const jval *b, double *median_us, double *noise)
{
    const jval *err = jget(b, "error_occurred");
    if (err && err->num) return -1;
    const jval *m = jget(b, "median_us"), *nz = jget(b, "noise_pct");
    if (m && m->type == J_NUM) *median_us = m->num;
    else {
        const jval *rt = jget(b, "real_time"), *unit = jget(b, "time_unit");
        if (!rt) return -1;
        double scale = 1;
        if (unit && unit->str) scale = !strcmp(unit->str, "ns") ? 1e-3 : !strcmp(unit->str, "ms") ? 1e3 : !strcmp(unit->str, "s") ? 1e6 : 1;
        *median_us = rt->num * scale;
    }
    *noise = nz && nz->type == J_NUM ? nz->num / 100.0 : 0;
    return 0;
}

int kvb_compare_main(int argc, char **argv)
{
    const char *files[2] = {NULL, NULL};
    double threshold = 5.0;
    int nf = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--threshold") && i + 1 < argc) {
            char *end;
            threshold = strtod(argv[++i], &end);
            if (*end || threshold < 0) {
                fprintf(stderr, "kvbench compare: --threshold %s is not a non-negative percentage\n", argv[i]);
                return 2;
            }
        } else if (nf < 2) files[nf++] = argv[i];
        else {
            fprintf(stderr, "kvbench compare: unexpected argument %s\n", argv[i]);
            return 2;
        }
    }
    if (nf != 2) {
        fprintf(stderr, "usage: kvbench compare BASE.json NEW.json [--threshold PCT]\n");
        return 2;
    }
    jval base, cur;
    if (load(files[0], &base) || load(files[1], &cur)) return 2;
    const jval *bb = jget(&base, "benchmarks"), *cb = jget(&cur, "benchmarks");
    int regressions = 0, compared = 0;
    printf("%-9s %11s %11s %8s %7s  %s\n", "verdict", "base us", "new us", "change", "noise", "case");
    for (int i = 0; i < cb->n; i++) {
        const jval *name = jget(&cb->items[i], "name");
        if (!name || !name->str) continue;
        const jval *match = NULL;
        for (int k = 0; k < bb->n && !match; k++) {
            const jval *bn = jget(&bb->items[k], "name");
            if (bn && bn->str && !strcmp(bn->str, name->str)) match = &bb->items[k];
        }
        double t0, t1, n0, n1;
        if (!match) {
            printf("%-9s %11s %11s %8s %7s  %s\n", "new", "", "", "", "", name->str);
            continue;
        }
        if (timing_of(match, &t0, &n0) || timing_of(&cb->items[i], &t1, &n1)) {
            printf("%-9s %11s %11s %8s %7s  %s\n", "error", "", "", "", "", name->str);
            regressions++;
            continue;
        }
        compared++;
        double change = (t1 - t0) / t0, noise = fmax(n0, n1);
        const char *verdict = "same";
        if (fabs(change) > 2 * noise) {
            if (change > threshold / 100.0) verdict = "SLOWER", regressions++;
            else if (change > 0) verdict = "slower";
            else verdict = "faster";
        }
        printf("%-9s %11.2f %11.2f %+7.1f%% %6.1f%%  %s\n", verdict, t0, t1, 100 * change, 100 * noise, name->str);
    }
    printf("%d compared, %d regressed beyond %.1f%% and the noise\n", compared, regressions, threshold);
    return regressions ? 1 : 0;
}
