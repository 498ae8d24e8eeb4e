/* Chat template tests: detection from representative Jinja sources of each
 * family, exact formatted output per family, and detection from a GGUF file. */
#include "tests/unit/check.h"
#include "tests/unit/testutil.h"
#include "llm/chat.h"
#include "llm/json.h"
#include "llm/gguf.h"

#include <unistd.h>

/* Short representative excerpts of each family's published template. */
static const char *LLAMA2_T =
    "{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + messages[0]['content'] | trim + '\\n<</SYS>>\\n\\n' %}"
    "{% endif %}{% for message in loop_messages %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content | trim + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' ' + content | trim + ' ' + eos_token }}{% endif %}{% endfor %}";
static const char *LLAMA3_T =
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
static const char *CHATML_T =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
static const char *MISTRAL_T =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}";
static const char *PHI3_T =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}";
static const char *GEMMA_T =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";
static const char *GRANITE_T =
    "{%- for message in loop_messages %}{{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + "
    "message['content'] + '<|end_of_text|>\n' }}{%- if loop.last and add_generation_prompt %}"
    "{{- '<|start_of_role|>assistant<|end_of_role|>' }}{%- endif %}{%- endfor %}";
/* Mistral Nemo's (v3-tekken), Mistral Small 3.2's (v7-tekken), Mistral
 * Large 2411's (v7), Phi-4's and Phi-4-mini's. */
static const char *MISTRAL_V3_TEKKEN_T =
    "{{- bos_token }}{%- for message in loop_messages %}{%- if message[\"role\"] == \"user\" %}"
    "{%- if loop.last and system_message is defined %}{{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}"
    "{%- else %}{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}{%- endif %}"
    "{%- elif message[\"role\"] == \"assistant\" %}{{- message[\"content\"] + eos_token}}{%- endif %}{%- endfor %}";
static const char *MISTRAL_V7_TEKKEN_T =
    "{{- bos_token }}{{- '[SYSTEM_PROMPT]' + system_prompt + '[/SYSTEM_PROMPT]' }}{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}{%- endif %}{%- endfor %}";
static const char *MISTRAL_V7_T =
    "{{- bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + '[/INST]' }}"
    "{%- elif message['role'] == 'system' %}{{- '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}{%- endif %}{%- endfor %}";
static const char *PHI4_T =
    "{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}"
    "{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}";
static const char *PHI4_MINI_T =
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] is not none %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}"
    "{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}";
/* DeepSeek-R1-Distill's (the V3 one lacks the "<think>\n" opener). */
static const char *DEEPSEEK_R1_T =
    "{%- for message in messages -%}{%- if message['role'] == 'user' -%}{{'<｜User｜>' + message['content']}}{%- endif -%}"
    "{%- if message['role'] == 'assistant' and message['content'] is not none -%}{%- set content = message['content'] -%}"
    "{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1] -%}{%- endif -%}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt and not ns.is_tool -%}{{'<｜Assistant｜><think>\\n'}}{%- endif %}";
/* OLMo 2 Instruct's (Tulu 3's). */
static const char *TULU_T =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\\n' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + '\\n' }}{% elif message['role'] == 'assistant' %}"
    "{% if not loop.last %}{{ '<|assistant|>\\n'  + message['content'] + eos_token + '\\n' }}{% else %}"
    "{{ '<|assistant|>\\n'  + message['content'] + eos_token }}{% endif %}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}{% endfor %}";

/* gpt-oss's (harmony) template, the parts that identify it. */
static const char *HARMONY_T =
    "{{- \"<|start|>system<|message|>\" }}{{- build_system_message() }}{{- \"<|end|>\" }}"
    "{{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content + \"<|end|>\" }}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}";

static const sw_chat_msg CONV[] = {
    { .role = "system", .content = "You are terse." },
    { .role = "user", .content = "Hi there" },
    { .role = "assistant", .content = " Hello! " },
    { .role = "user", .content = "What is 2+2?" },
};
static const size_t N_CONV = sizeof CONV / sizeof CONV[0];

