/* Small shared helpers: clocks, directives, request lifetime. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include "gateway/req.h"
#include "gateway/util.h"
#include "llm/clock.h"

int64_t sw_now_ns(void) { return sw_clock_ns(); }

int64_t sw_now_ms(void) { return sw_now_ns() / 1000000; }

int sw_priority_parse(const char *s)
{
    if (!strcasecmp(s, "interactive")) return SW_CLASS_INTERACTIVE;
    if (!strcasecmp(s, "batch")) return SW_CLASS_BATCH;
    return -1;
}

sw_req *sw_req_new(void)
{
    sw_req *r = calloc(1, sizeof *r);
    if (!r) abort();
    r->refs = 1;
    r->fd = -1;
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

sw_req *sw_req_ref(sw_req *r)
{
    __atomic_add_fetch(&r->refs, 1, __ATOMIC_RELAXED);
    return r;
}

void sw_req_unref(sw_req *r)
{
    if (!r || __atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    pthread_mutex_destroy(&r->mu);
    free(r->model_asked);
    free(r->model);
    free(r->gen);
    free(r->embed_values);
    free(r->api_key);
    free(r->tenant);
    free(r->want_target);
    free(r->want_quant);
    for (size_t i = 0; i < r->n_key_pools; i++) free(r->key_pools[i]);
    free(r->key_pools);
    sw_sbuf_free(&r->text);
    sw_sbuf_free(&r->reasoning);
    sw_tool_calls_free(&r->calls);
    for (size_t i = 0; i < r->n_lps; i++) {
        free(r->lps[i].tok.bytes);
        for (size_t k = 0; k < r->lps[i].n_top; k++) free(r->lps[i].top[k].bytes);
        free(r->lps[i].top);
    }
    free(r->lps);
    sw_sbuf_free(&r->out);
    if (r->resp_free) r->resp_free(r->resp);
    if (r->policy) sw_policy_unref(r->policy);
    for (size_t i = 0; i < r->n_kids; i++) sw_req_unref(r->kids[i]);
    free(r->kids);
    free(r);
}
