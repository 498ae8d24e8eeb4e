/* Embeddings with libspillway: each argument is an input, a text or, written
 * as [ID,ID,...], token ids; prints each vector (every float with the 9
 * digits that give it back exactly) and how alike the inputs are.
 * Build: cc embed.c -I<spillway> -I<build>/gen -L<build>/lib -lsw_sdk -lsw_proto -lzmq -lprotobuf-c
 * Run:   embed ENDPOINT MODEL INPUT... */
#include "sdk/spillway.h"
#include "input.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double dot(const float *a, const float *b, uint32_t n)
{
    double s = 0;
    for (uint32_t k = 0; k < n; k++) s += (double)a[k] * b[k];
    return s;
}

int main(int argc, char **argv)
{
    if (argc < 4) { fprintf(stderr, "usage: embed ENDPOINT MODEL INPUT...\n"); return 2; }
    size_t n = (size_t)argc - 3;
    spillway_input *in = calloc(n, sizeof *in);
    for (size_t i = 0; in && i < n; i++)
        if (argv[i + 3][0] != '[' || parse_ids(argv[i + 3], &in[i]) != 0) in[i] = (spillway_input){.text = argv[i + 3]};
    char err[256];
    spillway_client *c = in ? spillway_connect(argv[1], err, sizeof err) : NULL;
    spillway_embeddings e;
    int rc = c ? spillway_embed(c, argv[2], in, n, &e, 0, err, sizeof err) : -1;
    if (rc == 0) {
        printf("dim=%u count=%zu prompt_tokens=%u pool=%s\n", e.dim, e.count, e.prompt_tokens, e.pool);
        for (size_t i = 0; i < e.count; i++) {
            printf("vector %zu tokens=%u:", i, e.input_tokens[i]);
            for (uint32_t k = 0; k < e.dim; k++) printf(" %.9g", (double)e.values[i * e.dim + k]);
            printf("\n");
        }
        for (size_t i = 1; i < e.count; i++)   /* the vectors are L2-normalized: the dot product is the cosine */
            printf("cosine(0, %zu)=%.6f\n", i, dot(e.values, e.values + i * e.dim, e.dim));
    } else {
        fprintf(stderr, "%s\n", in ? err : "out of memory");
    }
    if (c) spillway_embeddings_free(&e);
    for (size_t i = 0; in && i < n; i++) free((uint32_t *)in[i].ids);
    free(in);
    spillway_close(c);
    return rc ? 1 : 0;
}
