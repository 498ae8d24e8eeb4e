/* Backend-independent helpers: batch validation and teardown. */
#include "worker-gpu/backend.h"

#include <stdio.h>
#include <stdlib.h>

int sw_batch_validate(const sw_backend *be, const sw_batch *b, char *err, size_t errlen)
{
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)
    if (b->n_tokens <= 0 || b->n_tokens > be->max_tokens_per_step)
        BAD("batch of %d tokens (limit %d)", b->n_tokens, be->max_tokens_per_step);
    if (b->n_seqs <= 0 || b->max_blocks <= 0) BAD("batch without sequences or blocks");
    if (b->n_logits < 0 || b->n_logits > b->n_tokens) BAD("%d logits rows for %d tokens", b->n_logits, b->n_tokens);
    for (int i = 0; i < b->n_tokens; i++) {
        if (b->tokens[i] < 0 || (uint32_t)b->tokens[i] >= be->hp.n_vocab) BAD("token %d: id %d out of range", i, b->tokens[i]);
        if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs) BAD("token %d: sequence %d out of range", i, b->seq[i]);
        if (b->pos[i] < 0 || b->pos[i] >= b->max_blocks * SW_KV_BLOCK) BAD("token %d: position %d out of range", i, b->pos[i]);
        for (int p = 0; p <= b->pos[i] / SW_KV_BLOCK; p++) {
            int32_t blk = b->block_table[(size_t)b->seq[i] * b->max_blocks + p];
            if (blk < 0 || (uint32_t)blk >= be->n_kv_blocks) BAD("token %d: KV block %d out of range", i, blk);
        }
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logits_idx[i] < 0 || b->logits_idx[i] >= b->n_tokens) BAD("logits row %d: token %d out of range", i, b->logits_idx[i]);
    return 0;
#undef BAD
}

void sw_backend_free(sw_backend *b)
{
    if (!b) return;
    if (b->ops && b->ops->destroy) b->ops->destroy(b->impl);
    free(b);
}