static void expect(sw_chat_template t, const sw_chat_msg *m, size_t n, const char *want)
{
    char *got = sw_chat_format(t, m, n, NULL);
    CHECK(got && strcmp(got, want) == 0, "%s:\n--- got ---\n%s\n--- want ---\n%s", sw_chat_name(t), got ? got : "(null)", want);
    free(got);
}

static void test_detect(void)
{
    CHECK(sw_chat_detect(LLAMA2_T) == SW_CHAT_LLAMA2, "llama2");
    CHECK(sw_chat_detect(LLAMA3_T) == SW_CHAT_LLAMA3, "llama3");
    CHECK(sw_chat_detect(CHATML_T) == SW_CHAT_CHATML, "chatml");
    CHECK(sw_chat_detect(MISTRAL_T) == SW_CHAT_MISTRAL, "mistral");
    CHECK(sw_chat_detect(PHI3_T) == SW_CHAT_PHI3, "phi3");
    CHECK(sw_chat_detect(GEMMA_T) == SW_CHAT_GEMMA, "gemma");
    CHECK(sw_chat_detect(GRANITE_T) == SW_CHAT_GRANITE, "granite");
    CHECK(sw_chat_detect(MISTRAL_V3_TEKKEN_T) == SW_CHAT_MISTRAL_V3_TEKKEN, "mistral-v3-tekken");
    CHECK(sw_chat_detect(MISTRAL_V7_TEKKEN_T) == SW_CHAT_MISTRAL_V7_TEKKEN, "mistral-v7-tekken");
    CHECK(sw_chat_detect(MISTRAL_V7_T) == SW_CHAT_MISTRAL_V7, "mistral-v7");
    CHECK(sw_chat_detect(PHI4_T) == SW_CHAT_PHI4, "phi4");
    CHECK(sw_chat_detect(PHI4_MINI_T) == SW_CHAT_PHI4_MINI, "phi4-mini");
    CHECK(sw_chat_detect(DEEPSEEK_R1_T) == SW_CHAT_DEEPSEEK_R1, "deepseek-r1");
    CHECK(sw_chat_detect(HARMONY_T) == SW_CHAT_HARMONY, "harmony");
    CHECK(sw_chat_detect(TULU_T) == SW_CHAT_TULU, "tulu");
    CHECK(sw_chat_detect(NULL) == SW_CHAT_PLAIN && sw_chat_detect("") == SW_CHAT_PLAIN, "none");
    CHECK(sw_chat_detect("{{ messages }}") == SW_CHAT_PLAIN, "unknown template");
    for (int i = SW_CHAT_PLAIN; i < SW_CHAT_COUNT; i++)
        CHECK(sw_chat_from_name(sw_chat_name((sw_chat_template)i)) == i, "name round trip %d", i);
    CHECK(sw_chat_from_name("jinja2") == -1 && sw_chat_from_name(NULL) == -1, "unknown name");
    CHECK(strcmp(sw_chat_name(SW_CHAT_CHATML), "chatml") == 0, "chatml name");
}

