/* `spillway ops ...`, the operators' commands (ops.c): the CLI's, not the
 * SDK's API; the admin API they call is HTTP, with the admin token.
 * Layer: sdk/, for sdk/spillway.c only.
 */
#ifndef SW_SDK_OPS_H
#define SW_SDK_OPS_H

/* Runs `spillway ops ARGS` (argv[1] is "ops"); returns the exit status. */
int sw_cli_ops(int argc, char **argv);

#endif
