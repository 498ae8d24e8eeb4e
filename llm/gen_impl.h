/* The generator's state and the functions its parts share: internal to
 * llm/generate.c (the core: init, sample, accept, stop strings),
 * llm/gen_reasoning.c (think spans, harmony channels) and llm/gen_tools.c
 * (tool calls, forced calls), and to the unit tests that look inside.
 * Everyone else holds an sw_gen * and goes through llm/generate.h. */
#ifndef SW_GEN_IMPL_H
#define SW_GEN_IMPL_H

#include "llm/generate.h"
#include "llm/json_schema.h"
#include "llm/text.h"
#include "llm/util.h"

struct sw_gen {
    const sw_tokenizer *tok;
    sw_sampler sampler;
    sw_detok detok;
    int32_t *prompt;              /* prompt tokens, to be evaluated at positions 0.. */
    int n_prompt;
    int n_ctx;
    int32_t n_vocab;              /* sampling is limited to the tokenizer's ids */
    uint32_t max_tokens;
    char *stop[SW_MAX_STOPS];
    size_t n_stop;
    sw_sbuf held;                 /* decoded text not emitted yet (could start a stop string) */
    sw_sbuf out;                  /* the delta returned by sw_gen_accept */
    uint32_t n_generated;         /* tokens accepted (completion_tokens) */
    int finish;                   /* SW_FINISH_*, sticky */
    /* Reasoning models (gen_reasoning.c): think chats (DeepSeek R1,
     * Qwen3) and harmony chats (gpt-oss). r_mode 0: the output is all answer. */
    int r_mode, r_state;
    int32_t think_open, think_close;                   /* <think> </think> */
    int32_t h_start, h_end, h_channel, h_message;     /* <|start|> <|end|> <|channel|> <|message|> */
    char h_role[64], h_chan[96];  /* a harmony header: after <|start|>, after <|channel|> */
    size_t h_n_role, h_n_chan;
    char h_to[SW_MAX_TOOL_NAME + 1];  /* the function a commentary message calls */
    sw_sbuf reasoning;            /* the reasoning delta of the last sw_gen_accept */
    uint32_t n_reasoning_tokens;  /* accepted tokens that were reasoning or its markers */
    /* Tool calls (gen_tools.c): <tool_call> JSON </tool_call>
     * spans of the answer, parsed into calls instead of shown. */
    bool calls_on;                /* tools offered to a family with a call format */
    int32_t call_open, call_close;    /* chatml's markers' ids (Mistral: [TOOL_CALLS], no close); -1: none */
    bool call_held;               /* Mistral: [TOOL_CALLS] opens calls that run to the end */
    int32_t call_args;            /* Mistral's [ARGS] (v11: [TOOL_CALLS]name[ARGS]{...}), or -1 */
    bool call_json;               /* Llama 3.1: an answer that starts as JSON is held as calls */
    int32_t python_tag;           /* its <|python_tag|>, or -1 */
    bool answer_begun;            /* Llama 3.1: the answer has shown text (not a call) */
    bool in_call;
    sw_sbuf call_text;            /* the JSON of the call being written */
    sw_tool_calls calls;          /* the calls completed by the last sw_gen_accept */
    uint32_t n_calls_total;
    bool one_call;                /* stop at the first call */
    /* Log probabilities (sw_gen_sample), when asked: of the raw logits, kept
     * from before sampling changes them. */
    bool lp_on;
    int lp_k;
    float *lp_row;                /* the raw logits of the last sample (log probabilities and the structured-output mask read them) */
    sw_logprob lp;
    bool lp_valid;                /* lp is the last sampled token's */
    /* The prompt's log probabilities (prompt_logprobs): one entry a prompt
     * token, filled in order by sw_gen_prompt_logprob; the first has bytes
     * only. The bytes are the prompt's text as decoded from its start. */
    sw_logprob *plp;
    int n_plp;
    sw_detok plp_detok;
    sw_sbuf echo;                 /* the prompt's text, for the first delta (echo); freed once sent */
    /* Structured output (generate.c, "structured output"): tokens that
     * cannot continue the answer's JSON are masked before sampling. */
    sw_js *js;
    sw_js_state js_st;
    int forced;                   /* a forced call's progress (FC_*), 0: none */
    const char *error;            /* why sw_gen_sample returned -1 */
};

/* Reasoning modes and states (gen_reasoning.c). */
enum { R_OFF, R_THINK, R_HARMONY };
enum { T_START, T_IN, T_LEAD, T_ANSWER };                          /* think chats */
enum { H_HEADER, H_CHANNEL, H_ANSWER, H_REASON, H_CALL, H_NONE };  /* harmony chats */
/* Where a token's text goes. */
typedef enum { TO_ANSWER, TO_REASONING, TO_CALL, TO_NONE } text_dest;
/* A forced call's progress (gen_tools.c): its open marker, its JSON, its close. */
enum { FC_NONE, FC_OPEN, FC_BODY, FC_CLOSE };

/* generate.c */
/* text as tokens into *out (malloc'd); their count, or -1 with err. */
int gen_encode(const sw_tokenizer *tok, const char *text, bool add_bos, bool special, int32_t **out, char *err,
               size_t errlen);
/* Appends text to the held answer (TO_ANSWER) or this step's reasoning
 * (TO_REASONING); other destinations take nothing. false when out of memory. */
bool gen_add_text(sw_gen *g, text_dest to, const char *s, size_t n);

/* gen_reasoning.c */
/* Sets the reasoning mode from the chat and the vocabulary (plain
 * completions: off). */
void gen_reasoning_init(sw_gen *g, sw_chat_template chat, const sw_gen_params *p);
/* Where this token's text (*piece, *n bytes; both may be trimmed) goes;
 * advances the reasoning state. */
text_dest gen_route(sw_gen *g, int32_t token, const char **piece, size_t *n);
/* Where text goes now, without a token: the detokenizer's last bytes. */
text_dest gen_current_dest(const sw_gen *g);

/* gen_tools.c */
/* Sets the call format from the chat's family (tools offered to a chat). */
void gen_calls_init(sw_gen *g, sw_chat_template chat, const sw_gen_params *p);
/* tool_choice: sets up a forced call. 0, or 400 with err. */
int gen_forced_init(sw_gen *g, sw_chat_template chat, const sw_gen_params *p, char *err, size_t errlen);
/* A harmony commentary message ended: its text is the call's arguments. */
void gen_harmony_call_done(sw_gen *g);
/* The answer's side of a token (after routing): markers and a call's JSON
 * are kept from the answer. false when out of memory. */
bool gen_answer_text(sw_gen *g, int32_t token, const char *s, size_t n);
/* When generation ends: a held answer becomes calls if it parses as such;
 * a call left open is text, as written. */
void gen_unfinished_call(sw_gen *g);

#endif
