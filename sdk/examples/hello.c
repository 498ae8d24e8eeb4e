/* The smallest libspillway program: one blocking completion, one streamed one.
 * Build: cc hello.c -I<spillway> -I<build>/gen -L<build>/lib -lsw_sdk -lsw_proto -lzmq -lprotobuf-c
 * Run:   hello ENDPOINT MODEL */
#include "sdk/spillway.h"
#include <stdio.h>

static int on_delta(void *user, const char *delta, size_t len)
{
    int *chunks = user;
    (*chunks)++;
    fwrite(delta, 1, len, stdout);
    return 0;
}

/* A failed request still owes its result and the client their memory. */
static int fail(spillway_client *c, spillway_result *res, const char *err)
{
    fprintf(stderr, "%s\n", err);
    spillway_result_free(res);
    spillway_close(c);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 3) { fprintf(stderr, "usage: hello ENDPOINT MODEL\n"); return 2; }
    char err[256];
    spillway_client *c = spillway_connect(argv[1], err, sizeof err);
    if (!c) { fprintf(stderr, "%s\n", err); return 1; }

    spillway_request r = spillway_request_default(argv[2]);
    r.prompt = "Once upon a time";
    r.max_tokens = 16;
    r.temperature = 0;
    spillway_result res;
    if (spillway_complete(c, &r, &res, err, sizeof err) != 0) return fail(c, &res, err);
    printf("blocking: [%s] finish=%s tokens=%u pool=%s\n", res.text, spillway_finish_name(res.finish),
           res.completion_tokens, res.pool);
    spillway_result_free(&res);

    int chunks = 0;
    printf("streamed: [");
    if (spillway_complete_stream(c, &r, on_delta, &chunks, &res, err, sizeof err) != 0)
        return fail(c, &res, err);
    printf("] chunks=%d finish=%s\n", chunks, spillway_finish_name(res.finish));
    spillway_result_free(&res);
    spillway_close(c);
    return 0;
}
