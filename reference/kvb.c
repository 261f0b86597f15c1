/* kvb.c: the thread-local error message of kvb.h. */
#include "reference/kvb.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char kvb_error_message[4096]; /* room for a list of every kernel or key */

int kvb_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kvb_error_message, sizeof kvb_error_message, fmt, ap);
    va_end(ap);
    return code;
}

const char *kvb_last_error(void) { return kvb_error_message; }

void kvb_clear_error(void) { kvb_error_message[0] = '\0'; }
