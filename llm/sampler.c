/* Token sampling.
 *
 * Order (as llama.cpp's default chain): repetition penalty -> greedy exit when
 * temperature <= 0 -> top-k -> top-p -> min-p -> temperature -> draw.
 * The filters look at the untempered distribution; temperature only reshapes
 * what survives them.
 *
 * For large vocabularies nothing sorts the whole logit array: top-k keeps a
 * k-heap (or quickselects for large k) and sorts only the k survivors; top-p
 * without top-k buckets by logit and sorts only the bucket where it cuts.
 */
#include "llm/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "llm/util.h"

struct sw_cand { int32_t id; float logit; float w; };

#define DEFAULT_REPEAT_LAST_N 64
#define MAX_REPEAT_LAST_N (1 << 20)

/* ---- RNG: splitmix64 seeds xoroshiro128+ ---- */

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(sw_sampler *s)
{
    uint64_t s0 = s->rng[0], s1 = s->rng[1], r = s0 + s1;
    s1 ^= s0;
    s->rng[0] = rotl(s0, 24) ^ s1 ^ (s1 << 16);
    s->rng[1] = rotl(s1, 37);
    return r;
}

/* Uniform in [0, 1). */
static double next_unit(sw_sampler *s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }

#if defined(__x86_64__) || defined(__aarch64__)
/* A new sampling field changes this size: decide in sw_sampler_is_plain
 * whether a device sampler may ignore it, then update the number. */
_Static_assert(sizeof(sw_sampling_params) == 64, "sw_sampling_params changed: see sw_sampler_is_plain");
#endif

bool sw_sampler_is_plain(const sw_sampling_params *p)
{
    /* repeat_last_n only sizes the repetition penalty's window */
    return (p->repetition_penalty == 0.0f || p->repetition_penalty == 1.0f) && p->min_p <= 0.0f &&
           p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f && p->n_bias == 0;
}

void sw_sampler_init(sw_sampler *s, const sw_sampling_params *p)
{
    memset(s, 0, sizeof *s);
    if (p) s->p = *p;
    uint64_t x = s->p.seed;
    s->rng[0] = sw_splitmix64(&x);
    s->rng[1] = sw_splitmix64(&x);
    if (!s->rng[0] && !s->rng[1]) s->rng[1] = 1;   /* the all-zero state is a fixed point */
    int32_t n = s->p.repeat_last_n;
    if (n <= 0) n = DEFAULT_REPEAT_LAST_N;
    if (n > MAX_REPEAT_LAST_N) n = MAX_REPEAT_LAST_N;
    /* Twice the window: the second half is scratch for de-duplicating. */
    s->recent = malloc(2 * (size_t)n * sizeof *s->recent);
    s->recent_cap = s->recent ? n : 0;
    if (s->p.n_bias > 0) {
        s->bias_ids = malloc((size_t)s->p.n_bias * sizeof *s->bias_ids);
        s->bias = malloc((size_t)s->p.n_bias * sizeof *s->bias);
        if (s->bias_ids && s->bias) {
            memcpy(s->bias_ids, s->p.bias_ids, (size_t)s->p.n_bias * sizeof *s->bias_ids);
            memcpy(s->bias, s->p.bias, (size_t)s->p.n_bias * sizeof *s->bias);
        } else {
            s->p.n_bias = 0;
        }
    }
    s->p.bias_ids = s->bias_ids;
    s->p.bias = s->bias;
}

void sw_sampler_free(sw_sampler *s)
{
    free(s->recent);
    free(s->bias_ids);
    free(s->bias);
    free(s->counts);
    free(s->seen);
    free(s->cand);
    memset(s, 0, sizeof *s);
}

void sw_sampler_accept(sw_sampler *s, int32_t token)
{
    if (s->recent_cap == 0) return;
    s->recent[s->recent_head] = token;
    s->recent_head = (s->recent_head + 1) % s->recent_cap;
    if (s->n_recent < s->recent_cap) s->n_recent++;
}

bool sw_sampler_generated(sw_sampler *s, int32_t token, int32_t n_vocab)
{
    if ((s->p.presence_penalty == 0.0f && s->p.frequency_penalty == 0.0f) || token < 0 || token >= n_vocab) return true;
    if (!s->counts) {
        s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
        s->seen = malloc((size_t)n_vocab * sizeof *s->seen);
        if (!s->counts || !s->seen) return false;
        s->counts_cap = n_vocab;
    }
    if (token >= s->counts_cap) return true;
    if (s->counts[token]++ == 0) s->seen[s->n_seen++] = token;
    return true;
}

int32_t sw_argmax(const float *x, int32_t n)
{
    int32_t best = 0;
    bool found = false;
    for (int32_t i = 0; i < n; i++) {
        if (isnan(x[i])) continue;
        if (!found || x[i] > x[best]) { best = i; found = true; }   /* strict: lowest id wins ties */
    }
    return best;
}

