/* Gateway internals shared by its parts.
 *
 * Threads:
 *   - libmicrohttpd's pool threads run http.c: they parse and validate a
 *     request, encode the GenerateRequest, and hand a sw_req to the broker
 *     through the inbox (mutex + eventfd), then suspend the connection.
 *   - the broker thread (broker.c) owns every ZeroMQ socket, the worker
 *     registry's mutations, the route counters and the wait queue. It routes
 *     TokenChunks into the sw_req and resumes the connection.
 * A sw_req is shared by both sides: refcounted, its mutable fields guarded by
 * its own mutex. HTTP threads only read the registry (under reg.mu) for
 * /healthz, /v1/models, /metrics and /admin/workers.
 */
#ifndef SW_GW_H
#define SW_GW_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <microhttpd.h>
#include "proto/wire.h"
#include "gateway/policy.h"
#include "llm/chat.h"

#define SW_MAX_BODY (1u << 20)       /* larger request bodies get 413 */
#define SW_MAX_DISCARD (64ull << 20) /* up to this, an oversized body is read before the 413 */
#define SW_KEEPALIVE_MS 200          /* SSE comment while a stream waits */
#define SW_TICK_MS 50                /* broker housekeeping period */
#define SW_RETRY_AFTER_S 1

int64_t sw_now_ms(void);             /* CLOCK_MONOTONIC */
int64_t sw_now_ns(void);

struct sw_gateway;

/* ---- growable byte buffer ------------------------------------------------ */
typedef struct { char *data; size_t len, cap; } sw_buf;
void sw_buf_append(sw_buf *b, const char *s, size_t n);
void sw_buf_puts(sw_buf *b, const char *s);
void sw_buf_free(sw_buf *b);

/* ---- worker registry ------------------------------------------------------ */
typedef struct { char *name, *quant; uint32_t ctx; } sw_wmodel;

typedef struct sw_worker {
    uint8_t ident[256]; size_t ident_len;   /* ZeroMQ routing id */
    char id[SW_MAX_ID_LEN + 1];
    char *pool;
    int kind;                               /* Spillway__WorkerKind */
    sw_wmodel *models; size_t n_models;
    uint32_t slots;
    /* from heartbeats */
    uint32_t hb_active, hb_queued, hb_batch;
    float hb_kv;
    uint64_t hb_tokens;
    uint32_t inflight;                      /* requests we dispatched, not finished */
    uint64_t dispatched;                    /* requests we ever sent it (retries included) */
    int64_t last_seen_ms, last_sent_ms, registered_ms;
    struct sw_worker *next;
} sw_worker;

typedef struct {
    pthread_mutex_t mu;      /* broker writes under it; HTTP threads read under it */
    sw_worker *head;
    int n;
    uint64_t deaths;
} sw_registry;

void sw_registry_init(sw_registry *r);
sw_worker *sw_registry_find(sw_registry *r, const void *ident, size_t len);
sw_worker *sw_registry_find_id(sw_registry *r, const char *id);
/* Adds or updates from a Register message. Caller holds r->mu. */
sw_worker *sw_registry_upsert(sw_registry *r, const void *ident, size_t len,
                              const Spillway__Register *reg, int64_t now);
void sw_registry_remove(sw_registry *r, sw_worker *w);   /* caller holds mu; frees w */
bool sw_worker_serves(const sw_worker *w, const char *model, const char *quant);
bool sw_worker_alive(const sw_worker *w, int64_t now);
/* A worker among the live ones of `pool` (NULL = any) serving model/quant,
 * or NULL if none. prefix_key (sw_prefix_key; 0 = none) names the request's
 * prompt prefix: the worker that key hashes to is taken while it has a free
 * slot, so requests that share a prefix meet the worker's prefix cache.
 * Otherwise, and when that worker is full, power-of-two choices. */
sw_worker *sw_registry_pick(sw_registry *r, const char *pool, const char *model,
                            const char *quant, int64_t now, uint64_t prefix_key);
/* The routing key of a request's prompt prefix. Chat: the messages up to
 * and including the first user message (at most 1 KiB of them), which every
 * later turn of the conversation repeats. A prompt: its first 256 bytes (or
 * 64 token ids), typically its fixed preamble. Never 0. */
uint64_t sw_prefix_key(const Spillway__GenerateRequest *g);
int sw_registry_count(sw_registry *r, const char *pool, const char *model,
                      const char *quant, int64_t now);
/* JSON array of workers (caller frees); takes r->mu. */
char *sw_registry_json(sw_registry *r);
/* The status document (policy version, pools with load, workers) served by
 * GET /admin/status and to SDK clients. Caller frees. */
