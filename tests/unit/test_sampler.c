/* Sampler tests: greedy, determinism per seed, top-k / top-p / min-p
 * filtering, the repetition penalty, and the empirical distribution at
 * temperature 1 against the softmax (chi-square bound, fixed seed). */
#include "tests/unit/check.h"
#include "llm/sampler.h"

#include <math.h>
#include <stdint.h>

static sw_sampling_params params(float temp, int32_t top_k, float top_p, float min_p, uint64_t seed)
{
    sw_sampling_params p = { 0 };
    p.temperature = temp; p.top_k = top_k; p.top_p = top_p; p.min_p = min_p; p.seed = seed;
    return p;
}

/* Deterministic pseudo-random logits (an LCG, independent of the sampler's RNG). */
static void fill_logits(float *x, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 8) % 20000) / 1000.0f - 10.0f;
    }
}

static int32_t sample_copy(sw_sampler *s, const float *logits, int n)
{
    float tmp[4096];
    memcpy(tmp, logits, (size_t)n * sizeof *tmp);
    return sw_sampler_sample(s, tmp, n);
}

static void test_greedy(void)
{
    float x[] = { 0.5f, 3.0f, -1.0f, 3.0f, 2.9f };
    CHECK(sw_argmax(x, 5) == 1, "argmax takes the lowest id on ties");
    float nanfirst[] = { NAN, 1.0f, 2.0f };
    CHECK(sw_argmax(nanfirst, 3) == 2, "NaN is skipped");
    sw_sampling_params p = params(0.0f, 0, 0, 0, 1);
    sw_sampler s;
    sw_sampler_init(&s, &p);
    float big[4096];
    for (int r = 0; r < 20; r++) {
        fill_logits(big, 4096, (uint32_t)r);
        CHECK(sample_copy(&s, big, 4096) == sw_argmax(big, 4096), "greedy != argmax (round %d)", r);
    }
    CHECK(sw_sampler_sample(&s, x, 5) == 1, "greedy tie");
    CHECK(sw_sampler_sample(&s, NULL, 5) == -1 && sw_sampler_sample(&s, x, 0) == -1, "bad input");
    sw_sampler_free(&s);
    /* Negative temperature is greedy too. */
    p.temperature = -1.0f;
    sw_sampler_init(&s, &p);
    CHECK(sample_copy(&s, x, 5) == 1, "negative temperature");
    sw_sampler_free(&s);
}

static void test_seed_determinism(void)
{
    float logits[1000];
    fill_logits(logits, 1000, 7);
    for (int i = 0; i < 1000; i++) logits[i] *= 0.3f;   /* flatter: many tokens in play */
    int32_t a[200], b[200], c[200];
    uint64_t seeds[3] = { 42, 42, 43 };
    int32_t *outs[3] = { a, b, c };
    for (int k = 0; k < 3; k++) {
        sw_sampling_params p = params(0.9f, 50, 0.95f, 0.01f, seeds[k]);
        sw_sampler s;
        sw_sampler_init(&s, &p);
        for (int i = 0; i < 200; i++) outs[k][i] = sample_copy(&s, logits, 1000);
        sw_sampler_free(&s);
    }
    CHECK(memcmp(a, b, sizeof a) == 0, "same seed, different sequences");
    CHECK(memcmp(a, c, sizeof a) != 0, "different seeds, same sequence");
    int distinct = 0;
    for (int i = 0; i < 200; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= a[j] == a[i];
        distinct += !seen;
    }
    CHECK(distinct > 5, "sampling is not exploring (%d distinct tokens)", distinct);
}

