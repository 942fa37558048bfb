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
 * Encoding: every tag above becomes its own token id; contents are encoded
 * with model_tokenizer_encode_plain, so text that spells a control token
 * ("<|assistant|>") is never read as one. For contents without such text the
 * ids equal those of encoding the rendered string with the tokenizer.
 *
 * Pure functions; thread-safe; returned buffers are malloc'd and owned by
 * the caller. */
#ifndef MT_MODEL_CHAT_H
#define MT_MODEL_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"
#include "tokenizer.h"

typedef enum model_chat_role {
    MODEL_CHAT_SYSTEM = 0,
    MODEL_CHAT_USER = 1,
    MODEL_CHAT_ASSISTANT = 2,
    MODEL_CHAT_OBSERVATION = 3,
    MODEL_CHAT_ROLE_COUNT
} model_chat_role;

typedef struct model_chat_msg {
    model_chat_role role;
    const char *content;   /* UTF-8; NULL reads as "" */
    const char *reasoning; /* assistant only; NULL when none */
} model_chat_msg;

typedef struct model_chat_opts {
    bool add_generation_prompt;
    bool enable_thinking;
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
