/* Structured output with libspillway: the answer is JSON that fits a schema,
 * whatever the model would rather write, and the per-token log
 * probabilities come back with it.
 * Build: cc extract.c -I<spillway> -I<build>/gen -L<build>/lib -lsw_sdk -lsw_proto -lzmq -lprotobuf-c
 * Run:   extract ENDPOINT MODEL "TEXT TO READ" */
#include "sdk/spillway.h"
#include <stdio.h>

/* A person, as JSON Schema: the worker masks every token that would leave it. */
static const char *const PERSON =
    "{\"type\": \"object\","
    " \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 20},"
    "                  \"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 130},"
    "                  \"pets\": {\"type\": \"array\", \"items\": {\"enum\": [\"cat\", \"dog\"]}, \"maxItems\": 3}},"
    " \"required\": [\"name\", \"age\"], \"additionalProperties\": false}";

int main(int argc, char **argv)
{
    if (argc != 4) { fprintf(stderr, "usage: extract ENDPOINT MODEL TEXT\n"); return 2; }
    char err[256];
    spillway_client *c = spillway_connect(argv[1], err, sizeof err);
    if (!c) { fprintf(stderr, "%s\n", err); return 1; }

    spillway_message chat[] = {
        { "system", "Read the text and answer with the person it describes, as JSON." },
        { "user", argv[3] },
    };
    spillway_request r = spillway_request_default(argv[2]);
    r.messages = chat;
    r.n_messages = 2;
    r.json_schema = PERSON;
    r.max_tokens = 300;
    r.temperature = 0.7f;
    r.has_seed = true;
    r.seed = 1;
    r.logprobs = true;
    spillway_result res;
    if (spillway_complete(c, &r, &res, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        spillway_result_free(&res);   /* a failed request still owes its result and the client their memory */
        spillway_close(c);
        return 1;
    }
    printf("%s\n", res.text);
    double sum = 0;
    for (size_t i = 0; i < res.n_logprobs; i++) sum += res.logprobs[i].token.logprob;
    fprintf(stderr, "finish=%s tokens=%u logprob=%.3f\n", spillway_finish_name(res.finish), res.completion_tokens, sum);
    int rc = res.finish == SPILLWAY_FINISH_STOP ? 0 : 1;   /* LENGTH: max_tokens cut the JSON */
    spillway_result_free(&res);
    spillway_close(c);
    return rc;
}