static void test_formats(void)
{
    /* Every family over the shared conversation (CONV). */
    static const struct { sw_chat_template t; const char *want; } FORMATS[] = {
        { SW_CHAT_CHATML,
          "<|im_start|>system\nYou are terse.<|im_end|>\n"
          "<|im_start|>user\nHi there<|im_end|>\n"
          "<|im_start|>assistant\n Hello! <|im_end|>\n"
          "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
          "<|im_start|>assistant\n" },
        { SW_CHAT_LLAMA3,
          "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n" },
        { SW_CHAT_LLAMA2,
          "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello! </s>"
          "<s>[INST] What is 2+2? [/INST]" },
        { SW_CHAT_MISTRAL,
          "[INST] You are terse.\n\nHi there [/INST] Hello! </s>"
          "[INST] What is 2+2? [/INST]" },
        { SW_CHAT_PHI3,
          "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi there<|end|>\n"
          "<|assistant|>\n Hello! <|end|>\n<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n" },
        { SW_CHAT_GEMMA,
          "<start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n"
          "<start_of_turn>model\nHello!<end_of_turn>\n"
          "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n" },
        { SW_CHAT_GRANITE,
          "<|start_of_role|>system<|end_of_role|>You are terse.<|end_of_text|>\n"
          "<|start_of_role|>user<|end_of_role|>Hi there<|end_of_text|>\n"
          "<|start_of_role|>assistant<|end_of_role|> Hello! <|end_of_text|>\n"
          "<|start_of_role|>user<|end_of_role|>What is 2+2?<|end_of_text|>\n"
          "<|start_of_role|>assistant<|end_of_role|>" },
        { SW_CHAT_MISTRAL_V3_TEKKEN,
          "[INST]Hi there[/INST] Hello! </s>[INST]You are terse.\n\nWhat is 2+2?[/INST]" },
        { SW_CHAT_MISTRAL_V7_TEKKEN,
          "[SYSTEM_PROMPT]You are terse.[/SYSTEM_PROMPT][INST]Hi there[/INST] Hello! </s>[INST]What is 2+2?[/INST]" },
        { SW_CHAT_MISTRAL_V7,
          "[SYSTEM_PROMPT] You are terse.[/SYSTEM_PROMPT][INST] Hi there[/INST]  Hello! </s>[INST] What is 2+2?[/INST]" },
        { SW_CHAT_PHI4,
          "<|im_start|>system<|im_sep|>You are terse.<|im_end|><|im_start|>user<|im_sep|>Hi there<|im_end|>"
          "<|im_start|>assistant<|im_sep|> Hello! <|im_end|><|im_start|>user<|im_sep|>What is 2+2?<|im_end|>"
          "<|im_start|>assistant<|im_sep|>" },
        { SW_CHAT_PHI4_MINI,
          "<|system|>You are terse.<|end|><|user|>Hi there<|end|><|assistant|> Hello! <|end|>"
          "<|user|>What is 2+2?<|end|><|assistant|>" },
        { SW_CHAT_TULU,
          "<|system|>\nYou are terse.\n<|user|>\nHi there\n<|assistant|>\n Hello! <|endoftext|>\n"
          "<|user|>\nWhat is 2+2?\n<|assistant|>\n" },
        { SW_CHAT_DEEPSEEK_R1,
          "You are terse.<｜User｜>Hi there<｜Assistant｜> Hello! <｜end▁of▁sentence｜><｜User｜>What is 2+2?"
          "<｜Assistant｜><think>\n" },
    };
    for (size_t i = 0; i < sizeof FORMATS / sizeof FORMATS[0]; i++) expect(FORMATS[i].t, CONV, N_CONV, FORMATS[i].want);
    /* A past answer keeps only what follows its reasoning. */
    const sw_chat_msg thought[] = { { .role = "user", .content = "Q" }, { .role = "assistant", .content = "<think>\nhmm</think>\n\nA" }, { .role = "user", .content = "Q2" } };
    expect(SW_CHAT_DEEPSEEK3, thought, 3,
        "<｜User｜>Q<｜Assistant｜>\n\nA<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜>");
    /* Harmony: a system message with today's date, then the caller's system
     * text as the developer's, past answers in the final channel. */
    char *h = sw_chat_format(SW_CHAT_HARMONY, CONV, N_CONV, NULL);
    const char *head = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                       "Knowledge cutoff: 2024-06\nCurrent date: ";
    const char *tail = "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be "
                       "included for every message.<|end|><|start|>developer<|message|># Instructions\n\nYou are terse."
                       "\n\n<|end|><|start|>user<|message|>Hi there<|end|><|start|>assistant<|channel|>final<|message|>"
                       " Hello! <|end|><|start|>user<|message|>What is 2+2?<|end|><|start|>assistant";
    size_t hl = strlen(head);
    CHECK(h && !strncmp(h, head, hl) && strlen(h) == hl + 10 + strlen(tail) && h[hl + 4] == '-' && h[hl + 7] == '-' &&
          !strcmp(h + hl + 10, tail), "harmony:\n%s", h ? h : "(null)");
    free(h);
    /* The request's reasoning effort names itself in the system message. */
    static const char *const effort[] = { "medium", "low", "medium", "high" };
    for (int e = SW_EFFORT_DEFAULT; e <= SW_EFFORT_HIGH; e++) {
        char want[64];
        snprintf(want, sizeof want, "\n\nReasoning: %s\n\n#", effort[e]);
        h = sw_chat_format(SW_CHAT_HARMONY, CONV, N_CONV, &(sw_chat_opts){ .effort = (sw_reasoning_effort)e });
        CHECK(h && strstr(h, want), "harmony with effort %d says %s", e, want + 2);
        free(h);
    }
    expect(SW_CHAT_PLAIN, CONV, N_CONV,
        "system: You are terse.\nuser: Hi there\nassistant: Hello! \nuser: What is 2+2?\nassistant:");

    /* A single user message, no system prompt. */
    const sw_chat_msg one[] = { { .role = "user", .content = "Hello" } };
    expect(SW_CHAT_LLAMA2, one, 1, "[INST] Hello [/INST]");
    expect(SW_CHAT_MISTRAL, one, 1, "[INST] Hello [/INST]");
    expect(SW_CHAT_GEMMA, one, 1, "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n");
    expect(SW_CHAT_CHATML, one, 1, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
    /* Empty conversations still end with the assistant opener; NULL fields are tolerated. */
    expect(SW_CHAT_CHATML, NULL, 0, "<|im_start|>assistant\n");
    expect(SW_CHAT_PLAIN, NULL, 0, "assistant:");
    const sw_chat_msg nulls[] = { { .role = NULL, .content = NULL } };
    expect(SW_CHAT_CHATML, nulls, 1, "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n");
    /* Only a system prompt: the families without a system role turn it into the user turn. */
    const sw_chat_msg sys_only[] = { { .role = "system", .content = "Be nice." } };
    expect(SW_CHAT_GEMMA, sys_only, 1, "<start_of_turn>user\nBe nice.<end_of_turn>\n<start_of_turn>model\n");
    expect(SW_CHAT_MISTRAL_V3_TEKKEN, sys_only, 1, "[INST]Be nice.[/INST]");
    expect(SW_CHAT_MISTRAL_V3_TEKKEN, one, 1, "[INST]Hello[/INST]");
    /* An out-of-range family formats as plain. */
    expect((sw_chat_template)99, one, 1, "user: Hello\nassistant:");
}

static void test_gguf_detect(void)
{
    char path[] = "/tmp/sw_test_chat_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    const char *tmpl[] = { CHATML_T, NULL, NULL };
    const char *arch[] = { "qwen2", "gemma2", "llama" };
    const sw_chat_template want[] = { SW_CHAT_CHATML, SW_CHAT_GEMMA, SW_CHAT_PLAIN };
    for (int i = 0; i < 3; i++) {
        gguf_writer *w = gguf_writer_new();
        gguf_w_str(w, "general.architecture", arch[i]);
        if (tmpl[i]) gguf_w_str(w, "tokenizer.chat_template", tmpl[i]);
        gguf_file *f = write_and_open(w, path);
        if (!f) continue;
        CHECK(sw_chat_detect_gguf(f) == want[i], "case %d: %s", i, sw_chat_name(sw_chat_detect_gguf(f)));
        gguf_close(f);
    }
    CHECK(sw_chat_detect_gguf(NULL) == SW_CHAT_PLAIN, "NULL file");
    unlink(path);
}

/* Tools in chatml, as Qwen3's template renders them: the definitions in
 * json.dumps form after the system text, an assistant's calls after its
 * text, a run of tool results as one user turn. Families without a tool
 * format say so. */
static void test_tools(void)
{
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                               "\"parameters\":{\"type\":\"object\",\"required\":[\"city\"]}}},"
                               "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]");
    const sw_tool_call calls[] = { { "get_weather", "{\"city\": \"Paris\"}" }, { "now", "{}" } };
    const sw_chat_msg conv[] = {
        { .role = "system", .content = "Be brief." },
        { .role = "user", .content = "Weather?" },
        { .role = "assistant", .content = "", .tool_calls = calls, .n_tool_calls = 2 },
        { .role = "tool", .content = "{\"c\": 21}" },
        { .role = "tool", .content = "12:00" },
        { .role = "assistant", .content = "Sunny.", .tool_calls = calls + 1, .n_tool_calls = 1 },
        { .role = "tool", .content = "12:01" },
    };
    char *got = sw_chat_format(SW_CHAT_CHATML, conv, 7, &(sw_chat_opts){ .tools = tools });
    const char *want;
    want =
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
        "\"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\"}}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
        "</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n{\"c\": 21}\n</tool_response>\n<tool_response>\n12:00\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nSunny.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n12:01\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n";
    CHECK(got && !strcmp(got, want), "chatml with tools:\n--- got ---\n%s\n--- want ---\n%s", got ? got : "(null)", want);
    free(got);
    /* Without tools the same conversation is plain chatml: no tool block. */
    got = sw_chat_format(SW_CHAT_CHATML, conv, 2, &(sw_chat_opts){ .tools = NULL });
    CHECK(got && !strcmp(got, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n"
                              "<|im_start|>assistant\n"), "%s", got ? got : "(null)");
    free(got);
    CHECK(sw_chat_has_tools(SW_CHAT_CHATML) && sw_chat_has_tools(SW_CHAT_HARMONY) && sw_chat_has_tools(SW_CHAT_LLAMA3) &&
          sw_chat_has_tools(SW_CHAT_MISTRAL) && !sw_chat_has_tools(SW_CHAT_GEMMA) && !sw_chat_has_tools(SW_CHAT_PHI3),
          "which families have a tool format");

    /* Mistral: the definitions before the last user turn, calls as a JSON
     * array after [TOOL_CALLS], each result as {"content": ...} (JSON kept,
     * text quoted); Tekken's markers without the space. */
    const char *tools_json = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
                             "{\"type\": \"object\", \"required\": [\"city\"]}}}, {\"type\": \"function\", "
                             "\"function\": {\"name\": \"now\"}}]";
    for (int spaced = 0; spaced < 2; spaced++) {
        const char *sp = spaced ? " " : "";
        char w[2048];
        snprintf(w, sizeof w,
                 "[AVAILABLE_TOOLS]%s%s[/AVAILABLE_TOOLS][INST]%sBe brief.\n\nWeather?%s[/INST]"
                 "[TOOL_CALLS]%s[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
                 "{\"name\": \"now\", \"arguments\": {}}]</s>"
                 "[TOOL_RESULTS]%s{\"content\": {\"c\": 21}}[/TOOL_RESULTS][TOOL_RESULTS]%s{\"content\": \"12:00\"}[/TOOL_RESULTS]"
                 "[TOOL_CALLS]%s[{\"name\": \"now\", \"arguments\": {}}]</s>[TOOL_RESULTS]%s{\"content\": \"12:01\"}[/TOOL_RESULTS]",
                 sp, tools_json, sp, sp, sp, sp, sp, sp, sp);
        got = sw_chat_format(spaced ? SW_CHAT_MISTRAL : SW_CHAT_MISTRAL_V3_TEKKEN, conv, 7, &(sw_chat_opts){ .tools = tools });
        CHECK(got && !strcmp(got, w), "mistral with tools:\n--- got ---\n%s\n--- want ---\n%s", got ? got : "(null)", w);
        free(got);
    }

    /* Llama 3.1: the definitions (indent=4) before the first user text,
     * each call as its own assistant JSON message, results from ipython. */
    cJSON *one = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"now\",\"parameters\":{}}}]");
    got = sw_chat_format(SW_CHAT_LLAMA3, conv, 5, &(sw_chat_opts){ .tools = one });
    want = "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\n"
           "Today Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
           "Given the following functions, please respond with a JSON for a function call with its proper arguments "
           "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
           "dictionary of argument name and its value}.Do not use variables.\n\n{\n    \"type\": \"function\",\n"
           "    \"function\": {\n        \"name\": \"now\",\n        \"parameters\": {}\n    }\n}\n\nWeather?<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": "
           "{\"city\": \"Paris\"}}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"now\", "
           "\"parameters\": {}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n{\"c\": 21}<|eot_id|>"
           "<|start_header_id|>ipython<|end_header_id|>\n\n12:00<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
    CHECK(got && !strcmp(got, want), "llama3 with tools:\n--- got ---\n%s\n--- want ---\n%s", got ? got : "(null)", want);
    free(got);
    cJSON_Delete(one);
    cJSON_Delete(tools);

    /* Harmony: the functions as TypeScript types in the developer message,
     * calls with their recipient, each result from the function it answers. */
    tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"The weather.\","
                        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\","
                        "\"description\":\"A city\"},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"],\"default\":\"c\"},"
                        "\"days\":{\"type\":[\"integer\",\"null\"]},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
                        "\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]");
    got = sw_chat_format(SW_CHAT_HARMONY, conv, 5, &(sw_chat_opts){ .tools = tools });
    const char *from = got ? strstr(got, "\n\nReasoning: ") : NULL;
    want = "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every "
           "message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"
           "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n"
           "// The weather.\ntype get_weather = (_: {\n// A city\ncity: string,\nunit?: \"c\" | \"f\", // default: c\n"
           "days?: number | null,\ntags?: string[],\n}) => any;\n\ntype now = () => any;\n\n} // namespace functions<|end|>"
           "<|start|>user<|message|>Weather?<|end|>"
           "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>"
           "<|start|>assistant to=functions.now<|channel|>commentary json<|message|>{}<|call|>"
           "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"c\": 21}<|end|>"
           "<|start|>functions.now to=assistant<|channel|>commentary<|message|>12:00<|end|><|start|>assistant";
    CHECK(from && !strcmp(from, want), "harmony with tools:\n--- got ---\n%s\n--- want ---\n%s", from ? from : "(null)",
          want);
    free(got);
    cJSON_Delete(tools);
}

