/* serve_request.h: parsing and validating the JSON bodies of the OpenAI
 * endpoints (/v1/completions, /v1/chat/completions) and of /tokenize and
 * /detokenize, and turning a parsed request into prompt token ids.
 *
 * Parsing is strict about types and ranges and lenient about keys it does
 * not know (ignored, as OpenAI's servers do). A key written twice in an
 * object counts with its last value (as JavaScript and Python read JSON).
 * Every rejection is a 4xx
 * serve_error naming the field (param) and saying what was wrong:
 *   - the body is not a JSON object (byte offset of the syntax error);
 *   - a known field has the wrong type or is out of range: max_tokens (and
 *     its chat alias max_completion_tokens) an integer in [1, max_context],
 *     temperature in [0, 2], top_p in (0, 1], top_k -1, 0 (off) or more,
 *     min_p in [0, 1], presence_penalty and frequency_penalty in [-2, 2],
 *     repetition_penalty in (0, 10], logit_bias an object of at most
 *     SERVE_MAX_LOGIT_BIAS token ids (as strings, in the vocabulary) to
 *     numbers in [-100, 100], parallel_tool_calls a boolean, response_format
 *     {"type": "text" | "json_object" | "json_schema", "json_schema":
 *     {"schema": ..., "strict": ...}} (the schema itself is checked when
 *     compiled, serve_grammar.h),
 *     seed an integer with |seed| <= 2^53, stop a string or a list of at most
 *     SERVE_MAX_STOP non-empty strings of at most SERVE_MAX_STOP_LEN bytes,
 *     n in [1, SERVE_MAX_N], best_of in [n, SERVE_MAX_N] (not with stream
 *     when larger than n), logprobs (chat: true/false, with top_logprobs in
 *     [0, SERVE_MAX_TOP_LOGPROBS]; completions: an integer in that range);
 *   - tools: a list of {"type": "function", "function": {"name", ...}} with
 *     distinct names, parameters (when given) an object; tool_choice "auto",
 *     "none", "required" (with tools) or {"type": "function", "function":
 *     {"name": a listed tool}}; assistant
 *     messages' tool_calls with arguments a JSON object text;
 *   - the prompt: a string, a list of token ids (each in [0, vocab)), or a
 *     list holding exactly one of those; chat messages a non-empty list of
 *     {role, content} with a known role and content a string, null or a list
 *     of {"type": "text", "text": ...} parts.
 * Strings keep their decoded length: a prompt or message content holding
 * U+0000 is tokenized whole (the length travels with the text); a string
 * field that cannot hold a NUL (stop, reasoning, tool names and arguments)
 * is refused naming it. A string that is not valid UTF-8 (raw overlong or
 * truncated sequences) is refused naming its field, and a \u escape that is
 * a lone UTF-16 surrogate is refused as invalid JSON with its byte offset.
 * Length checks that need the token count (empty prompt, prompt plus
 * max_tokens past the context) are made by serve_request_prompt and
 * serve_request_max_tokens.
 *
 * Ownership: serve_request_parse fills a caller-owned serve_request whose
 * strings and arrays it allocates; serve_request_release frees them (safe on
 * a zeroed or failed request). Pure functions, thread-safe. */
#ifndef MT_SERVE_REQUEST_H
#define MT_SERVE_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/format/chat.h"
#include "model/runtime.h"
#include "model/format/tokenizer.h"
#include "serve_error.h"

typedef enum serve_api {
    SERVE_API_COMPLETIONS = 0,
    SERVE_API_CHAT = 1,
    SERVE_API_TOKENIZE = 2,
    SERVE_API_DETOKENIZE = 3,
    SERVE_API_COUNT
} serve_api;

#define SERVE_MAX_STOP 16
#define SERVE_MAX_STOP_LEN 256
/* Completions without max_tokens generate this many (OpenAI's default). */
#define SERVE_DEFAULT_MAX_TOKENS 16
#define SERVE_MAX_N 16             /* n and best_of */
#define SERVE_MAX_TOP_LOGPROBS 20

typedef enum serve_tool_choice {
    SERVE_TOOL_AUTO = 0,
    SERVE_TOOL_NONE = 1,     /* no tools rendered or parsed; the tool-call token refused */
    SERVE_TOOL_REQUIRED = 2, /* the output is forced into calls (structured outputs) */
    SERVE_TOOL_NAMED = 3,    /* only the named tool is rendered, parsed and forced */
} serve_tool_choice;

typedef enum serve_format {
    SERVE_FORMAT_TEXT = 0,
    SERVE_FORMAT_JSON_OBJECT = 1, /* any JSON object */
    SERVE_FORMAT_JSON_SCHEMA = 2, /* JSON valid against schema */
} serve_format;

#define SERVE_MAX_LOGIT_BIAS 1024

