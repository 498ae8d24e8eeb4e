/* The --test-echo engine: a worker that does no compute.
 *
 * Each request gets max_tokens tokens (" tok1", " tok2", ...), one token per
 * chunk, paced at tokens_per_s per sequence, with up to n_slots sequences at
 * once and the rest queued. It exists so the gateway's routing, overflow,
 * cancellation and throughput can be tested and benchmarked at scale without
 * the cost of a model; it is never a substitute for the real engine.
 */
#include "worker-cpu/engine.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "llm/clock.h"

#define ECHO_DEFAULT_MAX_TOKENS 16   /* OpenAI's default for /v1/completions */
#define ECHO_MAX_QUEUE 65536

typedef struct echo_seq {
    char id[SW_MAX_ID_LEN + 1];
    uint32_t max_tokens, emitted, prompt_tokens;
    double next_due;                 /* monotonic seconds of the next token */
    struct echo_seq *next;           /* queue link */
} echo_seq;

struct sw_echo_engine {
    double interval;                 /* seconds per token per sequence */
    int n_slots, n_running;
    echo_seq **running;              /* n_slots entries, NULL = free */
    echo_seq *queue_head, *queue_tail;
    int n_queued;
    uint64_t tokens_generated;
    uint32_t last_batch;
    double fail_rate, fail_acc;      /* --test-fail-rate: injected 500s */
    /* load() runs on the link thread: it reads this snapshot, which the
     * compute thread refreshes after every submit/cancel/step. */
    pthread_mutex_t load_mu;
    sw_load snapshot;
};

static void publish_load(sw_echo_engine *e)
{
    pthread_mutex_lock(&e->load_mu);
    e->snapshot.active = (uint32_t)e->n_running;
    e->snapshot.queued = (uint32_t)e->n_queued;
    e->snapshot.slots = (uint32_t)e->n_slots;
    e->snapshot.batch_size = e->last_batch;
    e->snapshot.kv_utilization = (float)e->n_running / (float)e->n_slots;
    e->snapshot.tokens_generated = e->tokens_generated;
    pthread_mutex_unlock(&e->load_mu);
}

sw_echo_engine *sw_echo_engine_new(double tokens_per_s, int n_slots)
{
    if (!(tokens_per_s > 0) || !isfinite(tokens_per_s) || n_slots < 1) return NULL;
    sw_echo_engine *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->running = calloc((size_t)n_slots, sizeof *e->running);
    if (!e->running) {
        free(e);
        return NULL;
    }
    e->interval = 1.0 / tokens_per_s;
    e->n_slots = n_slots;
    pthread_mutex_init(&e->load_mu, NULL);
    publish_load(e);
    return e;
}

void sw_echo_engine_free(sw_echo_engine *e)
{
    if (!e) return;
    for (int i = 0; i < e->n_slots; i++) free(e->running[i]);
    for (echo_seq *s = e->queue_head, *n; s; s = n) {
        n = s->next;
        free(s);
    }
    pthread_mutex_destroy(&e->load_mu);
    free(e->running);
    free(e);
}

/* A rough token count for usage: whitespace-separated words. The echo engine
 * has no tokenizer, and the gateway only needs a plausible number. */
static uint32_t count_words(const char *s)
{
    uint32_t n = 0;
    int in_word = 0;
    for (; s && *s; s++) {
        int sp = isspace((unsigned char)*s);
        if (!sp && !in_word) n++;
        in_word = !sp;
    }
    return n;
}

static uint32_t estimate_prompt_tokens(const Spillway__GenerateRequest *req)
{
    if (req->n_prompt_tokens) return (uint32_t)req->n_prompt_tokens;
    uint32_t n = count_words(req->prompt);
    for (size_t i = 0; i < req->n_messages; i++) n += count_words(req->messages[i]->content);
    return n ? n : 1;
}

void sw_echo_engine_set_fail_rate(sw_echo_engine *e, double rate)
{
    e->fail_rate = rate < 0 ? 0 : rate > 1 ? 1 : rate;
}

static int echo_submit(void *eng, const Spillway__GenerateRequest *req, char *err, size_t errlen)
{
    sw_echo_engine *e = eng;
    /* Accumulating the rate spreads failures evenly and deterministically. */
    e->fail_acc += e->fail_rate;
    if (e->fail_acc >= 1.0) {
        e->fail_acc -= 1.0;
        snprintf(err, errlen, "test mode: injected failure (--test-fail-rate %g)", e->fail_rate);
        return 500;
    }
    if (e->n_queued >= ECHO_MAX_QUEUE) {
        snprintf(err, errlen, "echo engine queue is full (%d requests)", e->n_queued);
        return 503;
    }
    echo_seq *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return 500;
    }
    snprintf(s->id, sizeof s->id, "%s", req->request_id);
    s->max_tokens = req->max_tokens ? req->max_tokens : ECHO_DEFAULT_MAX_TOKENS;
    s->prompt_tokens = estimate_prompt_tokens(req);
    if (e->queue_tail) e->queue_tail->next = s;
    else e->queue_head = s;
    e->queue_tail = s;
    e->n_queued++;
    publish_load(e);
    return 0;
}

