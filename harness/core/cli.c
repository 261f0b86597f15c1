/* cli.c: what the subcommands share from the command line: options and case selection. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness/core/cli.h"
#include "harness/core/shard.h"

/* ---- options ---- */

static int blank(const char *s) { return s[strspn(s, " \t\r\n\v\f")] == '\0'; }

int kvb_args_utf8(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const size_t n = strlen(argv[i]), bad = kvb_utf8_invalid_at(argv[i], n);
        if (bad < n) {
            fprintf(stderr, "kvbench: argument %d is not valid UTF-8 (byte 0x%02x at offset %zu)\n", i,
                    (unsigned char)argv[i][bad], bad);
            return 2;
        }
    }
    return 0;
}

int kvb_parse_options(int argc, char **argv, kvb_options *o)
{
    memset(o, 0, sizeof *o);
    o->gb_argv[o->gb_argc++] = argv[0];
    size_t len = 0;
    for (int i = 0; i < argc && len < sizeof o->cmdline; i++)
        len += (size_t)snprintf(o->cmdline + len, sizeof o->cmdline - len, i ? " '%s'" : "%s", argv[i]);
    if (argc < 2) return -1;
    o->cmd = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        const int valued = !strcmp(a, "--tier") || !strcmp(a, "--cases") || !strcmp(a, "--json") ||
                           !strcmp(a, "--dump") || !strcmp(a, "--summary") || !strcmp(a, "--peers") || !strcmp(a, "--fault") ||
                           !strcmp(a, "--shard") || !strcmp(a, "--timing-lock") || !strcmp(a, "--durations");
        if (valued && next && !*next) {
            fprintf(stderr, "kvbench: %s needs a value, got an empty argument\n", a);
            return 2;
        }
        if (!strncmp(a, "--benchmark_min_time", 20) || !strncmp(a, "--benchmark_repetitions", 23)) {
            fprintf(stderr, "kvbench: %s: each case is sampled for --sample-time S seconds of wall time (default %g) "
                            "and reported once, with the median and noise of its samples\n", a, KVB_SAMPLE_TIME_DEFAULT_S);
            return 2;
        } else if (!strncmp(a, "--benchmark_out", 15)) {
            fprintf(stderr, "kvbench: %s: give --json F instead (written whole or not at all, and never over an "
                            "input)\n", a);
            return 2;
        } else if (!strncmp(a, "--benchmark_", 12)) {
            if (o->gb_argc >= 60) {
                fprintf(stderr, "kvbench: more than 59 --benchmark_ flags\n");
                return 2;
            }
            o->gb_argv[o->gb_argc++] = argv[i];
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
        } else if (!strcmp(a, "--sample-time") && next) {
            char *end;
            const double t = strtod(argv[++i], &end);
            if (end == argv[i] || *end || !(t >= 0.01 && t <= 600)) {
                fprintf(stderr, "kvbench: --sample-time %s out of range [0.01, 600] seconds\n", argv[i]);
                return 2;
            }
            o->sample_time_s = t;
        } else if (!strcmp(a, "--shard") && next) {
            if (kvb_shard_parse(argv[++i], &o->shard_k, &o->shard_n)) {
                fprintf(stderr, "kvbench: --shard %s: give K/N, whole numbers with 1 <= K <= N <= %d\n", argv[i],
                        KVB_SHARD_MAX);
                return 2;
            }
        } else if (!strcmp(a, "--timing-lock") && next) o->timing_lock = argv[++i];
        else if (!strcmp(a, "--determinism")) o->determinism = 1;
        else if (!strcmp(a, "--costs")) o->costs = 1;
        else if (!strcmp(a, "--lines") && next) o->lines = argv[++i];
        else if (!strcmp(a, "--durations") && next) o->durations = argv[++i];
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
        } else if (blank(a)) { /* "" would otherwise be a substring of every id: all cases */
            fprintf(stderr, "kvbench: argument %d is an empty filter: give a case line, a kernel name or part of "
                            "a case id\n", i);
            return 2;
        } else if (o->n_filters < KVB_MAX_FILTERS) o->filters[o->n_filters++] = a;
        else {
            fprintf(stderr, "kvbench: more than %d filters (a case file, --cases FILE, holds any number of cases)\n",
                    KVB_MAX_FILTERS);
            return 2;
        }
    }
    const int list = !strcmp(o->cmd, "list"), check = !strcmp(o->cmd, "check"), bench = !strcmp(o->cmd, "bench");
    if (o->shard_n && !list && !check && !bench) {
        fprintf(stderr, "kvbench: --shard is an option of list, check and bench, not of %s\n", o->cmd);
        return 2;
    }
    if (o->durations && !check && !bench && !(list && (o->shard_n || o->costs))) {
        fprintf(stderr, "kvbench: --durations weighs the cases of check and bench (the progress estimate, --shard's "
                        "split) and of list with --shard or --costs, not of %s%s\n", o->cmd,
                list ? " alone" : "");
        return 2;
    }
    if (o->lines && (!list || o->n_filters || o->shard_n || o->durations || o->tier || o->cases_path)) {
        fprintf(stderr, "kvbench: --lines FILE is an option of list alone, without filters, --tier, --shard, "
                        "--durations or --cases: it judges every line of FILE on its own\n");
        return 2;
    }
    if (o->costs && !list) {
        fprintf(stderr, "kvbench: --costs is an option of list, not of %s\n", o->cmd);
        return 2;
    }
    if (o->timing_lock && !bench) {
        fprintf(stderr, "kvbench: --timing-lock is an option of bench, not of %s\n", o->cmd);
        return 2;
    }
    return 0;
}