/* A tool as the request gave it (pointers into serve_request.tools_json). */
typedef struct serve_request_tool {
    const char *name;
    int index;                      /* its place in the request's tools list */
    const struct cJSON *parameters; /* function.parameters (an object), or NULL */
    const struct cJSON *properties; /* function.parameters.properties, or NULL */
    char *text; /* the tool's JSON as GLM's template writes it (tojson) */
} serve_request_tool;

typedef struct serve_limits {
    int64_t max_context; /* prompt plus generated tokens */
    int32_t vocab;       /* token ids must be below this */
} serve_limits;

typedef struct serve_request {
    serve_api api;
    char *model; /* NULL when absent */

    /* The prompt: text (completions, tokenize), ids (completions, detokenize)
     * or msgs (chat, tokenize). */
    char *text;
    size_t text_len;
    int32_t *ids;
    size_t n_ids;
    bool has_ids;
    model_chat_msg *msgs; /* contents and reasoning owned by the request */
    model_chat_extra *extra; /* per message: content length, tool calls (owned) */
    size_t n_msgs;
    struct cJSON *tools_json;  /* the request's tools list, owned */
    serve_request_tool *tools; /* n_tools; after tool_choice (none: 0, named: 1) */
    int n_tools;
    serve_tool_choice tool_choice;
    bool separate_reasoning;   /* false: reasoning stays in content (sglang's key) */
    bool include_reasoning;    /* false: reasoning is dropped (vLLM's key) */
    bool add_generation_prompt; /* chat; default true */
    bool parallel_tool_calls;   /* default true; false: at most one call */
    serve_format format;        /* response_format */
    struct cJSON *schema;       /* json_schema's schema (owned); NULL: any JSON value */
    bool enable_thinking;       /* chat_template_kwargs.enable_thinking; default false */

    /* Generation. */
    int64_t max_tokens; /* -1: the endpoint's default */
    float temperature;  /* default 1 */
    float top_p;        /* default 1 */
    int top_k;          /* 0 = off */
    float min_p;        /* 0 = off */
    float presence_penalty, frequency_penalty; /* OpenAI's, [-2, 2]; 0 = off */
    float repetition_penalty; /* vLLM's, (0, 10]; 1 = off */
    model_logit_bias *logit_bias; /* n_logit_bias entries (owned), ids in [0, vocab) */
    int n_logit_bias;
    bool has_seed;
    uint64_t seed;
    char *stop[SERVE_MAX_STOP];
    int n_stop;
    bool ignore_eos;
    bool has_spec_steps;   /* extension: speculative_steps given (0..8) */
    int spec_steps;
    bool stream;
    bool include_usage;    /* streaming: final usage chunk; default false (OpenAI's) */
    bool return_token_ids; /* extension: token_ids in each choice */
    bool logprobs;         /* log probabilities of the chosen tokens */
    int top_logprobs;      /* and of this many most likely ones */
    int n;                 /* choices returned (default 1) */
    int best_of;           /* choices generated (default n); the n best are returned */
} serve_request;

/* Parses len bytes of body for the endpoint api into *out (zeroed first).
 * On failure *out holds nothing to free and e says why (HTTP 400). */
mt_status serve_request_parse(serve_api api, const char *body, size_t len,
                              const serve_limits *lim, serve_request *out, serve_error *e);
void serve_request_release(serve_request *r);

/* The prompt's token ids (malloc'd, caller frees): the ids as given, the
 * text encoded with tok (special tokens in the text recognized), or the chat
 * messages in GLM's chat format. tok may be NULL when the prompt is ids.
 * Rejects (400) an empty prompt, an id outside the vocab and a prompt of
 * max_context tokens or more (code "context_length_exceeded"). */
mt_status serve_request_prompt(const serve_request *r, const model_tokenizer *tok,
                               const serve_limits *lim, int32_t **ids, size_t *n,
                               serve_error *e);

/* The number of tokens to generate for a prompt of n_prompt tokens: the
 * request's max_tokens, or the default (completions SERVE_DEFAULT_MAX_TOKENS,
 * chat the rest of the context), clipped to the context for the default.
 * An explicit max_tokens with n_prompt + max_tokens > max_context is 400
 * "context_length_exceeded". */
mt_status serve_request_max_tokens(const serve_request *r, size_t n_prompt,
                                   const serve_limits *lim, int64_t *out, serve_error *e);

/* Drops, in every object of the tree from v on (v's siblings too), each
 * member whose key a later member of the same object repeats: the last
 * value counts. O(n log n) per object. MT_E_NOMEM leaves some dropped. */
mt_status serve_json_dedupe(struct cJSON *v);

/* "completions", "chat.completions", "tokenize", "detokenize". */
const char *serve_api_name(serve_api api);

#endif