static void echo_cancel(void *eng, const char *request_id)
{
    sw_echo_engine *e = eng;
    for (int i = 0; i < e->n_slots; i++) {
        if (e->running[i] && strcmp(e->running[i]->id, request_id) == 0) {
            free(e->running[i]);
            e->running[i] = NULL;
            e->n_running--;
            publish_load(e);
            return;
        }
    }
    for (echo_seq *prev = NULL, *s = e->queue_head; s; prev = s, s = s->next) {
        if (strcmp(s->id, request_id) != 0) continue;
        if (prev) prev->next = s->next;
        else e->queue_head = s->next;
        if (e->queue_tail == s) e->queue_tail = prev;
        free(s);
        e->n_queued--;
        publish_load(e);
        return;
    }
}

static double earliest_due(const sw_echo_engine *e)
{
    double next = INFINITY;
    for (int i = 0; i < e->n_slots; i++)
        if (e->running[i] && e->running[i]->next_due < next) next = e->running[i]->next_due;
    return next;
}

/* Moves queued requests into free slots; their first token is one interval away. */
static void admit(sw_echo_engine *e, double now)
{
    for (int i = 0; i < e->n_slots && e->queue_head; i++) {
        if (e->running[i]) continue;
        echo_seq *s = e->queue_head;
        e->queue_head = s->next;
        if (!e->queue_head) e->queue_tail = NULL;
        s->next = NULL;
        s->next_due = now + e->interval;
        e->running[i] = s;
        e->n_running++;
        e->n_queued--;
    }
}

static int echo_step(void *eng, sw_emit_fn emit, sw_fail_fn fail, void *ctx)
{
    (void)fail;
    sw_echo_engine *e = eng;
    double now = sw_clock_s();
    admit(e, now);
    /* idle_ms() has whole-millisecond resolution: a token due within the
     * next millisecond is waited for here, precisely, rather than a whole
     * millisecond late (which would add latency to every short request at
     * high rates). */
    double next = earliest_due(e);
    if (next > now && next - now < 1e-3) {
        struct timespec ts = {0, (long)((next - now) * 1e9)};
        nanosleep(&ts, NULL);
        now = sw_clock_s();
    }
    uint32_t batch = 0;
    for (int i = 0; i < e->n_slots; i++) {
        echo_seq *s = e->running[i];
        if (!s) continue;
        int emitted_now = 0;
        /* Catch up on every token that is due, so the rate holds even when a
         * step comes late; still one token per chunk. */
        while (s->emitted < s->max_tokens && now >= s->next_due) {
            char text[32];
            uint32_t id = ++s->emitted;
            snprintf(text, sizeof text, " tok%u", id);
            int last = s->emitted == s->max_tokens;
            emit(ctx, s->id, &(sw_out){ .text = text }, &id, 1,
                 last ? SW_FINISH_LENGTH : SW_FINISH_NONE,
                 &(sw_usage){ .prompt_tokens = s->prompt_tokens, .completion_tokens = s->emitted });
            e->tokens_generated++;
            s->next_due += e->interval;
            emitted_now = 1;
        }
        batch += (uint32_t)emitted_now;
        if (s->emitted >= s->max_tokens) {
            free(s);
            e->running[i] = NULL;
            e->n_running--;
        }
    }
    if (batch) e->last_batch = batch;
    admit(e, now);
    publish_load(e);
    return e->n_running + e->n_queued;
}

static void echo_load(void *eng, sw_load *out)
{
    sw_echo_engine *e = eng;
    pthread_mutex_lock(&e->load_mu);
    *out = e->snapshot;
    pthread_mutex_unlock(&e->load_mu);
}

/* Whole milliseconds until the next token is due, rounded down (step()
 * waits out the fraction). */
static int echo_idle_ms(void *eng)
{
    sw_echo_engine *e = eng;
    if (e->queue_head && e->n_running < e->n_slots) return 0;
    double next = earliest_due(e);
    if (next == INFINITY) return 1000;
    double ms = floor((next - sw_clock_s()) * 1000.0);
    return ms <= 0 ? 0 : ms > 1000 ? 1000 : (int)ms;
}

const sw_engine_ops sw_echo_engine_ops = {
    .submit = echo_submit,
    .cancel = echo_cancel,
    .step = echo_step,
    .load = echo_load,
    .idle_ms = echo_idle_ms,
};
