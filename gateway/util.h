/* Small helpers every gateway file may use: clocks, and llm/util.h's
 * sw_sbuf.
 *
 * Layer: the bottom of the gateway; includes nothing of it.
 */
#ifndef SW_GW_UTIL_H
#define SW_GW_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include "llm/util.h"   /* sw_sbuf, the one growable buffer: out of memory sets .oom, which
                         * http.c checks where a response is finished, so the request is
                         * still answered (a 500, or a stream cut short) */

int64_t sw_now_ms(void);             /* CLOCK_MONOTONIC */
int64_t sw_now_ns(void);

#endif
