/* testlib.c: see testlib.h. */
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>

#include "../reference/kvb.h"

void kvb_test_error_mentions(const char *file, int line, ...)
{
    va_list ap;
    va_start(ap, line);
    const char *msg = kvb_last_error(), *frag;
    while ((frag = va_arg(ap, const char *))) {
        if (!strstr(msg, frag)) {
            print_error("error message \"%s\" does not mention \"%s\"\n", msg, frag);
            va_end(ap);
            _fail(file, line);
        }
    }
    va_end(ap);
}

const char *kvb_test_cases_dir(void)
{
    const char *d = getenv("KVB_CASES");
    return d ? d : "cases";
}