/* ---- where the cases are ---- */

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

const char *kvb_cases_path(const kvb_options *o)
{
    if (o->cases_path) return o->cases_path;
    const char *env = getenv("KVB_CASES");
    if (env && *env) return env;
    static char found[PATH_MAX];
    char exe[PATH_MAX], tried[2][PATH_MAX + 16];
    int n_tried = 0;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0'; /* the binary's directory */
        static const char *const up[2] = {"/../cases", "/../../cases"}; /* a bundle's bin/, the build tree's build/bin/ */
        for (int i = 0; i < 2; i++) {
            snprintf(tried[n_tried], sizeof tried[n_tried], "%s%s", exe, up[i]);
            if (is_dir(tried[n_tried])) {
                if (kvb_same_file(tried[n_tried], "cases")) return "cases"; /* the same, shorter in messages */
                if (realpath(tried[n_tried], found)) return found;
            }
            n_tried++;
        }
    }
    if (is_dir("cases")) return "cases";
    kvb_fail(KVB_EIO, "no case directory: --cases not given, KVB_CASES not set, and none at %s%s%s%s./cases",
             n_tried > 0 ? tried[0] : "", n_tried > 0 ? ", " : "", n_tried > 1 ? tried[1] : "", n_tried > 1 ? ", " : "");
    return NULL;
}

/* 1 (after a message) when out is the same file as input or, for a directory of case files, as one
 * of its case files */
static int clobbers(const char *opt, const char *out, const char *what, const char *input)
{
    if (!out || !input) return 0;
    if (kvb_same_file(out, input)) {
        fprintf(stderr, "kvbench: %s %s is the same file as %s %s: it would be overwritten\n", opt, out, what, input);
        return 1;
    }
    if (!is_dir(input)) return 0;
    DIR *d = opendir(input);
    if (!d) return 0;
    struct dirent *e;
    int hit = 0;
    while (!hit && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len <= 6 || strcmp(e->d_name + len - 6, ".cases")) continue;
        char full[PATH_MAX + 256];
        snprintf(full, sizeof full, "%s/%s", input, e->d_name);
        if (kvb_same_file(out, full)) {
            fprintf(stderr, "kvbench: %s %s is the same file as the case file %s: it would be overwritten\n", opt,
                    out, full);
            hit = 1;
        }
    }
    closedir(d);
    return hit;
}