static int cmp_int(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* llama-style penalty: each distinct recent token once, positive logits
 * divided, negative ones multiplied, so the token always becomes less likely. */
static void apply_penalty(sw_sampler *s, float *logits, int32_t n_vocab)
{
    float pen = s->p.repetition_penalty;
    if (!(pen > 0.0f) || pen == 1.0f || s->n_recent == 0) return;
    int32_t *tmp = s->recent + s->recent_cap;
    memcpy(tmp, s->recent, (size_t)s->n_recent * sizeof *tmp);
    qsort(tmp, (size_t)s->n_recent, sizeof *tmp, cmp_int);
    for (int32_t i = 0; i < s->n_recent; i++) {
        int32_t t = tmp[i];
        if ((i > 0 && tmp[i - 1] == t) || t < 0 || t >= n_vocab) continue;
        logits[t] = logits[t] > 0.0f ? logits[t] / pen : logits[t] * pen;
    }
}

/* OpenAI's: logit -= frequency * count + presence * (count > 0), over the
 * tokens generated so far. */
static void apply_presence(sw_sampler *s, float *logits, int32_t n_vocab)
{
    for (int32_t i = 0; i < s->n_seen; i++) {
        int32_t t = s->seen[i];
        if (t < n_vocab) logits[t] -= s->p.frequency_penalty * (float)s->counts[t] + s->p.presence_penalty;
    }
}

/* NaN counts as -inf; +inf as the largest float, so softmax stays finite. */
static float clean_logit(float x) { return isnan(x) ? -INFINITY : x == INFINITY ? FLT_MAX : x; }

/* Strict total order: higher logit first, then lower id. */
static bool better(const struct sw_cand *a, const struct sw_cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *a, const void *b)
{
    const struct sw_cand *x = a, *y = b;
    return better(x, y) ? -1 : better(y, x) ? 1 : 0;
}

static void swap_cand(struct sw_cand *c, int32_t i, int32_t j)
{
    struct sw_cand t = c[i]; c[i] = c[j]; c[j] = t;
}

/* Quickselect: moves the k best of c[0..n) to c[0..k), in no particular order. */
static void select_top(struct sw_cand *c, int32_t n, int32_t k)
{
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;          /* median of three -> pivot at hi */
        if (better(&c[mid], &c[lo])) swap_cand(c, lo, mid);
        if (better(&c[hi], &c[lo])) swap_cand(c, lo, hi);
        if (better(&c[hi], &c[mid])) swap_cand(c, mid, hi);
        swap_cand(c, mid, hi);
        struct sw_cand pivot = c[hi];
        int32_t store = lo;
        for (int32_t i = lo; i < hi; i++)
            if (better(&c[i], &pivot)) swap_cand(c, i, store++);
        swap_cand(c, store, hi);
        if (store == k || store == k - 1) return;
        if (store < k) lo = store + 1;
        else hi = store - 1;
    }
}

/* Restores the worst-at-root heap property below position i. */
static void sift_worst(struct sw_cand *h, int32_t n, int32_t i)
{
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && better(&h[c], &h[c + 1])) c++;     /* the worse child */
        if (!better(&h[i], &h[c])) return;
        swap_cand(h, i, c);
        i = c;
    }
}

/* The k best logits into c[0..k), sorted best-first. Small k: one pass with a
 * k-heap whose root is the worst kept (most tokens fail one compare with it);
 * large k: quickselect. NaN logits count as -inf. */
static void top_k_sorted(struct sw_cand *c, const float *logits, int32_t n, int32_t k)
{
    if (k <= 1024) {
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++) {
            struct sw_cand x = { i, clean_logit(logits[i]), 0 };
            if (m < k) {
                int32_t j = m++;
                c[j] = x;
                while (j > 0 && better(&c[(j - 1) / 2], &c[j])) { swap_cand(c, j, (j - 1) / 2); j = (j - 1) / 2; }
            } else if (better(&x, &c[0])) {
                c[0] = x;
                sift_worst(c, k, 0);
            }
        }
    } else {
        for (int32_t i = 0; i < n; i++) c[i] = (struct sw_cand){ i, clean_logit(logits[i]), 0 };
        select_top(c, n, k);
    }
    qsort(c, (size_t)k, sizeof *c, cmp_cand);
}

#define NBUCKET 512
#define BUCKETS_PER_NAT 16.0f

/* Bucket by distance from the max logit, 1/16 nat wide; the last catches the tail. */
static int32_t bucket_of(float maxl, float logit)
{
    float d = (maxl - logit) * BUCKETS_PER_NAT;
    return d < (float)(NBUCKET - 1) ? (int32_t)d : NBUCKET - 1;
}

/* Keeps the smallest best-first set of candidates whose probability reaches
 * top_p; returns the new count. Sorted input: a prefix. Unsorted input: no
 * full sort - candidates are bucketed by logit, every bucket before the one
 * where the cumulative mass crosses top_p is kept whole, and only that
 * bucket is sorted to find the exact cut. */
