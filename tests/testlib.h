/* testlib.h: what every test program includes (cmocka needs these headers first). */
#ifndef KVB_TESTLIB_H
#define KVB_TESTLIB_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

/* Assert that the last kvbench error message contains every given fragment. */
#define assert_error_mentions(...) kvb_test_error_mentions(__FILE__, __LINE__, __VA_ARGS__, (const char *)NULL)
void kvb_test_error_mentions(const char *file, int line, ...);

/* kvb_parse_options on a command line written as its words joined by '|' ("check|--shard|2/5"), after
 * the program name; the words live in a static buffer until the next call. */
struct kvb_options;
int kvb_test_parse_line(struct kvb_options *o, const char *line);

/* The cases directory (env KVB_CASES, default "cases"). */
const char *kvb_test_cases_dir(void);

/* A GPU test program's main: the `fixed` tests (API rejections, which need no device), then one test
 * per check-tier case of cases/ whose family is listed in `families` (NULL-terminated), each
 * validated `rounds` times on the same device state (workspaces must be reusable) and skipped, and
 * counted as skipped, without a device or with env KVB_TEST_GPU_CASES=0 (a GPU round whose check phase
 * runs the whole check tier with --determinism, which covers both launches). Returns cmocka's status. */
int kvb_test_run_gpu_cases(const char *group, const struct CMUnitTest *fixed, int n_fixed,
                           const char *const *families, int rounds);

#endif