static void test_top_k(void)
{
    float logits[4096];
    sw_sampler s;
    for (int r = 0; r < 10; r++) {
        fill_logits(logits, 4096, 100u + (uint32_t)r);
        int32_t best = sw_argmax(logits, 4096);
        sw_sampling_params p = params(1.5f, 1, 0, 0, (uint64_t)r);
        sw_sampler_init(&s, &p);
        for (int i = 0; i < 20; i++) CHECK(sample_copy(&s, logits, 4096) == best, "top_k=1 != greedy");
        sw_sampler_free(&s);
        p = params(1.5f, 0, 1e-6f, 0, (uint64_t)r);
        sw_sampler_init(&s, &p);
        for (int i = 0; i < 20; i++) CHECK(sample_copy(&s, logits, 4096) == best, "tiny top_p != argmax");
        sw_sampler_free(&s);
    }
    /* top_k=1 resolves ties like greedy (lowest id). */
    float tie[] = { 1.0f, 5.0f, 5.0f, 0.0f };
    sw_sampling_params p = params(1.0f, 1, 0, 0, 3);
    sw_sampler_init(&s, &p);
    for (int i = 0; i < 10; i++) CHECK(sample_copy(&s, tie, 4) == 1, "top_k=1 tie");
    sw_sampler_free(&s);

    /* top_k=3 only ever returns the 3 best of 4096. */
    fill_logits(logits, 4096, 999);
    float sorted[4096];
    memcpy(sorted, logits, sizeof sorted);
    float third = -INFINITY;
    for (int k = 0; k < 3; k++) {
        int32_t m = sw_argmax(sorted, 4096);
        third = sorted[m];
        sorted[m] = -INFINITY;
    }
    p = params(100.0f, 3, 0, 0, 5);   /* hot: without top_k anything could come */
    sw_sampler_init(&s, &p);
    for (int i = 0; i < 300; i++) {
        int32_t t = sample_copy(&s, logits, 4096);
        CHECK(logits[t] >= third, "top_k=3 returned token %d outside the top 3", t);
    }
    sw_sampler_free(&s);

    /* Large top_k (the quickselect path) with NaN logits present. */
    fill_logits(logits, 4096, 4242);
    logits[17] = NAN;
    memcpy(sorted, logits, sizeof sorted);
    sorted[17] = -INFINITY;
    float kth = 0;
    for (int k = 0; k < 2000; k++) {
        int32_t m = sw_argmax(sorted, 4096);
        kth = sorted[m];
        sorted[m] = -INFINITY;
    }
    p = params(1000.0f, 2000, 0, 0, 6);
    sw_sampler_init(&s, &p);
    int outside = 0;
    for (int i = 0; i < 500; i++) {
        int32_t t = sample_copy(&s, logits, 4096);
        outside += t == 17 || !(logits[t] >= kth);
    }
    CHECK(outside == 0, "top_k=2000: %d draws outside the top 2000", outside);
    sw_sampler_free(&s);
}

