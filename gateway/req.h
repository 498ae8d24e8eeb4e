/* One generate request as the gateway holds it, from its front door
 * (front.c) to its last byte out.
 *
 * Shared by the client's side (an HTTP pool thread, or the broker for an SDK
 * client) and the broker: refcounted, its mutable fields guarded by its own
 * mutex, as marked below.
 *
 * Layer: a data type below everything that handles requests; uses util.h,
 * the policy and llm/chat.h (tool calls).
 */
#ifndef SW_GW_REQ_H
#define SW_GW_REQ_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "proto/wire.h"
#include "gateway/policy.h"
#include "gateway/util.h"
#include "llm/chat.h"

struct MHD_Connection;
struct sw_worker;
struct sw_route_stats;
struct sw_req;

/* How a request's results reach its client: the one interface between the
 * broker and the two kinds of client, HTTP (http.c) and SDK (the SDK side
 * of broker.c). So the broker never calls into http.c, nor asks which kind
 * of client it serves. Called on the broker thread. */
typedef struct sw_sink {
    /* A worker's chunk (r->mu not held), before the broker records what
     * every request records (a token came, the finish, the usage). Returns
     * false when the client is gone: the broker cancels the request. */
    bool (*chunk)(struct sw_req *r, const Spillway__TokenChunk *c, int64_t rx_ns);
    /* The request failed (r->mu not held); the broker lets go of it next. */
    void (*fail)(struct sw_req *r, int status, const char *type, const char *code, const char *msg);
    /* Whatever waits on r may look again: dispatched, finished, cancelled,
     * a keep-alive due (r->mu held). NULL when nothing waits. */
    void (*wake)(struct sw_req *r);
    /* An embeddings request's answer from its worker (r->mu not held),
     * checked against the request's inputs by the broker: kept in r, or
     * relayed. Before the broker lets go of r. */
    void (*embedded)(struct sw_req *r, const Spillway__EmbedReply *e);
} sw_sink;

typedef enum { SW_PH_NEW, SW_PH_QUEUED, SW_PH_RUNNING, SW_PH_DONE } sw_phase;

