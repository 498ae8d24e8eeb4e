/* `spillway ops ...`, the operators' commands (ops.c): the CLI's, not the
 * SDK's API; the admin API they call is HTTP, with the admin token.
 * Layer: sdk/, for sdk/spillway.c only.
 */
#ifndef SW_SDK_OPS_H
#define SW_SDK_OPS_H

/* Runs `spillway ops ARGS` (argv[1] is "ops"); returns the exit status. */
int sw_cli_ops(int argc, char **argv);

/* The admin token file the commands read unless told: $SPILLWAY_ADMIN_TOKEN_FILE,
 * else build/run/admin.token (where `make run` writes it). */
const char *sw_cli_admin_token_file(void);
/* The token: the file's first line, malloc'd; NULL with the reason on stderr. */
char *sw_cli_read_admin_token(const char *path);

#endif