static void test_nucleus(void)
{
    float logits[4096], sorted[4096];
    sw_sampler s;
    sw_sampling_params p;
    /* top_p without top_k on random logits: every draw lies in the nucleus
     * computed here by a full sort. */
    for (int r = 0; r < 4; r++) {
        fill_logits(logits, 4096, 500u + (uint32_t)r);
        float tp = r < 2 ? 0.5f : 0.9f;
        double z = 0, mx = -INFINITY;
        for (int i = 0; i < 4096; i++) if (logits[i] > mx) mx = logits[i];
        for (int i = 0; i < 4096; i++) z += exp(logits[i] - mx);
        memcpy(sorted, logits, sizeof sorted);
        double cum = 0, cut = 0;
        while (cum < tp * z) {
            int32_t m = sw_argmax(sorted, 4096);
            cut = sorted[m];
            cum += exp(sorted[m] - mx);
            sorted[m] = -INFINITY;
        }
        p = params(1.0f, 0, tp, 0, 7u + (uint64_t)r);
        sw_sampler_init(&s, &p);
        int out_n = 0;
        for (int i = 0; i < 300; i++) out_n += !(logits[sample_copy(&s, logits, 4096)] >= cut);
        CHECK(out_n == 0, "top_p=%.1f: %d draws outside the nucleus", tp, out_n);
        sw_sampler_free(&s);
    }

    /* min_p: probabilities 0.5, 0.3, 0.15, 0.05 (log-space). min_p = 0.2 keeps
     * tokens with p >= 0.1: ids 0, 1, 2; never 3 even when hot. */
    float mp[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) };
    p = params(1.0f, 0, 0, 0.2f, 11);
    sw_sampler_init(&s, &p);
    int counts[4] = { 0 };
    for (int i = 0; i < 4000; i++) counts[sample_copy(&s, mp, 4)]++;
    CHECK(counts[3] == 0 && counts[2] > 0 && counts[1] > 0 && counts[0] > 0,
          "min_p counts %d %d %d %d", counts[0], counts[1], counts[2], counts[3]);
    sw_sampler_free(&s);
    /* top_p = 0.7 over the same: cumulative 0.5, 0.8 -> keeps ids 0 and 1 only. */
    p = params(1.0f, 0, 0.7f, 0, 12);
    sw_sampler_init(&s, &p);
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < 4000; i++) counts[sample_copy(&s, mp, 4)]++;
    CHECK(counts[2] == 0 && counts[3] == 0 && counts[0] > counts[1] && counts[1] > 0,
          "top_p counts %d %d %d %d", counts[0], counts[1], counts[2], counts[3]);
    sw_sampler_free(&s);

    /* top_p over a large vocabulary without top_k (the growing-prefix path):
     * 300 tokens share the mass evenly, the rest are negligible. */
    static float wide[100000];
    for (int i = 0; i < 100000; i++) wide[i] = (i % 331 == 0) ? 10.0f : -20.0f;
    p = params(1.0f, 0, 0.5f, 0, 13);
    sw_sampler_init(&s, &p);
    int bad = 0;
    for (int i = 0; i < 200; i++) {
        float *tmp = malloc(sizeof wide);
        memcpy(tmp, wide, sizeof wide);
        int32_t t = sw_sampler_sample(&s, tmp, 100000);
        free(tmp);
        /* Half the mass = the 151 lowest-id peaks (ties break by id). */
        if (t % 331 != 0 || t / 331 > 151) bad++;
    }
    CHECK(bad == 0, "wide top_p: %d draws outside the nucleus", bad);
    sw_sampler_free(&s);
}

/* Plain sampling is what a device sampler implements: temperature, top-k,
 * top-p and the seed; each other field, set, makes it not plain. */
static void test_is_plain(void)
{
    sw_sampling_params p = params(0.8f, 40, 0.9f, 0, 5);
    CHECK(sw_sampler_is_plain(&p), "temperature, top_k, top_p, seed are plain");
    p.repetition_penalty = 1.0f;
    p.repeat_last_n = 128;
    CHECK(sw_sampler_is_plain(&p), "a repetition penalty of 1 is off");
    int32_t id = 3;
    float b = 1.0f;
    sw_sampling_params not_plain[5] = { p, p, p, p, p };
    not_plain[0].repetition_penalty = 1.1f;
    not_plain[1].min_p = 0.05f;
    not_plain[2].presence_penalty = 0.5f;
    not_plain[3].frequency_penalty = -0.5f;
    not_plain[4].bias_ids = &id, not_plain[4].bias = &b, not_plain[4].n_bias = 1;
    for (int i = 0; i < 5; i++) CHECK(!sw_sampler_is_plain(&not_plain[i]), "field %d set is not plain", i);
}