static int32_t apply_top_p(struct sw_cand *c, int32_t n, bool sorted, float maxl, float top_p)
{
    double z = 0;
    for (int32_t i = 0; i < n; i++) z += c[i].w = expf(c[i].logit - maxl);
    double want = (double)top_p * z, cum = 0;
    if (sorted) {
        for (int32_t i = 0; i < n; i++) if ((cum += c[i].w) >= want) return i + 1;
        return n;
    }
    double mass[NBUCKET] = { 0 };
    for (int32_t i = 0; i < n; i++) mass[bucket_of(maxl, c[i].logit)] += c[i].w;
    int32_t cross = NBUCKET - 1;
    for (int32_t b = 0; b < NBUCKET; b++) {
        if (cum + mass[b] >= want) { cross = b; break; }
        cum += mass[b];
    }
    int32_t keep = 0;
    for (int32_t i = 0; i < n; i++) if (bucket_of(maxl, c[i].logit) < cross) swap_cand(c, i, keep++);
    int32_t mid = keep;
    for (int32_t i = mid; i < n; i++) if (bucket_of(maxl, c[i].logit) == cross) swap_cand(c, i, keep++);
    qsort(c + mid, (size_t)(keep - mid), sizeof *c, cmp_cand);
    for (int32_t i = mid; i < keep; i++) if ((cum += c[i].w) >= want) return i + 1;
    return keep > 0 ? keep : 1;
}

static bool ensure_cand(sw_sampler *s, int32_t n)
{
    if (s->cand_cap >= n) return true;
    struct sw_cand *c = realloc(s->cand, (size_t)n * sizeof *c);
    if (!c) return false;
    s->cand = c;
    s->cand_cap = n;
    return true;
}

int32_t sw_sampler_sample(sw_sampler *s, float *logits, int32_t n_vocab)
{
    if (!logits || n_vocab <= 0) return -1;
    for (int32_t i = 0; i < s->p.n_bias; i++)
        if (s->bias_ids[i] >= 0 && s->bias_ids[i] < n_vocab) logits[s->bias_ids[i]] += s->bias[i];
    apply_penalty(s, logits, n_vocab);
    apply_presence(s, logits, n_vocab);
    float temp = s->p.temperature;
    if (!(temp > 0.0f) || !ensure_cand(s, n_vocab)) return sw_argmax(logits, n_vocab);

    struct sw_cand *c = s->cand;
    int32_t n = n_vocab, k = s->p.top_k;
    bool sorted = false;
    if (k > 0 && k < n) {
        top_k_sorted(c, logits, n, k);
        n = k;
        sorted = true;
    } else {
        for (int32_t i = 0; i < n; i++) c[i] = (struct sw_cand){ i, clean_logit(logits[i]), 0 };
    }
    float maxl = c[0].logit;
    if (!sorted) for (int32_t i = 1; i < n; i++) if (c[i].logit > maxl) maxl = c[i].logit;
    if (maxl == -INFINITY) return sw_argmax(logits, n_vocab);   /* nothing has any weight */

    float top_p = s->p.top_p;
    if (top_p > 0.0f && top_p < 1.0f) n = apply_top_p(c, n, sorted, maxl, top_p);

    float min_p = s->p.min_p;
    if (min_p > 0.0f) {
        /* p_i >= min_p * p_max  <=>  logit_i >= max + log(min_p); the max survives. */
        float cut = maxl + logf(min_p < 1.0f ? min_p : 1.0f);
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++) if (c[i].logit >= cut) c[m++] = c[i];
        n = m;
    }

    double z = 0;
    for (int32_t i = 0; i < n; i++) z += c[i].w = expf((c[i].logit - maxl) / temp);
    double r = next_unit(s) * z, cum = 0;
    int32_t pick = n - 1;                            /* rounding: the last one */
    for (int32_t i = 0; i < n; i++) {
        cum += c[i].w;
        if (r < cum) { pick = i; break; }
    }
    while (pick > 0 && c[pick].w == 0.0f) pick--;    /* never a zero-weight token through rounding */
    return c[pick].id;
}

float sw_logprobs(const float *logits, int32_t n, int32_t chosen, int k, int32_t *top_ids, float *top_lps)
{
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)(logits[i] - mx));
    float lse = mx + (float)log(sum);
    /* the k best so far, sorted: a new one enters only above the k-th */
    int m = 0;
    for (int32_t i = 0; i < n && k > 0; i++) {
        float v = logits[i];
        if (m == k && !(v > top_lps[k - 1])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && v > top_lps[j - 1]) { top_lps[j] = top_lps[j - 1]; top_ids[j] = top_ids[j - 1]; j--; }
        top_lps[j] = v;
        top_ids[j] = i;
    }
    for (int j = 0; j < m; j++) top_lps[j] -= lse;
    return chosen >= 0 && chosen < n ? logits[chosen] - lse : -INFINITY;
}
