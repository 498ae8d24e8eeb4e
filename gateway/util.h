/* Small helpers every gateway file may use: clocks and a growable buffer.
 *
 * Layer: the bottom of the gateway; includes nothing of it.
 */
#ifndef SW_GW_UTIL_H
#define SW_GW_UTIL_H

#include <stddef.h>
#include <stdint.h>

int64_t sw_now_ms(void);             /* CLOCK_MONOTONIC */
int64_t sw_now_ns(void);

/* A growable byte buffer, always NUL-terminated once written to. Out of
 * memory aborts: there is no smaller answer to give. */
typedef struct { char *data; size_t len, cap; } sw_buf;
void sw_buf_append(sw_buf *b, const char *s, size_t n);
void sw_buf_puts(sw_buf *b, const char *s);
void sw_buf_free(sw_buf *b);

#endif
