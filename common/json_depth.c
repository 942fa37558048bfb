/* json_depth.c: see json_depth.h. */
#include "json_depth.h"

bool mt_json_too_deep(const char *s, size_t n, int max, size_t *at)
{
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++; /* the escaped byte cannot close the string */
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max) {
                if (at)
                    *at = i;
                return true;
            }
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return false;
}