int kvb_check_paths(const kvb_options *o)
{
    if (!o->json && !o->summary) return 0;
    const char *cases = o->cases_path ? o->cases_path : kvb_cases_path(o); /* NULL: none, nothing to clobber */
    const char *outs[2] = {o->json, o->summary}, *names[2] = {"--json", "--summary"};
    for (int k = 0; k < 2; k++)
        if (clobbers(names[k], outs[k], "--cases", cases) || clobbers(names[k], outs[k], "--peers", o->peers)) return 2;
    if (o->json && o->summary && (kvb_same_file(o->json, o->summary) || !strcmp(o->json, o->summary))) {
        fprintf(stderr, "kvbench: --json %s and --summary %s are the same file\n", o->json, o->summary);
        return 2;
    }
    /* a result file is renamed over its target: a lock on the file it replaced would lock nothing */
    for (int k = 0; k < 2 && o->timing_lock; k++)
        if (outs[k] && (kvb_same_file(outs[k], o->timing_lock) || !strcmp(outs[k], o->timing_lock))) {
            fprintf(stderr, "kvbench: %s %s and --timing-lock %s are the same file\n", names[k], outs[k], o->timing_lock);
            return 2;
        }
    return 0;
}

/* ---- case selection: load every case file first, so a malformed line stops everything ---- */

/* Whether the key a case line's parse error names ("command line: LINE: key=... out of range") is one
 * the line gives itself; 1 when the error names none. */
static int failed_key_given(const char *err, const char *line)
{
    const char *at = strstr(err, line);
    if (!at || strncmp(at + strlen(line), ": ", 2)) return 1;
    const char *key = at + strlen(line) + 2;
    size_t n = strcspn(key, "= ");
    if (!n || key[n] != '=') return 1;
    for (const char *t = line; *t; t += strcspn(t, " \t"), t += strspn(t, " \t"))
        if (!strncmp(t, key, n + 1)) return 1;
    return 0;
}

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

static int filter_matches(const char *flt, const kvb_case *c)
{
    /* a kernel's own name selects that kernel's cases only: "decode_attn" is not int2_decode_attn */
    const kvb_op *named = kvb_op_find(flt);
    return named ? c->op == named : strstr(c->id, flt) != NULL;
}

static void tier_names(int tier, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int t = KVB_TIER_SMOKE; t <= KVB_TIER_SANITIZE && len < n; t <<= 1)
        if (tier & t) len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? "|" : "", kvb_tier_name(t));
}

/* a filter that selects nothing: say why (another tier has it; not a kernel; not in any id) */
static void no_match(const char *flt, const kvb_case_list *all, int tier)
{
    int elsewhere = 0;
    for (int i = 0; i < all->n; i++) elsewhere += filter_matches(flt, &all->v[i]);
    char tiers[64];
    tier_names(tier, tiers, sizeof tiers);
    if (elsewhere) {
        fprintf(stderr, "kvbench: no case of tier %s matches '%s' (%d case%s of other tiers do%s: --tier all)\n", tiers,
                flt, elsewhere, KVB_PLURAL(elsewhere), elsewhere == 1 ? "es" : "");
    } else if (kvb_op_find(flt)) { /* a kernel with no case in these files */
        fprintf(stderr, "kvbench: no case matches '%s': the case files hold no case of kernel %s (give a case line: "
                        "'%s key=value ...'; its keys: kvbench kernels %s)\n", flt, flt, flt, flt);
    } else if (!strpbrk(flt, " \t=")) { /* one word: a kernel name, perhaps mistyped */
        char known[2048];
        kvb_list_kernels(known, sizeof known);
        fprintf(stderr, "kvbench: no case matches '%s': unknown kernel '%s' and no case id holds it; kernels: %s\n", flt,
                flt, known);
    } else {
        fprintf(stderr, "kvbench: no case matches '%s': no case id holds it\n", flt);
    }
}

int kvb_selection_timed(const kvb_options *o)
{
    return !strcmp(o->cmd, "bench") || (!strcmp(o->cmd, "list") && o->tier == KVB_TIER_BENCH);
}

double *kvb_selection_costs(const kvb_options *o, const kvb_case_list *l)
{
    double *cost = kvb_xalloc((size_t)(l->n ? l->n : 1), sizeof *cost, "the cases' costs");
    if (!cost) {
        fprintf(stderr, "kvbench: %s\n", kvb_last_error());
        return NULL;
    }
    if (kvb_case_costs(l, kvb_selection_timed(o), o->durations, cost) != KVB_OK) {
        fprintf(stderr, "kvbench: --durations %s\n", kvb_last_error());
        kvb_xfree(cost);
        return NULL;
    }
    return cost;
}