typedef struct sw_req {
    int refs;                     /* atomic */
    pthread_mutex_t mu;
    char id[48];

    /* immutable once submitted */
    bool chat, stream, include_usage;
    bool logprobs;                /* the response carries log probabilities */
    /* /v1/responses (chat underneath): its own state (responses.h), freed
     * with r through resp_free (so this layer calls nothing above it); else NULL */
    struct sw_resp *resp;
    void (*resp_free)(struct sw_resp *);
    char *model_asked, *model;    /* as asked; after alias resolution */
    uint8_t *gen; size_t gen_len; /* encoded Envelope{generate} */
    int klass;
    uint32_t prompt_tokens_est;
    uint64_t prefix_key;          /* sw_prefix_key: routes prompts that share a prefix together */
    char *api_key, *tenant, *want_target, *want_quant;
    char **key_pools;             /* the pools the client's key may use (keys.h); none: every pool */
    size_t n_key_pools;
    /* An embeddings request (gateway/embeddings.c): gen holds an
     * Envelope{embed} of embed_n inputs, the longest of its token-id
     * inputs embed_max_ids long; base64: the vectors go out as base64. */
    bool embed, embed_base64;
    uint32_t embed_n, embed_max_ids;
    int64_t max_queue_ms;         /* 0 = policy default */
    int64_t created_s;            /* unix time for the response */
    int64_t t_submit_ns;
    char key_label[64];           /* the client key's label (keys.h), for the access log; "" = none */
    struct MHD_Connection *conn;
    int fd;
    const sw_sink *sink;          /* the client's side (set before submitting) */

    /* shared, under mu */
    sw_phase phase;
    bool suspended;               /* MHD connection suspended (so it is alive) */
    bool conn_done;               /* MHD finished with the connection */
    bool client_gone;
    bool decided;                 /* broker answered: dispatched or failed */
    bool headers_sent;            /* HTTP side queued the response (status is out) */
    int err_status;               /* != 0: fail with this HTTP status (before headers) */
    char err_msg[256];
    const char *err_type, *err_code;
    char pool[64];
    char worker[SW_MAX_ID_LEN + 1];
    sw_sbuf text;                  /* streaming: not yet relayed; else: all */
    sw_sbuf reasoning;             /* the same for a reasoning model's reasoning (chat only) */
    int64_t text_rx_ns;           /* when the oldest unrelayed text arrived */
    bool finished;
    int finish;                   /* Spillway__FinishReason */
    uint32_t usage_prompt, usage_completion, usage_cached;   /* cached: prompt tokens the worker reused */
    uint32_t usage_reasoning;     /* completion tokens that were reasoning */
    double usage_worker_s;        /* worker time the request used, as its worker reported it */
    /* the function calls the worker reported, in order; streaming: those
     * from n_calls_sent on are not relayed yet */
    sw_tool_calls calls;
    size_t n_calls_sent;
    /* log probabilities the worker reported, one entry a token (when asked);
     * streaming: those from n_lps_sent on are not relayed yet */
    struct sw_lp_entry {
        struct sw_lp_token { char *bytes; size_t n; float logprob; } tok, *top;
        size_t n_top;
    } *lps;
    size_t n_lps, cap_lps, n_lps_sent;
    size_t n_prompt_lps;          /* echo: the first n_lps entries are the prompt's */
    float *embed_values;          /* the vectors (embed_n x embed_dim), when they came */
    uint32_t embed_dim;
    bool got_token;
    bool keepalive_due;
    int64_t last_write_ms;
    /* output staging for the content reader (MHD thread only) */
    sw_sbuf out; size_t out_off;
    int sse_stage;                /* 0 headers not yet, 1 role sent, 2 final sent, 3 done */

    /* SDK requests (no HTTP connection): answered over the SDK ROUTER */
    bool sdk;
    uint8_t sdk_ident[256]; size_t sdk_ident_len;
    char client_id[SW_MAX_ID_LEN + 1];   /* the id the SDK client chose */
    bool sdk_sent;                /* a chunk went out: failures are in-band now */
    bool sdk_gone;                /* the client's socket vanished */

    /* A request of several choices (n > 1, batched prompts: gateway/choices.h).
     * The parent is what its client holds; each choice is a request of its own. */
    struct sw_req *parent;        /* a choice: its parent (no reference: the parent outlives it in the broker) */
    unsigned choice;              /* a choice: its index in the response (prompt * n + sample) */
    struct sw_req **kids;         /* the parent: its choices, a reference each (immutable once submitted) */
    size_t n_kids;
    unsigned n_per_prompt;        /* the parent: choices per prompt (`n`) */
    size_t kids_done;             /* the parent, under mu: choices finished */
    bool kids_over;               /* the parent, under mu: every choice finished, or one failed */
    bool siblings_sent;           /* a choice, broker only: its prompt's other choices were submitted */
    bool counted;                 /* a choice, broker only: counted in its parent's kids_done */
    bool send_wanted, sent;       /* a choice, broker only: to be submitted; submitted */

    /* broker only */
    struct sw_worker *w;
    struct sw_route_stats *stats;
    bool probe;                         /* it tries a route degraded by errors (sw_decision) */
    bool outcome_counted;               /* on its route already (its worker died: death_on_routes) */
    int retries;
    int refusals;                       /* SW_REFUSED_CODE answers (full, draining) so far */
    int retry_status;                   /* the worker error that caused the retry, */
    char retry_error[256];              /* reported if no other worker can take it */
    int64_t dispatch_ms;
    int64_t dispatched_ns, first_token_ns, last_token_ns;   /* access.c's: 0 = not yet */
    int64_t enq_ms, queue_deadline_ms, deadline_ms, first_token_deadline_ms;
    char queued_pool[64];
    sw_policy *policy;
    struct sw_req *hnext;               /* id hash chain */
    struct sw_req *prev, *next;         /* active list */
    struct sw_req *qnext;               /* wait queue */
} sw_req;

/* Per-request directives (the X-Spillway-* headers, or the body's
 * `spillway` object). max_queue_ms: 0 (the policy's) up to one day. */
#define SW_MAX_QUEUE_MS 86400000
/* "interactive" or "batch", in any case: SW_CLASS_INTERACTIVE or
 * SW_CLASS_BATCH; -1 for anything else. */
int sw_priority_parse(const char *s);

sw_req *sw_req_new(void);
sw_req *sw_req_ref(sw_req *r);
void sw_req_unref(sw_req *r);

#endif
