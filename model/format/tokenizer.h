/* tokenizer.h: Hugging Face tokenizer.json, byte-level BPE (the GLM-4/GLM-5
 * tokenizer family), encode and decode with the same results as the
 * reference `tokenizers` library.
 *
 * Supported tokenizer.json parts (anything else is refused at load with
 * MT_E_UNSUPPORTED naming the part): normalizer null; pre_tokenizer a
 * Split (regex or literal pattern, behavior "Isolated" or "Removed",
 * invert false), a ByteLevel (add_prefix_space false; use_regex true uses
 * GPT-2's pattern), or a Sequence of those with ByteLevel last; model BPE
 * (vocab, merges as "a b" strings or [a, b] pairs, ignore_merges, no
 * dropout, no byte_fallback, no subword prefix/suffix); decoder ByteLevel
 * or null; added_tokens with single_word/lstrip/rstrip false. The
 * post_processor is ignored: encode adds no tokens of its own (the chat
 * format adds [gMASK]<sop>, see chat.h).
 *
 * Encoding: the text is first split on added tokens (leftmost, longest
 * match), each added token becoming its id; the rest is split by the
 * pre-tokenizer regex (PCRE2 with UTF and UCP, in place of the reference's
 * Oniguruma), each piece mapped byte by byte to GPT-2's printable stand-in
 * characters, and merged by BPE (lowest merge rank first, leftmost on ties).
 * Decoding maps tokens back to bytes and replaces invalid UTF-8 with U+FFFD
 * as Rust's from_utf8_lossy does.
 *
 * Ownership and threads: the tokenizer is immutable after load; encode and
 * decode may run concurrently from any number of threads. Returned arrays
 * and strings are malloc'd and owned by the caller. */
#ifndef MT_MODEL_TOKENIZER_H
#define MT_MODEL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct model_tokenizer model_tokenizer;

mt_status model_tokenizer_load(const char *path, model_tokenizer **out, mt_err *err);
/* Parses tokenizer.json text (len bytes); label names it in messages. */
mt_status model_tokenizer_parse(const char *json, size_t len, const char *label,
                                model_tokenizer **out, mt_err *err);
void model_tokenizer_destroy(model_tokenizer *t);

/* One past the largest id (vocab and added tokens). */
int32_t model_tokenizer_vocab_size(const model_tokenizer *t);

/* Encodes len bytes of UTF-8 text into a malloc'd array *ids of *n ids.
 * Added and special tokens written in the text are recognized. Invalid
 * UTF-8 is MT_E_INVALID naming the byte offset. */
mt_status model_tokenizer_encode(const model_tokenizer *t, const char *text, size_t len,
                                 int32_t **ids, size_t *n, mt_err *err);

/* Like model_tokenizer_encode, but added and special tokens written in the
 * text are NOT recognized: "<|user|>" in the text encodes as ordinary
 * characters. The chat format encodes message contents this way so that
 * user text can never forge a control token. */
mt_status model_tokenizer_encode_plain(const model_tokenizer *t, const char *text, size_t len,
                                       int32_t **ids, size_t *n, mt_err *err);

/* Decodes ids into a malloc'd NUL-terminated UTF-8 string (*len without the
 * NUL; len may be NULL). skip_special drops tokens marked special. An id
 * with no token is MT_E_INVALID naming it. */
mt_status model_tokenizer_decode(const model_tokenizer *t, const int32_t *ids, size_t n,
                                 bool skip_special, char **text, size_t *len, mt_err *err);

/* The raw bytes one token stands for (for streaming: bytes of adjacent
 * tokens may form one UTF-8 character). Writes up to cap bytes into buf and
 * returns the full length, or -1 for an unknown id. */
int64_t model_tokenizer_token_bytes(const model_tokenizer *t, int32_t id, char *buf, size_t cap);

/* The id of a token by its tokenizer.json spelling (vocab entry or added
 * token content), or -1. */
int32_t model_tokenizer_token_id(const model_tokenizer *t, const char *token);
/* The tokenizer.json spelling of an id, or NULL. Owned by t. */
const char *model_tokenizer_token_text(const model_tokenizer *t, int32_t id);
bool model_tokenizer_is_special(const model_tokenizer *t, int32_t id);

/* ---- byte-level helpers shared with the trainer ----------------------- */

/* GPT-2's stand-in character for byte b, UTF-8 encoded into out (NUL
 * terminated); returns its length (1 or 2). */
int model_bytelevel_char(uint8_t b, char out[4]);

/* First offset where s is not valid UTF-8, or len when it is valid. */
size_t model_utf8_check(const char *s, size_t len);

/* The pre-tokenizer regex of GLM-4/GLM-5 tokenizers. */
extern const char model_glm_split_regex[];

/* ---- training (model/tokenizer_train.c) -------------------------------- */

/* Learns byte-level BPE merges on corpus (pre-split by split_regex) until
 * the vocab holds vocab_size tokens (256 byte tokens + merges; fewer when
 * no pair occurs twice), then writes a complete tokenizer.json into *json
 * (malloc'd, caller frees) with the given added tokens after the vocab
 * (special[i] says whether added[i] is a special token). Deterministic:
 * pairs tie by the smaller ids. */
mt_status model_tokenizer_train(const char *corpus, size_t len, const char *split_regex,
                                int vocab_size, const char *const *added,
                                const bool *special, int added_count, char **json,
                                mt_err *err);

#endif