/* --shard K/N: the selection's shard K, balanced by kvb_selection_costs. */
static int keep_shard(const kvb_options *o, kvb_case_list *out)
{
    const int selected = out->n;
    double *cost = kvb_selection_costs(o, out);
    if (!cost) {
        kvb_cases_free(out);
        return 2;
    }
    const int rc = kvb_shard_keep(out, o->shard_k, o->shard_n, cost);
    kvb_xfree(cost);
    if (rc != KVB_OK) {
        fprintf(stderr, "kvbench: --shard %d/%d: %s\n", o->shard_k, o->shard_n, kvb_last_error());
        kvb_cases_free(out);
        return 2;
    }
    if (out->n == 0)
        fprintf(stderr, "kvbench: shard %d/%d: none of the %d case%s selected falls to this shard: nothing to run\n",
                o->shard_k, o->shard_n, selected, KVB_PLURAL(selected));
    return 0;
}

int kvb_select_cases(const kvb_options *o, int default_tier, kvb_case_list *out)
{
    kvb_case_list all = {0};
    memset(out, 0, sizeof *out);
    int tier = o->tier ? o->tier : default_tier;
    int from_files = 0;
    for (int i = 0; i < o->n_filters; i++) from_files |= !kvb_is_case_line(o->filters[i]);
    if (o->n_filters == 0 || from_files) {
        const char *path = kvb_cases_path(o);
        if (!path || kvb_cases_load(&all, path)) {
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
            /* a line meant as a filter ("decode_step method=shadowkv") fails on a key it left to its default:
             * then say how to write a filter */
            const char *rest = o->filters[i] + strcspn(o->filters[i], " \t");
            rest += strspn(rest, " \t");
            if (rc != KVB_CASE_BLANK && *rest && !failed_key_given(kvb_last_error(), o->filters[i]))
                fprintf(stderr,
                        "kvbench: (a kernel's name followed by key=value is one case, run as given with the defaults "
                        "for the rest; to select cases of the case files, give the kernel's name alone or a part of "
                        "their ids, e.g. \"%s\")\n",
                        rest);
            kvb_cases_free(&all);
            kvb_cases_free(out);
            return 2;
        }
        if (kvb_cases_find(out, c.id) >= 0) {
            fprintf(stderr, "kvbench: duplicate case '%s' (given twice on the command line): run once\n", c.id);
            continue;
        }
        if (kvb_cases_add(out, &c) != KVB_OK) {
            fprintf(stderr, "kvbench: %s\n", kvb_last_error());
            kvb_cases_free(&all);
            kvb_cases_free(out);
            return 2;
        }
    }
    int hits[KVB_MAX_FILTERS] = {0};
    for (int i = 0; i < all.n; i++) {
        const kvb_case *c = &all.v[i];
        if (!(c->tier & tier)) continue;
        int match = o->n_filters == 0;
        for (int f = 0; f < o->n_filters; f++) {
            if (kvb_is_case_line(o->filters[f]) || !filter_matches(o->filters[f], c)) continue;
            match = 1;
            hits[f]++;
        }
        if (!match) continue;
        const int given = kvb_cases_find(out, c->id);
        if (given >= 0) { /* a case line given on the command line is also this file case: the line given wins */
            fprintf(stderr, "kvbench: duplicate case '%s' (command line, also %s): run once, as given on the command line\n",
                    c->id, c->where);
            continue;
        }
        if (kvb_cases_add(out, c) != KVB_OK) {
            fprintf(stderr, "kvbench: %s\n", kvb_last_error());
            kvb_cases_free(&all);
            kvb_cases_free(out);
            return 2;
        }
    }
    for (int f = 0; f < o->n_filters; f++) /* a filter that selects nothing is a mistake, never ignored */
        if (!kvb_is_case_line(o->filters[f]) && !hits[f]) {
            no_match(o->filters[f], &all, tier);
            kvb_cases_free(&all);
            kvb_cases_free(out);
            return 2;
        }
    kvb_cases_free(&all);
    return o->shard_n ? keep_shard(o, out) : 0;
}
