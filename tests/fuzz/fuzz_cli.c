/* fuzz_cli.c: libFuzzer target for kvbench's options and case selection.
 *
 * The input is argv after "kvbench", one argument a line (an argument may hold spaces, as a quoted
 * case line does). kvb_parse_options parses it; for the commands that select cases, kvb_select_cases
 * then runs as `list` runs it, over a small case file written at start-up instead of --cases (the
 * fuzzer must not read files of its choosing). No command is executed: nothing is set up or launched.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness/core/cli.h"

static char g_cases[64]; /* the case file every selection reads */

static void remove_cases(void) { unlink(g_cases); }

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static const char text[] = "index_scan M=7 tier=smoke\n"
                               "gather_copy B=2 M=16 ctx=1024 tier=check\n"
                               "gather_copy B=8 hit=0.6 tier=bench\n"
                               "topk rows=4 n=100 k=10 tier=check # a comment\n"
                               "decode_step method=dense model=tiny B=2 ctx=100 tier=smoke\n";
    snprintf(g_cases, sizeof g_cases, "/tmp/kvb_fuzz_cli_XXXXXX");
    int fd = mkstemp(g_cases);
    if (fd < 0 || write(fd, text, sizeof text - 1) != (ssize_t)(sizeof text - 1) || close(fd)) {
        perror("fuzz_cli: writing the case file");
        exit(1);
    }
    atexit(remove_cases);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    char **argv = malloc(sizeof *argv * (size + 3));
    if (!text || !argv) return free(text), free(argv), 0;
    memcpy(text, data, size);
    text[size] = '\0';
    int argc = 0;
    argv[argc++] = "kvbench";
    for (char *a = text, *nl;; a = nl + 1) { /* one argument a line; an empty input is no argument */
        if (!*a && argc == 1) break;
        argv[argc++] = a;
        if (!(nl = strchr(a, '\n'))) break;
        *nl = '\0';
    }
    argv[argc] = NULL;

    kvb_options o;
    int rc = kvb_parse_options(argc, argv, &o);
    if (rc == 0 && (!strcmp(o.cmd, "list") || !strcmp(o.cmd, "check") || !strcmp(o.cmd, "bench") ||
                    !strcmp(o.cmd, "profile"))) {
        o.cases_path = g_cases;
        kvb_case_list cases;
        if (kvb_select_cases(&o, KVB_TIER_SMOKE | KVB_TIER_CHECK | KVB_TIER_BENCH, &cases) == 0) {
            for (int i = 0; i < cases.n; i++) {
                char line[KVB_ID_MAX + 128];
                kvb_case_repro(&cases.v[i], line, sizeof line);
            }
            kvb_cases_free(&cases);
        }
    }
    free(argv);
    free(text);
    return 0;
}
