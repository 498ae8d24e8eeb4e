/* Chat templates. We do not run Jinja: we recognise the well-known template
 * families from tokenizer.chat_template (or the architecture when it is absent)
 * and format the conversation with our own code for that family. */
#ifndef SW_CHAT_H
#define SW_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <cjson/cJSON.h>
#include "gguf.h"

typedef enum {
    SW_CHAT_PLAIN = 0,  /* "role: content\n" lines, then "assistant:" - for models without a template */
    SW_CHAT_LLAMA2, SW_CHAT_LLAMA3, SW_CHAT_CHATML, SW_CHAT_MISTRAL, SW_CHAT_PHI3, SW_CHAT_GEMMA,
    SW_CHAT_GRANITE,
    SW_CHAT_MISTRAL_V3_TEKKEN,  /* Mistral Nemo: "[INST]user[/INST]answer</s>", system text in the last user turn */
    SW_CHAT_MISTRAL_V7,         /* Mistral Large 2411: "[SYSTEM_PROMPT] s[/SYSTEM_PROMPT][INST] u[/INST] a</s>" */
    SW_CHAT_MISTRAL_V7_TEKKEN,  /* Mistral Small 3.x, Devstral, Ministral 3: the same without the spaces */
    SW_CHAT_PHI4,               /* Phi-4: "<|im_start|>role<|im_sep|>text<|im_end|>" */
    SW_CHAT_PHI4_MINI,          /* Phi-4-mini: "<|role|>text<|end|>" */
    SW_CHAT_DEEPSEEK3,          /* DeepSeek V3: "system<｜User｜>u<｜Assistant｜>a<｜end▁of▁sentence｜>" */
    SW_CHAT_DEEPSEEK_R1,        /* DeepSeek R1 and its distills: the same, the answer opened with "<think>\n" */
    SW_CHAT_HARMONY,            /* gpt-oss: "<|start|>role<|message|>text<|end|>", answers in channels */
    SW_CHAT_TULU,               /* OLMo 2, Tulu: "<|user|>\ntext\n<|assistant|>\nanswer<|endoftext|>\n" */
    SW_CHAT_COUNT
} sw_chat_template;

/* A function call: its name and its arguments as JSON text. */
typedef struct { const char *name; const char *arguments; } sw_tool_call;

/* A growing list of calls that owns copies of its strings. */
typedef struct { sw_tool_call *v; size_t n, cap; } sw_tool_calls;
/* Appends copies of name and arguments; false when out of memory. */
bool sw_tool_calls_add(sw_tool_calls *l, const char *name, const char *arguments);
/* Frees the strings and empties the list (keeping its array). */
void sw_tool_calls_clear(sw_tool_calls *l);
void sw_tool_calls_free(sw_tool_calls *l);

typedef struct {
    const char *role;             /* system, user, assistant, tool */
    const char *content;
    const sw_tool_call *tool_calls;   /* an assistant's calls */
    size_t n_tool_calls;
} sw_chat_msg;

/* How long a reasoning model thinks: the wire's ReasoningEffort values. */
typedef enum { SW_EFFORT_DEFAULT = 0, SW_EFFORT_LOW, SW_EFFORT_MEDIUM, SW_EFFORT_HIGH } sw_reasoning_effort;

typedef struct {
    sw_reasoning_effort effort;   /* harmony (gpt-oss): "Reasoning: low|medium|high"; default medium */
    const cJSON *tools;           /* OpenAI's tools array (function definitions), or NULL */
} sw_chat_opts;

/* Detects the family from a Jinja template string (NULL -> PLAIN). */
sw_chat_template sw_chat_detect(const char *jinja);
/* Detects from a model file's metadata. */
sw_chat_template sw_chat_detect_gguf(const gguf_file *f);
const char *sw_chat_name(sw_chat_template t);
/* Parses "llama3", "chatml", ... ; returns -1 if unknown. */
int sw_chat_from_name(const char *name);

/* Whether the family has a tool-calling format here: chatml's (Qwen2.5,
 * Qwen3, Hermes: definitions in <tools>, calls in <tool_call>, results in
 * <tool_response>), harmony's (gpt-oss: TypeScript types, commentary
 * messages to functions.NAME), Llama 3.1's (JSON calls, ipython
 * results) and Mistral's (v3 on: [AVAILABLE_TOOLS], [TOOL_CALLS],
 * [TOOL_RESULTS]). The others refuse tools. */
bool sw_chat_has_tools(sw_chat_template t);
/* The Mistral families ([INST]), whose tool format is [TOOL_CALLS]. */
bool sw_chat_is_mistral(sw_chat_template t);

/* Formats the conversation and the assistant-turn opener. Returns a malloc'd
 * NUL-terminated string (caller frees). The text includes special-token text
 * such as "<|im_start|>" that must be encoded with parse_special = true.
 * BOS is not included in the text: the caller adds it per the tokenizer.
 * opts may be NULL (every option at its default). */
char *sw_chat_format(sw_chat_template t, const sw_chat_msg *msgs, size_t n, const sw_chat_opts *opts);

#endif
