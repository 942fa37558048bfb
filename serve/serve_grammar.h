/* serve_grammar.h: structured outputs' grammar: a JSON schema (or GLM's
 * tool-call format with each tool's parameters schema) compiled into a
 * pushdown automaton over bytes, which says, byte by byte, whether the
 * output so far can still become a valid answer. serve_mask.h turns it into
 * a mask over the vocabulary; serve_logits.h applies that mask per request.
 *
 * What is generated (so what the automaton accepts): compact JSON, with no
 * whitespace outside strings, object properties in the schema's order
 * (optional ones may be skipped, required ones never), numbers of at most 15
 * integer and 15 fraction digits and a 2-digit exponent, strings of valid
 * UTF-8 without raw control characters (escapes \" \\ \/ \b \f \n \r \t
 * \uXXXX, no lone surrogates and no \u0000). Supported schema keywords:
 *   type (a name or a list), properties, required, additionalProperties
 *   (false, true or absent: only the listed properties are written; a
 *   schema with no properties: keys of any text with values of that
 *   schema), items, enum, const, minLength, maxLength (characters),
 *   minItems, maxItems, anyOf (when its members start with different
 *   characters, e.g. a string or null), and the annotations title,
 *   description, default, examples, $schema, $id, $comment, $defs,
 *   definitions, deprecated, readOnly, writeOnly.
 * Every other keyword ($ref, oneOf, allOf, not, pattern, format, minimum,
 * maximum, multipleOf, uniqueItems, ...) is refused naming it, as are
 * schemas nested deeper than SERVE_GRAMMAR_MAX_NESTING and unsatisfiable
 * ones (an empty enum, minItems above maxItems, a required key that is not
 * a property). A schema of {} (or a missing type) is any JSON value;
 * response_format json_object is any JSON object.
 *
 * Tool mode: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...
 * </tool_call>` (serve_glmout.h), the name one of the tools', the arguments
 * that tool's parameters' properties in order (required ones always); a
 * string-typed value is the raw text (no "</" in it), any other is compact
 * JSON of its schema, as serve_glmout converts it back. One call, or one or
 * more when parallel.
 *
 * States are plain values (serve_gstate, copied freely); the grammar is
 * immutable after compile and may be shared by any number of threads.
 * Ownership: compile returns a reference; serve_grammar_ref adds one and
 * serve_grammar_release drops one (the last frees; NULL is a no-op). */
#ifndef MT_SERVE_GRAMMAR_H
#define MT_SERVE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve_error.h"

struct cJSON;

#define SERVE_GRAMMAR_MAX_DEPTH 40   /* automaton stack frames */
#define SERVE_GRAMMAR_MAX_NESTING 24 /* schema objects/arrays inside each other */

typedef struct serve_grammar serve_grammar;

/* One frame of the automaton's stack (meaning per node kind). */
typedef struct serve_gframe {
    uint16_t node;
    uint8_t phase;
    uint8_t u8;      /* UTF-8 bytes still expected (and the range of the next), hex digits */
    uint32_t n;      /* chars, items, digits, literal position */
    uint16_t lo, hi; /* literal candidates; object slot and property */
} serve_gframe;

typedef struct serve_gstate {
    uint32_t depth; /* frames in use; 0: the output is complete, nothing may follow */
    serve_gframe f[SERVE_GRAMMAR_MAX_DEPTH];
} serve_gstate;

typedef struct serve_grammar_tool {
    const char *name;
    const struct cJSON *parameters; /* the tool's parameters schema; NULL: no arguments */
} serve_grammar_tool;

typedef struct serve_grammar_opts {
    const char *prefix; /* bytes the output starts with (e.g. "</think>"); may be NULL */
    /* JSON mode (n_tools 0): the schema; NULL: any JSON object (json_object). */
    const struct cJSON *schema;
    /* Tool mode (n_tools > 0): the calls' tools; parallel: one or more calls. */
    const serve_grammar_tool *tools;
    int n_tools;
    bool parallel;
    /* Names the schema's place in the request for errors, e.g.
     * "response_format.json_schema.schema"; tool i's is "tools[i].function.parameters"
     * unless tool_params gives them. */
    const char *param;
    const char *const *tool_params; /* per tool, or NULL */
} serve_grammar_opts;

/* Compiles. A schema feature that is not supported, or a schema that can
 * never be satisfied, is a 400 in e naming the field (param and the path
 * inside it) and the keyword; out of memory is a 500. *out NULL then. */
mt_status serve_grammar_compile(const serve_grammar_opts *o, serve_grammar **out, serve_error *e);
serve_grammar *serve_grammar_ref(serve_grammar *g);
void serve_grammar_release(serve_grammar *g);

/* The state before any output. */
void serve_grammar_start(const serve_grammar *g, serve_gstate *s);
/* Feeds one byte: true when the output so far can still be completed; on
 * false *s is unspecified (step a copy to try a byte). O(depth). */
bool serve_grammar_step(const serve_grammar *g, serve_gstate *s, uint8_t byte);
/* Feeds n bytes; false at the first refused one. */
bool serve_grammar_feed(const serve_grammar *g, serve_gstate *s, const char *p, size_t n);
/* Whether the output may end here (the value or the calls are complete). */
bool serve_grammar_accepting(const serve_grammar *g, const serve_gstate *s);

/* The fast path of serve_mask.h: when the state is inside the body of a
 * string (no escape pending), returns 1 for a JSON string, 2 for a raw
 * tool-argument string, and sets *room to the characters it may still hold
 * (UINT32_MAX: no limit), *need to those it must still get before it may
 * close, and *pending to the UTF-8 continuation bytes it waits for (and
 * their range, coded as serve_grammar_utf8_class says); else 0. */
int serve_grammar_in_string(const serve_grammar *g, const serve_gstate *s, uint32_t *room,
                            uint32_t *need, uint8_t *pending);
/* In such a state: as if chars more characters (valid UTF-8 completing the
 * pending one, none of them special) were read. */
void serve_grammar_string_advance(const serve_grammar *g, serve_gstate *s, uint32_t chars);
/* The continuation states of a UTF-8 character in a string body: class 0
 * none pending, 1-7 the others (SERVE_GRAMMAR_UTF8_CLASSES in all); the
 * bytes expected and the range of the next one for class c. */
#define SERVE_GRAMMAR_UTF8_CLASSES 8
int serve_grammar_utf8_class(uint8_t pending);
void serve_grammar_utf8_expect(int c, int *bytes, uint8_t *lo, uint8_t *hi);

/* A hash of the state (equal states hash equal; used to cache masks). */
uint64_t serve_grammar_state_hash(const serve_gstate *s);
bool serve_grammar_state_equal(const serve_gstate *a, const serve_gstate *b);

#endif
