/* Token sampling: repetition penalty, temperature, top-k, top-p, min-p, with a
 * seeded generator so a (seed, logits) sequence always gives the same tokens.
 * temperature <= 0 is greedy (argmax, lowest id on ties). */
#ifndef SW_SAMPLER_H
#define SW_SAMPLER_H

#include <stdint.h>
#include <stdbool.h>

typedef struct {
    float temperature;        /* 0 = greedy */
    int32_t top_k;            /* 0 = off */
    float top_p;              /* 0 or >= 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 0 or 1 = off */
    float presence_penalty;   /* OpenAI's: subtracted once from each generated token's logit; 0 = off */
    float frequency_penalty;  /* ... and once for every time it was generated; 0 = off */
    const int32_t *bias_ids;  /* OpenAI's logit_bias: added to these tokens' raw logits */
    const float *bias;
    int32_t n_bias;
    int32_t repeat_last_n;    /* window for the penalty; 0 = default 64 */
    uint64_t seed;
} sw_sampling_params;

typedef struct {
    sw_sampling_params p;
    uint64_t rng[2];          /* xoroshiro128+ state */
    int32_t *recent;          /* ring of recent tokens for the penalty */
    int32_t n_recent, recent_cap, recent_head;
    /* logit_bias, copied (the params' arrays belong to the caller) */
    int32_t *bias_ids;
    float *bias;
    /* presence/frequency: how often each token was generated (sized to the
     * vocab on first use), and the distinct ones, to touch only those */
    int32_t *counts, *seen;
    int32_t n_seen, counts_cap;
    /* scratch, sized to the vocab on first use */
    struct sw_cand *cand;
    int32_t cand_cap;
} sw_sampler;

void sw_sampler_init(sw_sampler *s, const sw_sampling_params *p);
/* Whether p asks only for what a device sampler implements (temperature,
 * top-k, top-p, and a draw from the seed): true when every other field is
 * off (repetition, presence and frequency penalties, min-p, logit_bias).
 * This is the one place that knows which fields a device may skip: a new
 * field of sw_sampling_params is decided here (sampler.c checks the
 * struct's size so that it cannot be forgotten). */
bool sw_sampler_is_plain(const sw_sampling_params *p);
void sw_sampler_free(sw_sampler *s);
/* Records a token (prompt or generated) for the repetition penalty. */
void sw_sampler_accept(sw_sampler *s, int32_t token);
/* Records a generated token for the presence and frequency penalties
 * (which, as vLLM applies OpenAI's, count the output only). n_vocab bounds
 * the ids; false when out of memory. */
bool sw_sampler_generated(sw_sampler *s, int32_t token, int32_t n_vocab);
/* Picks the next token. `logits` may be modified (penalty, temperature). */
int32_t sw_sampler_sample(sw_sampler *s, float *logits, int32_t n_vocab);
int32_t sw_argmax(const float *x, int32_t n);
/* Log-softmax of logits[0..n) at `chosen`, returned; and the k likeliest
 * tokens (ids and log probabilities, likeliest first, ties to the lower id)
 * into top_ids/top_lps. */
float sw_logprobs(const float *logits, int32_t n, int32_t chosen, int k, int32_t *top_ids, float *top_lps);

#endif