static void test_penalty(void)
{
    /* Token 0 leads 2.0 vs 1.8; after it was seen, 2.0/1.3 < 1.8 so token 1 wins.
     * A negative logit is multiplied: -1 -> -1.3. */
    float x[3] = { 2.0f, 1.8f, -1.0f };
    sw_sampling_params p = params(0.0f, 0, 0, 0, 1);
    p.repetition_penalty = 1.3f;
    p.repeat_last_n = 4;
    sw_sampler s;
    sw_sampler_init(&s, &p);
    CHECK(sample_copy(&s, x, 3) == 0, "no history: argmax");
    sw_sampler_accept(&s, 0);
    sw_sampler_accept(&s, 0);   /* repeats are penalised once, not per occurrence */
    sw_sampler_accept(&s, 2);
    float y[3] = { 2.0f, 1.8f, -1.0f };
    CHECK(sw_sampler_sample(&s, y, 3) == 1, "penalty should move the argmax");
    CHECK(fabsf(y[0] - 2.0f / 1.3f) < 1e-6f && fabsf(y[2] + 1.3f) < 1e-6f && y[1] == 1.8f,
          "penalised logits %f %f %f", y[0], y[1], y[2]);
    /* The window is 4: after four other tokens, 0 is no longer penalised. */
    for (int i = 0; i < 4; i++) sw_sampler_accept(&s, 1);
    CHECK(sample_copy(&s, x, 3) == 0, "token left the window");
    sw_sampler_accept(&s, 123456);   /* outside the vocab: ignored, no crash */
    CHECK(sample_copy(&s, x, 3) == 0, "out-of-range history token");
    sw_sampler_free(&s);
}

