/* JSON written as Python's json.dumps writes it (", " and ": " between
 * items, non-ASCII kept as is): the form chat templates' `tojson` gives, so
 * that tool definitions and calls reach a model in the bytes it was trained
 * on, and the form OpenAI-style servers give a call's arguments in. */
#ifndef SW_JSON_H
#define SW_JSON_H

#include <cjson/cJSON.h>
#include "llm/util.h"

/* Appends v to b. */
void sw_json_put(sw_sbuf *b, const cJSON *v);
/* The same as json.dumps(v, indent=indent) writes it: one item a line. */
void sw_json_put_indented(sw_sbuf *b, const cJSON *v, int indent);
/* v as a malloc'd string, or NULL when out of memory. */
char *sw_json_dumps(const cJSON *v);

#endif
