/* libspillway refuses what the gateway would not take, before sending it,
 * with a message that says what is wrong (the gateway drops a frame that
 * fails the wire check unanswered, so a call would only time out). No
 * gateway is needed: every call here must fail at once, never with a
 * timeout. Limits are llm/limits.h's, read from there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llm/limits.h"
#include "proto/wire.h"
#include "sdk/spillway.h"
#include "tests/unit/check.h"

static char err[512];

/* rc is -1 and err holds needle (not a timeout: nothing was sent). */
#define REFUSED(rc, needle) do { int rc_ = (rc); CHECK(rc_ == -1 && strstr(err, needle) && \
    !strstr(err, "timed out"), "rc=%d err='%s' (want '%s')", rc_, err, needle); err[0] = 0; } while (0)

static void test_embed_args(spillway_client *c)
{
    spillway_embeddings e;
    spillway_input in[2] = {{.text = "a"}, {.text = "b"}};
    REFUSED(spillway_embed(NULL, "m", in, 2, &e, 500, err, sizeof err), "no client");
    REFUSED(spillway_embed(c, "", in, 2, &e, 500, err, sizeof err), "needs a model");
    REFUSED(spillway_embed(c, NULL, in, 2, &e, 500, err, sizeof err), "needs a model");
    REFUSED(spillway_embed(c, "a model", in, 2, &e, 500, err, sizeof err), "not one the gateway takes");
    REFUSED(spillway_embed(c, "m", in, 0, &e, 500, err, sizeof err), "1 to SW_MAX_EMBED_INPUTS");
    REFUSED(spillway_embed(c, "m", in, SW_MAX_EMBED_INPUTS + 1, &e, 500, err, sizeof err), "SW_MAX_EMBED_INPUTS");
    REFUSED(spillway_embed(c, "m", NULL, 2, &e, 500, err, sizeof err), "inputs is NULL");
    REFUSED(spillway_embed(c, "m", in, 2, NULL, 500, err, sizeof err), "(out)");
    CHECK(e.values == NULL && e.count == 0, "refused: nothing to free");
    in[1].text = "";
    REFUSED(spillway_embed(c, "m", in, 2, &e, 500, err, sizeof err), "inputs[1] is empty");
    static uint32_t ids[SW_MAX_EMBED_INPUT_TOKENS + 1];
    in[1] = (spillway_input){.text = "b", .ids = ids, .n_ids = 2};
    REFUSED(spillway_embed(c, "m", in, 2, &e, 500, err, sizeof err), "inputs[1] has both text and token ids");
    in[1] = (spillway_input){.ids = ids, .n_ids = SW_MAX_EMBED_INPUT_TOKENS + 1};
    char want[128];
    snprintf(want, sizeof want, "inputs[1] has %d token ids, more than %d", SW_MAX_EMBED_INPUT_TOKENS + 1,
             SW_MAX_EMBED_INPUT_TOKENS);
    REFUSED(spillway_embed(c, "m", in, 2, &e, 500, err, sizeof err), want);
    in[1] = (spillway_input){.n_ids = 3};
    REFUSED(spillway_embed(c, "m", in, 2, &e, 500, err, sizeof err), "inputs[1] has n_ids but no ids");
    in[1] = (spillway_input){.text = "caf\xc3"};
    REFUSED(spillway_embed(c, "m", in, 2, &e, 500, err, sizeof err), "inputs[1] is not valid UTF-8");
    const char *texts[3] = {"a", NULL, "c"};
    REFUSED(spillway_embed_texts(c, "m", texts, 3, &e, 500, err, sizeof err), "inputs[1] is empty");
    REFUSED(spillway_embed_texts(c, "m", texts, 0, &e, 500, err, sizeof err), "SW_MAX_EMBED_INPUTS");
    /* within every limit, but past what one frame carries: the gateway would drop it */
    spillway_input *big = calloc(SW_MAX_EMBED_INPUTS, sizeof *big);
    for (int i = 0; big && i < SW_MAX_EMBED_INPUTS; i++)
        big[i] = (spillway_input){.ids = ids, .n_ids = SW_MAX_EMBED_INPUT_TOKENS};
    /* (a token id is a byte at least, and each input has its own framing) */
    CHECK((size_t)SW_MAX_EMBED_INPUTS * SW_MAX_EMBED_INPUT_TOKENS >= SW_MAX_FRAME, "the limits make no frame too large");
    if (big)
        REFUSED(spillway_embed(c, "m", big, SW_MAX_EMBED_INPUTS, &e, 500, err, sizeof err), "more than a frame takes");
    free(big);
}

static void test_batch_args(spillway_client *c)
{
    static spillway_input pr[SW_MAX_CHOICES + 1];
    static spillway_result res[SW_MAX_CHOICES];
    for (int i = 0; i <= SW_MAX_CHOICES; i++) pr[i].text = "Once";
    spillway_request r = spillway_request_default("m");
    r.timeout_ms = 500;
    spillway_usage u;
    REFUSED(spillway_complete_batch(c, &r, NULL, NULL, res, &u, err, sizeof err), "needs a request with prompts");
    r.prompts = pr;
    r.n_prompts = SW_MAX_CHOICES + 1;
    char want[128];
    snprintf(want, sizeof want, "a batch of %d prompts, more than SW_MAX_CHOICES", SW_MAX_CHOICES + 1);
    REFUSED(spillway_complete_batch(c, &r, NULL, NULL, res, &u, err, sizeof err), want);
    r.n_prompts = 2;
    r.n = SW_MAX_CHOICES / 2 + 1;
    snprintf(want, sizeof want, "%d choices (prompts times n), more than SW_MAX_CHOICES", 2 * r.n);
    REFUSED(spillway_complete_batch(c, &r, NULL, NULL, res, &u, err, sizeof err), want);
    r.n = 2;
    pr[1].text = "";
    REFUSED(spillway_complete_batch(c, &r, NULL, NULL, res, &u, err, sizeof err), "prompts[1] is empty");
    CHECK(res[0].text == NULL && res[3].text == NULL && u.prompt_tokens == 0, "refused: results zeroed");
    pr[1].text = "The";
    r.prompt = "x";
    REFUSED(spillway_complete_batch(c, &r, NULL, NULL, res, &u, err, sizeof err), "in place of prompt");
    r.prompt = NULL;
    spillway_message m = {"user", "hi"};
    r.messages = &m;
    r.n_messages = 1;
    REFUSED(spillway_complete_batch(c, &r, NULL, NULL, res, &u, err, sizeof err), "takes no messages");
    r.messages = NULL;
    r.n_messages = 0;
    r.model = "bad model";
    REFUSED(spillway_complete_batch(c, &r, NULL, NULL, res, &u, err, sizeof err), "not one the gateway takes");
    r.model = "m";
    r.n = 0;
    REFUSED(spillway_complete(c, &r, res, err, sizeof err), "goes through spillway_complete_batch");
    r.n = 3;
    REFUSED(spillway_complete_n(c, &r, NULL, NULL, res, err, sizeof err), "goes through spillway_complete_batch");
    r.prompts = NULL;
    REFUSED(spillway_complete_batch(c, &r, NULL, NULL, res, &u, err, sizeof err), "prompts is NULL");
}

int main(void)
{
    /* nothing listens there: a call that sent anything would time out */
    spillway_client *c = spillway_connect("tcp://127.0.0.1:9", err, sizeof err);
    CHECK(c != NULL, "connect: %s", err);
    if (!c) CHECK_DONE();
    test_embed_args(c);
    test_batch_args(c);
    spillway_close(c);
    CHECK_DONE();
}
