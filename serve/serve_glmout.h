/* serve_glmout.h: GLM's assistant output split into what OpenAI clients
 * expect: reasoning (`<think>...</think>`), content, and tool calls in
 * GLM-4.5/4.7/5 form (docs/FORMATS.md):
 *
 *   <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
 *
 * with any whitespace (GLM-4.5's newlines) between the parts. Text arrives
 * in pieces of any size (one token, several tokens of a speculative step, or
 * the whole answer); each push returns what became certain, as a delta:
 * reasoning text, content text and the calls completed (index, id, name and
 * the arguments as a JSON object's text). Text that may still be the start
 * of a tag, and an open call, are held back until decided.
 *
 * Reasoning: the output starts in reasoning when the prompt opened a
 * `<think>` (thinking enabled); a `<think>` before any content also starts
 * it; `</think>` ends it. With keep_reasoning the tags and the reasoning
 * stay in the content as the model wrote them.
 *
 * Tool calls (only when tools are given): the name must be a given tool's;
 * each argument value is a string unless that tool's JSON schema types the
 * property (integer, number, boolean, null, object, array, or a list of
 * those), in which case a value that reads as that type is converted and
 * any other stays a string. A call is emitted only once it is complete
 * (its "</tool_call>" read): id, name and the whole arguments in one delta
 * entry, so a stream and a plain response hold the same calls however the
 * text arrives. A call that turns out malformed (unknown name, text between
 * the parts, unterminated at the end) is content: its raw text, from
 * `<tool_call>`, is emitted as content. With max_calls, a "<tool_call>"
 * after that many calls is content too.
 *
 * Ownership: caller storage; tools are borrowed for the object's life;
 * release frees what the object allocated. Deltas are reset by each push
 * and valid until the next call. Not thread-safe per object. */
#ifndef MT_SERVE_GLMOUT_H
#define MT_SERVE_GLMOUT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"
#include "serve_buf.h"

struct cJSON;

typedef struct serve_glmout_tool {
    const char *name;
    const struct cJSON *properties; /* parameters.properties (an object) or NULL */
} serve_glmout_tool;

typedef struct serve_glmout_call_delta {
    int index;        /* 0, 1, ... in the order the calls were written */
    char id[48];      /* set in the call's first delta, else "" */
    char *name;       /* set in the call's first delta, else NULL */
    serve_buf args;   /* argument text added by this delta (may be empty) */
} serve_glmout_call_delta;

typedef struct serve_glmout_delta {
    serve_buf reasoning;
    serve_buf content;
    serve_glmout_call_delta *calls;
    int n_calls, cap_calls;
} serve_glmout_delta;

typedef struct serve_glmout_opts {
    const serve_glmout_tool *tools; /* NULL / 0: tool calls are not parsed */
    int n_tools;
    bool start_in_reasoning; /* the prompt ended in "<think>" */
    bool keep_reasoning;     /* reasoning stays in content, tags included */
    int max_calls;           /* > 0: calls past this many are not parsed (content) */
    const char *id_prefix;   /* call ids are "call_" id_prefix "_" index; copied (at
                              * most 32 bytes) by serve_glmout_init */
} serve_glmout_opts;

typedef enum serve_glmout_state {
    SERVE_GLMOUT_CONTENT = 0,
    SERVE_GLMOUT_REASONING = 1,
    SERVE_GLMOUT_CALL = 2,
} serve_glmout_state;

typedef struct serve_glmout {
    serve_glmout_opts o;  /* o.id_prefix is not kept: see id_prefix */
    char id_prefix[33];   /* a copy of the caller's */
    serve_glmout_state state;
    serve_buf pending;    /* text not yet decided */
    serve_buf call;       /* the raw text of the open call, from "<tool_call>" */
    size_t call_pos;      /* bytes of call parsed */
    bool call_named;      /* the open call's name is complete and valid */
    int call_tool;        /* index of its tool */
    int call_args;        /* arguments parsed in the open call */
    serve_buf call_json;  /* the open call's arguments so far */
    bool seen_content;    /* non-whitespace content was emitted */
    int n_calls;          /* calls completed (and emitted) */
} serve_glmout;

void serve_glmout_init(serve_glmout *p, const serve_glmout_opts *o);
/* Feeds n bytes of output text; *d is reset, then filled. */
mt_status serve_glmout_push(serve_glmout *p, const char *s, size_t n, serve_glmout_delta *d);
/* End of output: decides everything held back (an open call is malformed). */
mt_status serve_glmout_finish(serve_glmout *p, serve_glmout_delta *d);
/* Calls completed so far (what finish_reason "tool_calls" depends on). */
int serve_glmout_calls(const serve_glmout *p);
void serve_glmout_release(serve_glmout *p);

void serve_glmout_delta_reset(serve_glmout_delta *d);
void serve_glmout_delta_release(serve_glmout_delta *d);

/* The value text of an argument as JSON, converted by the property schema
 * (NULL: a string). Appends to out. */
mt_status serve_glmout_arg_json(const struct cJSON *schema, const char *v, size_t n,
                                serve_buf *out);

#endif