char *sw_status_json(struct sw_gateway *g);

/* ---- metrics -------------------------------------------------------------- */
typedef enum { SW_ST_OK, SW_ST_ERROR, SW_ST_CANCELLED, SW_ST_REJECTED, SW_ST__N } sw_status_label;
typedef enum { SW_LAT_DISPATCH, SW_LAT_RELAY, SW_LAT__N } sw_lat_stage;

void sw_metrics_init(void);
/* Pool label: pool names the policy knows, otherwise "other" (bounded). */
void sw_metrics_set_pools(const sw_policy *p);
void sw_metrics_request(const char *pool, sw_status_label st);
void sw_metrics_inflight(const char *pool, int delta);
/* A finished request's usage, as its worker reported it. */
void sw_metrics_tokens(const char *pool, uint32_t prompt, uint32_t cached, uint32_t completion);
void sw_metrics_queue(const char *pool, int delta);
void sw_metrics_overflow(const char *from, const char *to, const char *reason);
void sw_metrics_latency(sw_lat_stage stage, int64_t ns);
void sw_metrics_reload(bool ok);
char *sw_metrics_render(sw_registry *reg);   /* caller frees */

/* ---- routing -------------------------------------------------------------- */
/* In-flight count and recent error rate of one route, keyed by its identity
 * (model, quantization, target) so the numbers survive a policy reload.
 * Owned by the broker thread. */
typedef struct sw_route_stats {
    char *key;
    uint32_t inflight;
    float err_ewma;          /* exponentially weighted error rate */
    uint32_t samples;
    float service_ms;        /* EWMA of dispatch-to-finish time, for predicted waits */
    struct sw_route_stats *next;
} sw_route_stats;

typedef struct {
    const char *model;           /* after alias resolution */
    int klass;                   /* sw_request_class */
    uint32_t prompt_tokens;      /* estimate */
    const char *api_key, *tenant;
    const char *want_target, *want_quant;   /* per-request directives, NULL = any */
    const char *exclude_worker;  /* retry: avoid this worker id */
    uint64_t prefix_key;         /* sw_prefix_key of the prompt; 0 = none */
    int64_t budget_ms;           /* max_queue_ms directive: 0 = none */
} sw_route_request;

typedef enum { SW_DECIDE_DISPATCH, SW_DECIDE_QUEUE, SW_DECIDE_REJECT } sw_decide_kind;

typedef struct {
    sw_decide_kind kind;
    int http_status;             /* REJECT: 404, 503, ... */
    char message[256];
    const char *err_type, *err_code;
    sw_worker *worker;           /* DISPATCH */
    const char *pool;            /* DISPATCH: target pool; QUEUE: pool it waits for */
    sw_route_stats *stats;       /* DISPATCH: route counter (NULL: implicit route) */
    bool spilled;
    const char *spill_from, *spill_reason;
} sw_decision;

sw_route_stats *sw_route_stats_get(sw_route_stats **head, const sw_route *r);
void sw_route_stats_outcome(sw_route_stats *s, bool error);
void sw_route_stats_service(sw_route_stats *s, int64_t ms);
void sw_route_decide(const sw_policy *p, sw_registry *reg, sw_route_stats **stats,
                     const sw_route_request *rq, int64_t now, sw_decision *out);
/* True if the policy routes the model (after alias resolution). */
bool sw_policy_has_model(const sw_policy *p, const char *model);

/* ---- requests ------------------------------------------------------------- */
typedef enum { SW_PH_NEW, SW_PH_QUEUED, SW_PH_RUNNING, SW_PH_DONE } sw_phase;

