/* ptx_mix.c: instruction mix of NVIDIA PTX text (see ptx_mix.h). */
#include "ptx_mix.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static bool starts(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

/* Copies the opcode at s (up to whitespace, ';' or '(') into op. */
static void opcode(const char *s, char *op, size_t cap)
{
    size_t n = 0;
    while (s[n] && !isspace((unsigned char)s[n]) && s[n] != ';' && s[n] != '(' && n + 1 < cap)
        n++;
    memcpy(op, s, n);
    op[n] = 0;
}

static void count(dev_ptx_func *f, const char *op)
{
    f->total++;
    f->ldmatrix += starts(op, "ldmatrix");
    f->cp_async += starts(op, "cp.async") && !starts(op, "cp.async.wait") &&
                   !starts(op, "cp.async.commit");
    if (starts(op, "mma.") || starts(op, "wgmma.mma_async")) {
        f->mma++;
        for (int i = 0; i < f->n_mma_kinds; i++)
            if (!strcmp(f->mma_kind[i], op)) {
                f->mma_kind_n[i]++;
                return;
            }
        if (f->n_mma_kinds < DEV_PTX_MAX_MMA_KINDS) {
            int i = f->n_mma_kinds++;
            snprintf(f->mma_kind[i], sizeof f->mma_kind[i], "%s", op);
            f->mma_kind_n[i] = 1;
        }
    } else if (starts(op, "fma.")) {
        f->fma++;
    } else if (starts(op, "ld.global") || starts(op, "ldu.global") || starts(op, "cp.async")) {
        f->ld_global++;
    } else if (starts(op, "st.global")) {
        f->st_global++;
    } else if (starts(op, "atom.") || starts(op, "red.")) {
        f->atomic++;
    } else if (starts(op, "ld.shared") || starts(op, "ldmatrix")) {
        f->ld_shared++;
    } else if (starts(op, "st.shared") || starts(op, "stmatrix")) {
        f->st_shared++;
    } else if (starts(op, "ld.local") || starts(op, "st.local")) {
        f->local++;
    } else if (starts(op, "bar.") || starts(op, "barrier.")) {
        f->barrier++;
    } else if (!strcmp(op, "bra") || starts(op, "bra.") || starts(op, "call") ||
               !strcmp(op, "ret") || starts(op, "ret.") || !strcmp(op, "exit")) {
        f->branch++;
    } else if (!starts(op, "ld.param") && !starts(op, "wgmma.") && !starts(op, "membar") &&
               !starts(op, "fence")) {
        f->alu++;
    }
}

/* The function name after ".entry " or ".func " (a ".func" may declare
 * its return value first: ".func (.param .b32 r) name("). */
static void func_name(const char *s, char *name, size_t cap)
{
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s == '(') {
        const char *close = strchr(s, ')');
        s = close ? close + 1 : s;
        while (*s == ' ' || *s == '\t')
            s++;
    }
    size_t n = 0;
    while (s[n] && (isalnum((unsigned char)s[n]) || s[n] == '_' || s[n] == '$') && n + 1 < cap)
        n++;
    memcpy(name, s, n);
    name[n] = 0;
}

void dev_ptx_parse(const char *ptx, dev_ptx_report *out)
{
    memset(out, 0, sizeof *out);
    dev_ptx_func *cur = NULL;
    int depth = 0;
    bool in_body = false;
    for (const char *line = ptx; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[512];
        size_t n = len < sizeof buf - 1 ? len : sizeof buf - 1;
        memcpy(buf, line, n);
        buf[n] = 0;
        line = end ? end + 1 : NULL;
        char *s = buf;
        while (isspace((unsigned char)*s))
            s++;
        char *e;
        if ((e = strstr(s, ".entry ")) || (e = strstr(s, ".func "))) {
            if (!in_body && out->n_funcs < DEV_MAX_KERNELS_PER_CODE) {
                cur = &out->funcs[out->n_funcs++];
                func_name(strchr(e, ' '), cur->name, sizeof cur->name);
            } else if (!in_body) {
                cur = NULL;
            }
            continue;
        }
        if (*s == '{') {
            depth++;
            in_body = true;
            continue;
        }
        if (*s == '}') {
            if (--depth <= 0) {
                depth = 0;
                in_body = false;
                cur = NULL;
            }
            continue;
        }
        if (!in_body || !cur || !*s || *s == '.' || starts(s, "//"))
            continue;
        if (*s == '@') { /* guard predicate */
            while (*s && !isspace((unsigned char)*s))
                s++;
            while (isspace((unsigned char)*s))
                s++;
        }
        char op[64];
        opcode(s, op, sizeof op);
        if (!op[0] || op[strlen(op) - 1] == ':') /* a label */
            continue;
        count(cur, op);
    }
}

const dev_ptx_func *dev_ptx_find(const dev_ptx_report *r, const char *name)
{
    for (int i = 0; i < r->n_funcs; i++)
        if (!strcmp(r->funcs[i].name, name))
            return &r->funcs[i];
    for (int i = 0; i < r->n_funcs; i++)
        if (starts(r->funcs[i].name, name))
            return &r->funcs[i];
    return NULL;
}
