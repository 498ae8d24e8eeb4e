/* A batch of prompts with libspillway (the HTTP API's `prompt` as an
 * array): each argument a prompt, a text or, written as [ID,ID,...], token
 * ids; N samples of each, streamed with their index prompt * N + sample.
 * Build: cc batch.c -I<spillway> -I<build>/gen -L<build>/lib -lsw_sdk -lsw_proto -lzmq -lprotobuf-c
 * Run:   batch ENDPOINT MODEL N PROMPT... */
#include "sdk/spillway.h"
#include "input.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX 64   /* SW_MAX_CHOICES: the SDK refuses more, saying so */

typedef struct {
    char text[MAX][4096];   /* what the deltas of each choice add up to */
} seen;

static int on_delta(void *user, uint32_t index, const char *delta, size_t len)
{
    seen *s = user;
    if (index >= MAX) return 0;
    size_t room = sizeof s->text[index] - strlen(s->text[index]) - 1;
    strncat(s->text[index], delta, len < room ? len : room);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 5) { fprintf(stderr, "usage: batch ENDPOINT MODEL N PROMPT...\n"); return 2; }
    size_t np = (size_t)argc - 4;
    spillway_input *prompts = calloc(np, sizeof *prompts);
    for (size_t i = 0; prompts && i < np; i++)
        if (argv[i + 4][0] != '[' || parse_ids(argv[i + 4], &prompts[i]) != 0)
            prompts[i] = (spillway_input){.text = argv[i + 4]};
    spillway_request r = spillway_request_default(argv[2]);
    r.prompts = prompts;
    r.n_prompts = np;
    r.n = (uint32_t)atoi(argv[3]);
    r.max_tokens = 8;
    r.temperature = 1;
    r.has_seed = true;
    r.seed = 5;
    size_t k = np * (r.n > 1 ? r.n : 1);
    spillway_result *res = calloc(k, sizeof *res);
    seen *s = calloc(1, sizeof *s);
    char err[256];
    spillway_client *c = prompts && res && s ? spillway_connect(argv[1], err, sizeof err) : NULL;
    spillway_usage u;
    int rc = c ? spillway_complete_batch(c, &r, on_delta, s, res, &u, err, sizeof err) : -1;
    for (size_t i = 0; rc == 0 && i < k; i++)
        printf("choice %zu: [%s] finish=%s prompt_tokens=%u completion_tokens=%u streamed=%d\n", i,
               res[i].text ? res[i].text : "", spillway_finish_name(res[i].finish), res[i].prompt_tokens,
               res[i].completion_tokens,
               i < MAX && !strcmp(s->text[i], res[i].text ? res[i].text : ""));
    if (rc == 0)
        printf("usage prompt_tokens=%u completion_tokens=%u\n", u.prompt_tokens, u.completion_tokens);
    else
        fprintf(stderr, "%s\n", c ? err : "out of memory");
    for (size_t i = 0; res && i < k; i++) spillway_result_free(&res[i]);   /* zeroed, or filled */
    for (size_t i = 0; prompts && i < np; i++) free((uint32_t *)prompts[i].ids);
    free(prompts);
    free(res);
    free(s);
    spillway_close(c);
    return rc ? 1 : 0;
}
