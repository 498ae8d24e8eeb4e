/* Several samples of one prompt (OpenAI's n) with libspillway: streamed,
 * each delta with its sample's index; then the same request cancelled from
 * the callback, which ends every sample.
 * Build: cc samples.c -I<spillway> -I<build>/gen -L<build>/lib -lsw_sdk -lsw_proto -lzmq -lprotobuf-c
 * Run:   samples ENDPOINT MODEL */
#include "sdk/spillway.h"
#include <stdio.h>
#include <string.h>

#define N 3

typedef struct {
    char text[N][4096];   /* what the deltas of each sample add up to */
    int deltas, stop_after;
} seen;

static int on_delta(void *user, uint32_t index, const char *delta, size_t len)
{
    seen *s = user;
    strncat(s->text[index], delta, sizeof s->text[index] - strlen(s->text[index]) - 1);
    return ++s->deltas == s->stop_after;   /* non-zero: cancel the request */
}

int main(int argc, char **argv)
{
    if (argc != 3) { fprintf(stderr, "usage: samples ENDPOINT MODEL\n"); return 2; }
    char err[256];
    spillway_client *c = spillway_connect(argv[1], err, sizeof err);
    if (!c) { fprintf(stderr, "%s\n", err); return 1; }
    spillway_request r = spillway_request_default(argv[2]);
    r.prompt = "Once upon a time";
    r.max_tokens = 10;
    r.temperature = 1;
    r.has_seed = true;
    r.seed = 5;
    r.n = N;
    spillway_result res[N];
    seen s = {0};
    int rc = spillway_complete_n(c, &r, on_delta, &s, res, err, sizeof err);
    for (int i = 0; i < N; i++) {
        printf("sample %d: [%s] finish=%s prompt_tokens=%u cached_tokens=%u completion_tokens=%u streamed=%d\n",
               i, res[i].text ? res[i].text : "", spillway_finish_name(res[i].finish), res[i].prompt_tokens,
               res[i].cached_tokens, res[i].completion_tokens, !strcmp(s.text[i], res[i].text ? res[i].text : ""));
        spillway_result_free(&res[i]);
    }
    if (rc != 0) { fprintf(stderr, "%s\n", err); spillway_close(c); return 1; }

    r.max_tokens = 2000;
    memset(&s, 0, sizeof s);
    s.stop_after = 3;
    rc = spillway_complete_n(c, &r, on_delta, &s, res, err, sizeof err);
    printf("cancelled: rc=%d", rc);
    for (int i = 0; i < N; i++) {
        printf(" %s", spillway_finish_name(res[i].finish));
        spillway_result_free(&res[i]);
    }
    printf("\n");
    spillway_close(c);
    return 0;
}
