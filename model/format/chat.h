/* chat.h: GLM's chat format (GLM-4.7 / GLM-5 style), rendered as text and
 * encoded to token ids.
 *
 * The exact template (docs/FORMATS.md has it with examples):
 *   "[gMASK]<sop>"
 *   then per message, with no newline added anywhere:
 *     system       "<|system|>" content
 *     user         "<|user|>" content
 *     assistant    "<|assistant|>" ("<think>" reasoning "</think>" when a
 *                  reasoning text is given, else "</think>") content
 *     observation  "<|observation|>" content        (a tool result)
 *   then, with add_generation_prompt, "<|assistant|>" followed by "<think>"
 *   when thinking is enabled, else "</think>".
 * Generation stops at <|user|>, <|observation|> or <|endoftext|>.
 *
 * Tools (GLM-4.7's template; docs/FORMATS.md): with tools, a block
 *   "<|system|>\n# Tools\n\n...<tools>\n" {tool JSON} "\n" ... "</tools>\n\n...
 *   <tool_call>{function-name}<arg_key>...</tool_call>"
 * comes right after "[gMASK]<sop>"; an assistant message's calls follow its
 * content as "<tool_call>" name ("<arg_key>" k "</arg_key><arg_value>" v
 * "</arg_value>")... "</tool_call>"; a run of tool results is one
 * "<|observation|>" followed by "<tool_response>" result "</tool_response>"
 * per result.
 *
 * Encoding: every role and thinking tag above becomes its own token id;
 * contents (message text, reasoning, tool JSON, call names, argument keys
 * and values) are encoded with model_tokenizer_encode_plain, so text that
 * spells a control token ("<|assistant|>") is never read as one; the fixed
 * markup of the tool format ("<tool_call>", "<arg_key>", the tools
 * preamble) is encoded with model_tokenizer_encode, so it uses the added
 * tokens the tokenizer has for it. For contents without such text the
 * ids equal those of encoding the rendered string with the tokenizer.
 *
 * Pure functions; thread-safe; returned buffers are malloc'd and owned by
 * the caller. */
#ifndef MT_MODEL_CHAT_H
#define MT_MODEL_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "tokenizer.h"

typedef enum model_chat_role {
    MODEL_CHAT_SYSTEM = 0,
    MODEL_CHAT_USER = 1,
    MODEL_CHAT_ASSISTANT = 2,
    MODEL_CHAT_OBSERVATION = 3,
    MODEL_CHAT_ROLE_COUNT
} model_chat_role;

/* One argument of a tool call as the template writes it: a string value
 * as is, any other JSON value as its JSON text. */
typedef struct model_chat_arg {
    const char *key;
    const char *value;
} model_chat_arg;

typedef struct model_chat_call {
    const char *name;
    const model_chat_arg *args;
    size_t n_args;
} model_chat_call;

typedef struct model_chat_msg {
    model_chat_role role;
    const char *content;   /* UTF-8; NULL reads as "" */
    const char *reasoning; /* assistant only; NULL when none */
} model_chat_msg;

/* What a message may carry beyond model_chat_msg (a separate array so that
 * the three-field initializers of model_chat_msg stay complete). */
typedef struct model_chat_extra {
    size_t content_len;           /* bytes of content (it may hold NUL); 0 = strlen */
    const model_chat_call *calls; /* assistant only: its tool calls, after the content */
    size_t n_calls;
} model_chat_extra;

typedef struct model_chat_opts {
    bool add_generation_prompt;
    bool enable_thinking;
    const char *const *tools; /* each tool's JSON text, as the template's tojson writes it */
    size_t n_tools;           /* 0: no tools block */
    const model_chat_extra *extra; /* NULL, or one per message */
} model_chat_opts;

/* "system", "user", "assistant", "observation". */
const char *model_chat_role_name(model_chat_role r);
/* Accepts the names above and "tool" (as observation). */
bool model_chat_role_parse(const char *s, model_chat_role *out);

/* Renders the conversation as text (NUL-terminated; *len may be NULL). */
mt_status model_chat_render(const model_chat_msg *msgs, size_t n, const model_chat_opts *o,
                            char **text, size_t *len, mt_err *err);

/* Renders and encodes. Fails with MT_E_FORMAT naming the tag when the
 * tokenizer lacks one of GLM's chat tokens. */
mt_status model_chat_encode(const model_tokenizer *t, const model_chat_msg *msgs, size_t n,
                            const model_chat_opts *o, int32_t **ids, size_t *count,
                            mt_err *err);

/* The ids that end an assistant turn that the tokenizer has
 * (<|user|>, <|observation|>, <|endoftext|>); returns how many (<= 3). */
size_t model_chat_stop_ids(const model_tokenizer *t, int32_t out[3]);

#endif
