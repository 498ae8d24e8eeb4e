/* See util.h. */
#include "llm/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void sw_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}