typedef struct sw_req {
    int refs;                     /* atomic */
    pthread_mutex_t mu;
    char id[48];

    /* immutable once submitted */
    bool chat, stream, include_usage;
    bool logprobs;                /* the response carries log probabilities */
    char *model_asked, *model;    /* as asked; after alias resolution */
    uint8_t *gen; size_t gen_len; /* encoded Envelope{generate} */
    int klass;
    uint32_t prompt_tokens_est;
    uint64_t prefix_key;          /* sw_prefix_key: routes prompts that share a prefix together */
    char *api_key, *tenant, *want_target, *want_quant;
    int64_t max_queue_ms;         /* 0 = policy default */
    int64_t created_s;            /* unix time for the response */
    int64_t t_submit_ns;
    struct MHD_Connection *conn;
    int fd;

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
    sw_buf text;                  /* streaming: not yet relayed; else: all */
    sw_buf reasoning;             /* the same for a reasoning model's reasoning (chat only) */
    int64_t text_rx_ns;           /* when the oldest unrelayed text arrived */
    bool finished;
    int finish;                   /* Spillway__FinishReason */
    uint32_t usage_prompt, usage_completion, usage_cached;   /* cached: prompt tokens the worker reused */
    uint32_t usage_reasoning;     /* completion tokens that were reasoning */
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
    bool got_token;
    bool keepalive_due;
    int64_t last_write_ms;
    /* output staging for the content reader (MHD thread only) */
    sw_buf out; size_t out_off;
    int sse_stage;                /* 0 headers not yet, 1 role sent, 2 final sent, 3 done */

    /* SDK requests (no HTTP connection): answered over the SDK ROUTER */
    bool sdk;
    uint8_t sdk_ident[256]; size_t sdk_ident_len;
    char client_id[SW_MAX_ID_LEN + 1];   /* the id the SDK client chose */
    bool sdk_sent;                /* a chunk went out: failures are in-band now */
    bool sdk_gone;                /* the client's socket vanished */

    /* broker only */
    sw_worker *w;
    sw_route_stats *stats;
    int retries;
    int retry_status;                   /* the worker error that caused the retry, */
    char retry_error[256];              /* reported if no other worker can take it */
    int64_t dispatch_ms;
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

/* ---- the gateway ---------------------------------------------------------- */
typedef struct sw_gateway {
    const char *config_path;
    const char *workers_ep;
    const char *sdk_ep;          /* NULL = no SDK endpoint */
    bool sdk_ep_optional;        /* the default: failing to bind it is only a warning */
    pthread_mutex_t policy_mu;
    sw_policy *policy;           /* current; swap under policy_mu */
    pthread_mutex_t reload_mu;   /* serializes reloads */
    int64_t policy_mtime_ns;
    char last_reload_error[4096];

    sw_registry reg;
    int64_t started_ms;

    /* inbox: HTTP threads -> broker */
    pthread_mutex_t inbox_mu;
    struct sw_cmd *inbox_head, *inbox_tail;
    int inbox_fd;                /* eventfd */
    int stop;                    /* atomic */
    int reload_requested;        /* atomic; set on SIGHUP */
    pthread_t broker;
    void *zctx;
    struct MHD_Daemon *mhd;
} sw_gateway;

typedef enum { SW_CMD_SUBMIT, SW_CMD_CANCEL } sw_cmd_kind;
typedef struct sw_cmd { sw_cmd_kind kind; sw_req *req; struct sw_cmd *next; } sw_cmd;

extern sw_gateway *sw_gw;

sw_policy *sw_gw_policy(sw_gateway *g);      /* returns a reference */
/* Reloads the config file; on error keeps the old policy and fills err. */
int sw_gw_reload(sw_gateway *g, char *err, size_t errlen);

int sw_broker_start(sw_gateway *g, char *err, size_t errlen);
void sw_broker_stop(sw_gateway *g);
void sw_broker_post(sw_gateway *g, sw_cmd_kind kind, sw_req *req);  /* takes a ref */

int sw_http_start(sw_gateway *g, const char *host, int port, char *err, size_t errlen);
void sw_http_stop(sw_gateway *g);
/* Resumes a suspended connection; caller holds r->mu. */
void sw_req_wake(sw_req *r);

/* ---- OpenAI JSON (openai.c) ---------------------------------------------- */
/* Parses and validates a completions/chat body into r (fills the encoded
 * GenerateRequest). Returns 0, or an HTTP status with msg/param set. */
int sw_openai_parse(sw_req *r, const char *body, size_t len, bool chat,
                    const sw_policy *p, char *msg, size_t msglen, const char **param);
char *sw_openai_error_json(const char *message, const char *type, const char *param,
                           const char *code);
const char *sw_finish_name(int finish);
/* Non-streaming response body (r->mu held). */
char *sw_openai_response(sw_req *r);
/* Streaming: one SSE event for a text delta / the final chunk / usage. */
void sw_openai_sse_delta(sw_req *r, sw_buf *out, const char *text, size_t n, const char *reasoning, size_t rn,
                         bool role);
/* One delta event with the calls not relayed yet (n_calls_sent on). */
void sw_openai_sse_calls(sw_req *r, sw_buf *out);
/* A delta event for a request that asked for log probabilities: its text
 * and the entries not relayed yet (n_lps_sent on). */
void sw_openai_sse_delta_logprobs(sw_req *r, sw_buf *out, bool role);
void sw_openai_sse_final(sw_req *r, sw_buf *out);

#endif
