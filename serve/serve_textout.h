/* serve_textout.h: generated token ids to response text, one token at a
 * time, as both the streaming and the plain responses need it:
 *   - special tokens are skipped (like `skip_special_tokens`);
 *   - bytes that may still become part of a UTF-8 character are held back
 *     until the next token completes (or breaks) it; invalid UTF-8 becomes
 *     U+FFFD per maximal invalid subpart, as Rust's from_utf8_lossy does;
 *   - stop strings: text that could be the start of a stop string is held
 *     back; after each token the held text is searched, and the first token
 *     that completes a stop string ends the output at the earliest stop
 *     string then present (the text before it is emitted, the rest dropped),
 *     as a streaming server must: it cannot wait for a longer stop string
 *     that might start earlier and complete later.
 * So the concatenation of everything emitted is the same however the
 * tokens arrive.
 *
 * Ownership: caller storage; the tokenizer and the stop strings are borrowed
 * for the object's life; release frees its buffer. Not thread-safe per
 * object. */
#ifndef MT_SERVE_TEXTOUT_H
#define MT_SERVE_TEXTOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/format/tokenizer.h"
#include "serve_buf.h"

typedef struct serve_textout {
    const model_tokenizer *tok; /* NULL: no text (ids only) */
    char *const *stop;
    int n_stop;
    serve_buf pending; /* decoded bytes not emitted yet */
    bool stopped;
} serve_textout;

void serve_textout_init(serve_textout *t, const model_tokenizer *tok, char *const *stop,
                        int n_stop);
/* Feeds token id; appends the text now safe to emit to out. Once stopped,
 * tokens are ignored. */
mt_status serve_textout_push(serve_textout *t, int32_t id, serve_buf *out);
/* End of generation: emits what was held back (a dangling partial UTF-8
 * character as U+FFFD; a partial stop string as text). */
mt_status serve_textout_finish(serve_textout *t, serve_buf *out);
void serve_textout_release(serve_textout *t);

/* Appends n bytes to out with invalid UTF-8 replaced by U+FFFD. */
mt_status serve_utf8_lossy(serve_buf *out, const char *s, size_t n);

#endif
