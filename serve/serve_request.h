/* serve_request.h: parsing and validating the JSON bodies of the OpenAI
 * endpoints (/v1/completions, /v1/chat/completions) and of /tokenize and
 * /detokenize, and turning a parsed request into prompt token ids.
 *
 * Parsing is strict about types and ranges and lenient about keys it does
 * not know (ignored, as OpenAI's servers do). Every rejection is a 4xx
 * serve_error naming the field (param) and saying what was wrong:
 *   - the body is not a JSON object (byte offset of the syntax error);
 *   - a known field has the wrong type or is out of range: max_tokens (and
 *     its chat alias max_completion_tokens) an integer in [1, max_context],
 *     temperature in [0, 2], top_p in (0, 1], top_k -1, 0 (off) or more,
 *     seed an integer with |seed| <= 2^53, stop a string or a list of at most
 *     SERVE_MAX_STOP non-empty strings of at most SERVE_MAX_STOP_LEN bytes,
 *     n and best_of 1, logprobs off;
 *   - the prompt: a string, a list of token ids (each in [0, vocab)), or a
 *     list holding exactly one of those; chat messages a non-empty list of
 *     {role, content} with a known role and content a string, null or a list
 *     of {"type": "text", "text": ...} parts.
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

#include "../model/chat.h"
#include "../model/tokenizer.h"
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
    size_t n_msgs;
    bool add_generation_prompt; /* chat; default true */
    bool enable_thinking;       /* chat_template_kwargs.enable_thinking; default false */

    /* Generation. */
    int64_t max_tokens; /* -1: the endpoint's default */
    float temperature;  /* default 1 */
    float top_p;        /* default 1 */
    int top_k;          /* 0 = off */
    bool has_seed;
    uint64_t seed;
    char *stop[SERVE_MAX_STOP];
    int n_stop;
    bool ignore_eos;
    bool stream;
    bool include_usage;    /* streaming: final usage chunk; default true */
    bool return_token_ids; /* extension: token_ids in each choice */
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

/* "completions", "chat.completions", "tokenize", "detokenize". */
const char *serve_api_name(serve_api api);

#endif
