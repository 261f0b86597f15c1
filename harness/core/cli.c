/* cli.c: what the subcommands share from the command line: options and case selection. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/core/cli.h"

/* ---- options ---- */

int kvb_parse_options(int argc, char **argv, kvb_options *o)
{
    memset(o, 0, sizeof *o);
    o->cases_path = "cases";
    o->gb_argv[o->gb_argc++] = argv[0];
    size_t len = 0;
    for (int i = 0; i < argc && len < sizeof o->cmdline; i++)
        len += (size_t)snprintf(o->cmdline + len, sizeof o->cmdline - len, i ? " '%s'" : "%s", argv[i]);
    if (argc < 2) return -1;
    o->cmd = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strncmp(a, "--benchmark_", 12)) {
            if (o->gb_argc < 60) o->gb_argv[o->gb_argc++] = argv[i];
        } else if (!strcmp(a, "--tier") && next) {
            i++;
            if (!strcmp(next, "all")) o->tier = KVB_TIER_ALL;
            else if (!(o->tier = kvb_tier_parse(next))) {
                fprintf(stderr, "kvbench: --tier %s is not one of smoke|check|bench|sanitize|all\n", next);
                return 2;
            }
        } else if (!strcmp(a, "--host-mem-limit") && next) {
            char *end;
            const double gb = strtod(argv[++i], &end);
            if (end == argv[i] || *end || !(gb > 0 && gb <= 1048576)) {
                fprintf(stderr, "kvbench: --host-mem-limit %s out of range (0, 1048576] GiB\n", argv[i]);
                return 2;
            }
            o->host_mem_limit_gb = gb;
        } else if (!strcmp(a, "--determinism")) o->determinism = 1;
        else if (!strcmp(a, "--cases") && next) o->cases_path = argv[++i];
        else if (!strcmp(a, "--json") && next) o->json = argv[++i];
        else if (!strcmp(a, "--dump") && next) o->dump = argv[++i];
        else if (!strcmp(a, "--summary") && next) o->summary = argv[++i];
        else if (!strcmp(a, "--peers") && next) o->peers = argv[++i];
        else if (!strcmp(a, "--fault") && next) {
            if (strcmp(argv[++i], "zeros")) {
                fprintf(stderr, "kvbench: --fault %s is not one of: zeros\n", argv[i]);
                return 2;
            }
            o->fault_zeros = 1;
        }
        else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "kvbench: unknown option %s (or it lacks its value)\n", a);
            return 2;
        } else if (o->n_filters < 64) o->filters[o->n_filters++] = a;
        else {
            fprintf(stderr, "kvbench: more than 64 filters\n");
            return 2;
        }
    }
    return 0;
}

/* ---- case selection: load every case file first, so a malformed line stops everything ---- */

/* A case line starts with a kernel name followed by key=value tokens ("gather_copy B=8"); a kernel's
 * name alone ("gather_copy") selects that kernel's cases; anything else ("impl=tma", "B=8 Hkv",
 * "gather_copy_") filters case ids by substring. A first word that is
 * not a kernel but is followed by key=value tokens is a mistyped case line, reported as such. */
int kvb_is_case_line(const char *arg)
{
    char first[64];
    size_t n = strcspn(arg, " \t");
    if (n == 0 || n >= sizeof first || !arg[n]) return 0; /* one word: a filter */
    memcpy(first, arg, n);
    first[n] = '\0';
    return strchr(first, '=') == NULL; /* "kernel key=..." is a case line, even with a bad kernel */
}

int kvb_select_cases(const kvb_options *o, int default_tier, kvb_case_list *out)
{
    kvb_case_list all = {0};
    memset(out, 0, sizeof *out);
    int tier = o->tier ? o->tier : default_tier;
    int from_files = 0;
    for (int i = 0; i < o->n_filters; i++) from_files |= !kvb_is_case_line(o->filters[i]);
    if (o->n_filters == 0 || from_files) {
        if (kvb_cases_load(&all, o->cases_path)) {
            fprintf(stderr, "kvbench: %s\n", kvb_last_error());
            kvb_cases_free(&all); /* the cases before the bad line */
            return 2;
        }
    }
    for (int i = 0; i < o->n_filters; i++) { /* case lines given on the command line */
        if (!kvb_is_case_line(o->filters[i])) continue;
        kvb_case c;
        int rc = kvb_case_parse(o->filters[i], "command line", &c);
        if (rc != KVB_OK) {
            fprintf(stderr, "kvbench: %s\n", rc == KVB_CASE_BLANK ? "empty case line on the command line" : kvb_last_error());
            kvb_cases_free(&all);
            kvb_cases_free(out);
            return 2;
        }
        kvb_cases_add(out, &c);
    }
    for (int i = 0; i < all.n; i++) {
        const kvb_case *c = &all.v[i];
        if (!(c->tier & tier)) continue;
        int match = o->n_filters == 0;
        for (int f = 0; f < o->n_filters && !match; f++) {
            const char *flt = o->filters[f];
            if (kvb_is_case_line(flt)) continue;
            /* a kernel's own name selects that kernel's cases only: "decode_attn" is not int2_decode_attn */
            const kvb_op *named = kvb_op_find(flt);
            match = named ? c->op == named : strstr(c->id, flt) != NULL;
        }
        if (match) kvb_cases_add(out, c);
    }
    kvb_cases_free(&all);
    return 0;
}
