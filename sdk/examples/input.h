/* The examples' one piece of argument parsing: an input written as
 * [ID,ID,...] is token ids, anything else a text. */
#ifndef SPILLWAY_EXAMPLE_INPUT_H
#define SPILLWAY_EXAMPLE_INPUT_H
#include "sdk/spillway.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* "[5,300,17]" as token ids into in (ids malloc'd); 0, or -1 if s is not that. */
static int parse_ids(const char *s, spillway_input *in)
{
    size_t n = strlen(s);
    if (n < 3 || s[0] != '[' || s[n - 1] != ']') return -1;
    uint32_t *ids = malloc(n * sizeof *ids);   /* fewer ids than characters */
    const char *p = s + 1;
    while (ids && *p != ']') {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || v > UINT32_MAX || (*end != ',' && *end != ']')) { free(ids); return -1; }
        ids[in->n_ids++] = (uint32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    in->ids = ids;
    return ids ? 0 : -1;
}

#endif
