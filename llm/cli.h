/* Command-line value parsing shared by the programs.
 *
 * sw_parse_* accept the whole string or nothing (no trailing junk, no
 * overflow, within [lo, hi]) and report failure, for programs that word their
 * own errors. sw_cli_* do the same but print
 *     PROG: FLAG: invalid value 'S' (integer LO..HI)
 * and exit 2, the usage-error status every program uses.
 */
#ifndef SW_CLI_H
#define SW_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

bool sw_parse_long(const char *s, long lo, long hi, long *out);
/* Finite numbers only: "nan" and "inf" are refused. */
bool sw_parse_double(const char *s, double lo, double hi, double *out);
/* "on" or "off" (switches such as --prefix-cache). */
bool sw_parse_on_off(const char *s, bool *on);

long sw_cli_long(const char *prog, const char *flag, const char *s, long lo, long hi);
double sw_cli_double(const char *prog, const char *flag, const char *s, double lo, double hi);
/* Non-negative decimal integer up to 2^64-1 (seeds). */
uint64_t sw_cli_u64(const char *prog, const char *flag, const char *s);
/* "1,2,3" (spaces around ids allowed) -> a malloc'd array of ids in 0..max;
 * *n_out gets the count. */
int32_t *sw_cli_ids(const char *prog, const char *flag, const char *s, long max, int *n_out);

/* "HOST:PORT" or "[V6ADDR]:PORT" -> host (brackets dropped; may be empty)
 * and a port in 1..65535. False if it has no port or host does not fit. */
bool sw_parse_hostport(const char *s, char *host, size_t hostlen, int *port);

/* Prints "PROG: message" and exits 2. */
void sw_cli_die(const char *prog, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

#endif