/* JSON as Python's json.dumps writes it. */
static void test_json_form(void)
{
    static const struct { const char *in, *want; } cases[] = {
        { "{\"a\":1,\"b\":[true,false,null],\"c\":{}}", "{\"a\": 1, \"b\": [true, false, null], \"c\": {}}" },
        { "[0.5,-2,1e21,1.25e-7,3.141592653589793]", "[0.5, -2, 1e+21, 1.25e-07, 3.141592653589793]" },
        { "\"q\\\"\\\\\\n\\t\\u0001 \u00e9\u4e2d\"", "\"q\\\"\\\\\\n\\t\\u0001 \u00e9\u4e2d\"" },
        { "[]", "[]" },
    };
    cJSON *nested = cJSON_Parse("{\"a\":[1,{}],\"b\":{\"c\":[]}}");
    sw_sbuf b = { 0 };
    sw_json_put_indented(&b, nested, 2);
    CHECK(b.s && !strcmp(b.s, "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": {\n    \"c\": []\n  }\n}"),
          "indent=2: %s", b.s ? b.s : "(null)");
    free(b.s);
    cJSON_Delete(nested);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *v = cJSON_Parse(cases[i].in);
        char *got = sw_json_dumps(v);
        CHECK(got && !strcmp(got, cases[i].want), "json %zu: got %s want %s", i, got ? got : "(null)", cases[i].want);
        free(got);
        cJSON_Delete(v);
    }
}

int main(void)
{
    test_detect();
    test_formats();
    test_gguf_detect();
    test_tools();
    test_json_form();
    CHECK_DONE();
}
