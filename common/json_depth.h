/* json_depth.h: the nesting depth of JSON text, found without parsing it.
 * cJSON parses, prints and frees recursively, one C stack frame per level:
 * on a server worker's small stack a few hundred '[' overflow it. Callers
 * check the depth first and refuse deep text with a message that names the
 * byte where the limit was passed. */
#ifndef MT_JSON_DEPTH_H
#define MT_JSON_DEPTH_H

#include <stdbool.h>
#include <stddef.h>

/* The nesting limit of every JSON text the server parses (request bodies,
 * tool-call arguments, model output): deeper than any real request or JSON
 * schema, and far below what a worker's stack holds. */
#define MT_JSON_MAX_DEPTH 128

/* True when the n bytes at s open more than max arrays and objects at once
 * ('[' and '{' outside strings, escapes honoured); *at (if non-NULL) is then
 * the byte offset of the bracket that went past max. Malformed text is not
 * an error here: the parser that follows reports it. O(n), no allocation. */
bool mt_json_too_deep(const char *s, size_t n, int max, size_t *at);

#endif