static void test_distribution(void)
{
    /* At temperature 1 with no filters, draw frequencies follow the softmax. */
    float logits[8] = { 1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -1.0f, 0.2f, 1.5f };
    double pr[8], z = 0;
    for (int i = 0; i < 8; i++) z += pr[i] = exp(logits[i]);
    for (int i = 0; i < 8; i++) pr[i] /= z;
    sw_sampling_params p = params(1.0f, 0, 0, 0, 2024);
    sw_sampler s;
    sw_sampler_init(&s, &p);
    int counts[8] = { 0 };
    const int N = 100000;
    for (int i = 0; i < N; i++) counts[sample_copy(&s, logits, 8)]++;
    sw_sampler_free(&s);
    double chi2 = 0;
    for (int i = 0; i < 8; i++) {
        double e = N * pr[i];
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    /* 7 degrees of freedom: P(chi2 > 24.3) = 0.001. */
    CHECK(chi2 < 24.3, "chi-square %.2f too large", chi2);

    /* Temperature 0.5 sharpens: frequencies follow softmax(logits / 0.5). */
    p = params(0.5f, 0, 0, 0, 77);
    sw_sampler_init(&s, &p);
    memset(counts, 0, sizeof counts);
    z = 0;
    for (int i = 0; i < 8; i++) z += pr[i] = exp(logits[i] / 0.5);
    for (int i = 0; i < 8; i++) pr[i] /= z;
    for (int i = 0; i < N; i++) counts[sample_copy(&s, logits, 8)]++;
    sw_sampler_free(&s);
    chi2 = 0;
    for (int i = 0; i < 8; i++) {
        double e = N * pr[i];
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    CHECK(chi2 < 24.3, "chi-square at T=0.5: %.2f", chi2);
}

/* sw_logprobs against a double-precision log-softmax: the chosen token's
 * value, the k best in order with ties to the lower id, k above n. */
static void test_logprobs(void)
{
    float x[3000];
    fill_logits(x, 3000, 7);
    x[100] = x[2000] = 30.0f;   /* a tie at the top: the lower id first */
    x[5] = -1e30f;              /* all but impossible */
    double mx = 30.0, z = 0;
    for (int i = 0; i < 3000; i++) z += exp((double)x[i] - mx);
    double lse = mx + log(z);
    int32_t ids[20];
    float lps[20];
    float c = sw_logprobs(x, 3000, 17, 20, ids, lps);
    CHECK(fabs(c - (x[17] - lse)) < 1e-4, "chosen %g want %g", (double)c, x[17] - lse);
    CHECK(ids[0] == 100 && ids[1] == 2000 && fabs(lps[0] - (30.0 - lse)) < 1e-4, "the tie: %d %d", ids[0], ids[1]);
    bool sorted = true, best = true;
    for (int j = 1; j < 20; j++) sorted &= lps[j - 1] >= lps[j];
    for (int i = 0; i < 3000; i++) {   /* nothing outside the 20 beats the 20th */
        bool in = false;
        for (int j = 0; j < 20; j++) in |= ids[j] == i;
        if (!in && x[i] - lse > lps[19]) best = false;
    }
    CHECK(sorted && best, "the 20 best, best first");
    CHECK(sw_logprobs(x, 3000, 5, 0, ids, lps) < -1e29f, "an all but impossible token");
    float tiny[3] = { 1.0f, 2.0f, 3.0f };
    float l1 = sw_logprobs(tiny, 3, 2, 20, ids, lps);
    CHECK(ids[0] == 2 && ids[1] == 1 && ids[2] == 0 && fabsf(l1 - lps[0]) < 1e-7f &&
          fabs(exp(lps[0]) + exp(lps[1]) + exp(lps[2]) - 1.0) < 1e-6, "k above n: the n tokens, summing to 1");
}

/* OpenAI's presence and frequency penalties: over generated tokens only,
 * once per token (presence) and once per occurrence (frequency). */
static void test_presence_frequency(void)
{
    const float base[4] = { 3.0f, 2.0f, 1.0f, 0.5f };
    float x[4];
    sw_sampling_params p = params(0, 0, 0, 0, 1);
    p.presence_penalty = 1.5f;
    sw_sampler s;
    sw_sampler_init(&s, &p);
    sw_sampler_accept(&s, 0);   /* the prompt's: not counted */
    memcpy(x, base, sizeof x);
    CHECK(sw_sampler_sample(&s, x, 4) == 0, "the prompt's tokens are not penalized");
    CHECK(sw_sampler_generated(&s, 0, 4));
    memcpy(x, base, sizeof x);
    CHECK(sw_sampler_sample(&s, x, 4) == 1 && x[0] == 1.5f, "presence: 3 - 1.5 < 2 (got %g)", (double)x[0]);
    CHECK(sw_sampler_generated(&s, 0, 4));   /* twice: presence is still once */
    memcpy(x, base, sizeof x);
    sw_sampler_sample(&s, x, 4);
    CHECK(x[0] == 1.5f, "presence counts once: %g", (double)x[0]);
    sw_sampler_free(&s);
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.75f;
    sw_sampler_init(&s, &p);
    for (int i = 0; i < 3; i++) CHECK(sw_sampler_generated(&s, 0, 4));
    CHECK(sw_sampler_generated(&s, 1, 4) && sw_sampler_generated(&s, 9, 4), "an id past the vocabulary is ignored");
    memcpy(x, base, sizeof x);
    int32_t t = sw_sampler_sample(&s, x, 4);
    CHECK(t == 1 && x[0] == 0.75f && x[1] == 1.25f && x[2] == 1.0f, "frequency: %g %g %g -> %d", (double)x[0],
          (double)x[1], (double)x[2], t);
    sw_sampler_free(&s);
}

/* logit_bias: added to the raw logits; the sampler keeps its own copy. */
static void test_logit_bias(void)
{
    int32_t ids[2] = { 3, 0 };
    float bias[2] = { 10.0f, -5.0f };
    sw_sampling_params p = params(0, 0, 0, 0, 1);
    p.bias_ids = ids; p.bias = bias; p.n_bias = 2;
    sw_sampler s;
    sw_sampler_init(&s, &p);
    ids[0] = 1; bias[0] = 0;     /* the caller's arrays may go */
    float x[4] = { 3.0f, 2.0f, 1.0f, 0.5f };
    CHECK(sw_sampler_sample(&s, x, 4) == 3 && x[3] == 10.5f && x[0] == -2.0f, "biased: %g %g", (double)x[3], (double)x[0]);
    sw_sampler_free(&s);
}

int main(void)
{
    test_logit_bias();
    test_presence_frequency();
    test_logprobs();
    test_greedy();
    test_seed_determinism();
    test_top_k();
    test_nucleus();
    test_is_plain();
    test_penalty();
    test_distribution();
    CHECK_DONE();
}
