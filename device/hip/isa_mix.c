/* isa_mix.c: instruction mix of AMD code objects from llvm-objdump's
 * disassembly (see isa_mix.h). */
#define _GNU_SOURCE /* mkstemp, popen */
#include "isa_mix.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const class_names[DEV_ISA_N_CLASSES] = {
    [DEV_ISA_MFMA] = "mfma",         [DEV_ISA_VALU] = "valu",
    [DEV_ISA_SALU] = "salu",         [DEV_ISA_SMEM] = "smem",
    [DEV_ISA_GLOBAL_LOAD] = "global_load", [DEV_ISA_GLOBAL_STORE] = "global_store",
    [DEV_ISA_ATOMIC] = "atomic",     [DEV_ISA_LDS_READ] = "lds_read",
    [DEV_ISA_LDS_WRITE] = "lds_write", [DEV_ISA_LDS_OTHER] = "lds_other",
    [DEV_ISA_SCRATCH] = "scratch",   [DEV_ISA_WAIT] = "wait",
    [DEV_ISA_BARRIER] = "barrier",   [DEV_ISA_BRANCH] = "branch",
    [DEV_ISA_OTHER] = "other",
};

const char *dev_isa_class_name(dev_isa_class c)
{
    return c >= 0 && c < DEV_ISA_N_CLASSES ? class_names[c] : "?";
}

static bool starts(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

static bool any_prefix(const char *s, const char *const *ps)
{
    for (; *ps; ps++)
        if (starts(s, *ps))
            return true;
    return false;
}

dev_isa_class dev_isa_classify(const char *m)
{
    static const char *const mma[] = {"v_mfma", "v_smfmac", "v_wmma", "v_swmmac", NULL};
    static const char *const gl[] = {"global_load", "buffer_load", "flat_load", NULL};
    static const char *const gs[] = {"global_store", "buffer_store", "flat_store", NULL};
    static const char *const at[] = {"global_atomic", "buffer_atomic", "flat_atomic", NULL};
    static const char *const br[] = {"s_branch", "s_cbranch", "s_setpc", "s_swappc", NULL};
    if (any_prefix(m, mma))
        return DEV_ISA_MFMA;
    if (starts(m, "v_"))
        return DEV_ISA_VALU;
    if (any_prefix(m, gl))
        return DEV_ISA_GLOBAL_LOAD;
    if (any_prefix(m, gs))
        return DEV_ISA_GLOBAL_STORE;
    if (any_prefix(m, at))
        return DEV_ISA_ATOMIC;
    if (starts(m, "ds_read") || starts(m, "ds_load"))
        return DEV_ISA_LDS_READ;
    if (starts(m, "ds_write") || starts(m, "ds_store"))
        return DEV_ISA_LDS_WRITE;
    if (starts(m, "ds_"))
        return DEV_ISA_LDS_OTHER;
    if (starts(m, "scratch_"))
        return DEV_ISA_SCRATCH;
    if (starts(m, "s_waitcnt") || starts(m, "s_wait_"))
        return DEV_ISA_WAIT;
    if (!strcmp(m, "s_barrier"))
        return DEV_ISA_BARRIER;
    if (any_prefix(m, br))
        return DEV_ISA_BRANCH;
    if (starts(m, "s_load") || starts(m, "s_buffer_load"))
        return DEV_ISA_SMEM;
    if (starts(m, "s_"))
        return DEV_ISA_SALU;
    return DEV_ISA_OTHER;
}

/* ---- parsing ------------------------------------------------------------------ */

typedef struct insn {
    uint64_t addr;
    uint64_t target; /* branch target; UINT64_MAX when none */
    dev_isa_class cls;
    bool vm0;        /* s_waitcnt vmcnt(0): waits for every vector-memory access */
} insn;

typedef struct func_buf {
    insn *v;
    int n, cap;
} func_buf;

static void count_range(const insn *v, int first, int last, dev_isa_counts *c)
{
    memset(c, 0, sizeof *c);
    for (int i = first; i <= last; i++) {
        c->n[v[i].cls]++;
        c->total++;
    }
}

/* Full vector-memory waits from first up to the first matrix instruction
 * of [first, last] (0 when there is none). */
static int vm0_before_mma(const insn *v, int first, int last)
{
    int n = 0;
    for (int i = first; i <= last; i++) {
        if (v[i].cls == DEV_ISA_MFMA)
            return n;
        n += v[i].vm0;
    }
    return 0;
}

static int index_of(const func_buf *b, uint64_t addr)
{
    for (int i = 0; i < b->n; i++)
        if (b->v[i].addr == addr)
            return i;
    return -1;
}

/* Totals, loops (backward branches) and the hot loop of one function. */
static void finish_func(const func_buf *b, dev_isa_func *f)
{
    if (b->n)
        count_range(b->v, 0, b->n - 1, &f->all);
    f->n_loops = 0;
    f->hot = -1;
    for (int i = 0; i < b->n && f->n_loops < DEV_ISA_MAX_LOOPS; i++) {
        if (b->v[i].target == UINT64_MAX || b->v[i].target > b->v[i].addr)
            continue;
        int first = index_of(b, b->v[i].target);
        if (first < 0)
            continue;
        dev_isa_loop *l = &f->loops[f->n_loops++];
        l->first = first;
        l->last = i;
        count_range(b->v, first, i, &l->c);
        l->vm0_before_mma = vm0_before_mma(b->v, first, i);
    }
    for (int i = 0; i < f->n_loops; i++) {
        dev_isa_loop *l = &f->loops[i];
        l->depth = 1;
        for (int j = 0; j < f->n_loops; j++) {
            const dev_isa_loop *o = &f->loops[j];
            bool inside = o->first <= l->first && l->last <= o->last &&
                          (o->last - o->first > l->last - l->first || j < i);
            l->depth += j != i && inside;
        }
    }
    int best_mma = 0;
    for (int i = 0; i < f->n_loops; i++) {
        const dev_isa_loop *l = &f->loops[i], *h = f->hot >= 0 ? &f->loops[f->hot] : NULL;
        int mma = l->c.n[DEV_ISA_MFMA];
        if (mma > best_mma || (mma == best_mma && mma > 0 && h && l->depth > h->depth)) {
            best_mma = mma;
            f->hot = i;
        }
    }
    if (best_mma > 0)
        return;
    /* No matrix instructions: a memory-streaming kernel's hot loop is the
     * innermost one that holds at least half of the most global loads any
     * loop holds (an outer loop around it also counts the loads of what
     * it does once per pass, e.g. a decode of activations); without loads,
     * the largest loop. */
    int most_ld = 0;
    for (int i = 0; i < f->n_loops; i++)
        most_ld = f->loops[i].c.n[DEV_ISA_GLOBAL_LOAD] > most_ld
                      ? f->loops[i].c.n[DEV_ISA_GLOBAL_LOAD]
                      : most_ld;
    for (int i = 0; i < f->n_loops; i++) {
        const dev_isa_loop *l = &f->loops[i], *h = f->hot >= 0 ? &f->loops[f->hot] : NULL;
        int ld = l->c.n[DEV_ISA_GLOBAL_LOAD];
        bool better = most_ld > 0
                          ? 2 * ld >= most_ld &&
                                (!h || l->depth > h->depth ||
                                 (l->depth == h->depth && ld > h->c.n[DEV_ISA_GLOBAL_LOAD]))
                          : !h || l->c.total > h->c.total;
        if (better)
            f->hot = i;
    }
}

/* "0000000000001d00 <name>:" → true with the address and the name. */
static bool func_header(const char *line, uint64_t *addr, char *name, size_t cap)
{
    char *end;
    unsigned long long a = strtoull(line, &end, 16);
    if (end == line || end[0] != ' ' || end[1] != '<')
        return false;
    const char *n = end + 2, *close = strstr(n, ">:");
    if (!close || close[2] != 0)
        return false;
    size_t len = (size_t)(close - n);
    if (len >= cap)
        len = cap - 1;
    memcpy(name, n, len);
    name[len] = 0;
    *addr = a;
    return true;
}

/* "\tmnemonic operands // 000000001D00: C00A... <name+0x120c>" */
static bool insn_line(const char *line, uint64_t fstart, insn *out, char *mn_out, size_t cap)
{
    const char *p = line;
    while (*p == ' ' || *p == '\t')
        p++;
    if (p == line || !*p || !((*p >= 'a' && *p <= 'z') || *p == '_'))
        return false;
    char mn[64];
    size_t k = 0;
    while (p[k] && p[k] != ' ' && p[k] != '\t' && k + 1 < sizeof mn) {
        mn[k] = p[k];
        k++;
    }
    mn[k] = 0;
    const char *cm = strstr(p, "// ");
    if (!cm)
        return false;
    char *end;
    unsigned long long a = strtoull(cm + 3, &end, 16);
    if (end == cm + 3 || *end != ':')
        return false;
    out->addr = a;
    out->cls = dev_isa_classify(mn);
    out->vm0 = out->cls == DEV_ISA_WAIT && strstr(p, "vmcnt(0)") && strstr(p, "vmcnt(0)") < cm;
    snprintf(mn_out, cap, "%s", mn);
    out->target = UINT64_MAX;
    if (out->cls == DEV_ISA_BRANCH && (starts(mn, "s_branch") || starts(mn, "s_cbranch"))) {
        const char *t = strrchr(end, '<');
        const char *plus = t ? strstr(t, "+0x") : NULL;
        if (plus)
            out->target = fstart + strtoull(plus + 3, NULL, 16);
        else if (t) /* "<name>": the function's first instruction */
            out->target = fstart;
    }
    return true;
}

static void note_mma_kind(dev_isa_func *f, const char *mn)
{
    for (int i = 0; i < f->n_mma_kinds; i++)
        if (!strcmp(f->mma_kind[i], mn)) {
            f->mma_kind_n[i]++;
            return;
        }
    if (f->n_mma_kinds == DEV_ISA_MAX_MMA_KINDS)
        return;
    snprintf(f->mma_kind[f->n_mma_kinds], sizeof f->mma_kind[0], "%s", mn);
    f->mma_kind_n[f->n_mma_kinds++] = 1;
}

void dev_isa_parse(const char *text, dev_isa_report *out)
{
    memset(out, 0, sizeof *out);
    func_buf b = {0};
    dev_isa_func *cur = NULL;
    uint64_t fstart = 0;
    const char *p = text;
    char line[1024];
    while (p && *p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        size_t cp = len < sizeof line ? len : sizeof line - 1;
        memcpy(line, p, cp);
        line[cp] = 0;
        p = nl ? nl + 1 : NULL;
        char name[96];
        uint64_t a;
        if (func_header(line, &a, name, sizeof name)) {
            if (cur)
                finish_func(&b, cur);
            b.n = 0;
            cur = NULL;
            if (out->n_funcs < DEV_MAX_KERNELS_PER_CODE) {
                cur = &out->funcs[out->n_funcs++];
                snprintf(cur->name, sizeof cur->name, "%s", name);
                cur->hot = -1;
                fstart = a;
            }
            continue;
        }
        insn in;
        char mn[64];
        if (!cur || !insn_line(line, fstart, &in, mn, sizeof mn))
            continue;
        if (in.cls == DEV_ISA_MFMA)
            note_mma_kind(cur, mn);
        if (b.n == b.cap) {
            int cap = b.cap ? 2 * b.cap : 1024;
            insn *v = realloc(b.v, sizeof *v * (size_t)cap);
            if (!v)
                break;
            b.v = v;
            b.cap = cap;
        }
        b.v[b.n++] = in;
    }
    if (cur)
        finish_func(&b, cur);
    free(b.v);
}

const dev_isa_func *dev_isa_find(const dev_isa_report *r, const char *name)
{
    for (int i = 0; i < r->n_funcs; i++)
        if (!strcmp(r->funcs[i].name, name))
            return &r->funcs[i];
    for (int i = 0; i < r->n_funcs; i++)
        if (starts(r->funcs[i].name, name))
            return &r->funcs[i];
    return NULL;
}

/* ---- running llvm-objdump ------------------------------------------------------------ */

static const char *find_objdump(void)
{
    static const char *const names[] = {"llvm-objdump-19", "llvm-objdump-20", "llvm-objdump"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", names[i]);
        if (system(cmd) == 0)
            return names[i];
    }
    return NULL;
}

static bool arch_ok(const char *arch)
{
    if (!arch || strncmp(arch, "gfx", 3) || strlen(arch) > 32)
        return false;
    for (const char *c = arch; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == ':' ||
              *c == '+'))
            return false;
    return true;
}

mt_status dev_isa_mix(const void *code, size_t len, const char *arch, dev_isa_report *out,
                      mt_err *err)
{
    memset(out, 0, sizeof *out);
    const unsigned char *b = code;
    /* ELF, 64-bit, machine EM_AMDGPU (224) */
    if (len < 20 || memcmp(b, "\177ELF", 4) || b[4] != 2 || b[18] != 224 || b[19] != 0)
        return mt_fail(err, MT_E_UNSUPPORTED, "instruction mix: the code object is not AMD GPU "
                       "ELF (NVIDIA cubins have no disassembler here)");
    if (!arch_ok(arch))
        return mt_fail(err, MT_E_INVALID, "instruction mix: '%s' is not an AMD processor name",
                       arch ? arch : "(null)");
    const char *tool = find_objdump();
    if (!tool)
        return mt_fail(err, MT_E_UNSUPPORTED, "instruction mix: no llvm-objdump-19, "
                       "llvm-objdump-20 or llvm-objdump on PATH (Debian: apt install llvm-19)");
    const char *tmp = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/moetune-isa-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0)
        return mt_fail(err, MT_E_IO, "instruction mix: cannot create a file in %s",
                       tmp && *tmp ? tmp : "/tmp");
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, b + done, len - done);
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    close(fd);
    mt_status st = MT_OK;
    char cmd[768];
    snprintf(cmd, sizeof cmd, "%s -d --mcpu=%s '%s' 2>&1", tool, arch, path);
    FILE *pp = done == len ? popen(cmd, "r") : NULL;
    size_t cap = 1 << 20, n = 0;
    char *text = pp ? malloc(cap) : NULL;
    while (text) {
        if (cap - n < 4096) {
            char *t = realloc(text, cap *= 2);
            if (!t) {
                free(text);
                text = NULL;
                break;
            }
            text = t;
        }
        size_t r = fread(text + n, 1, cap - n - 1, pp);
        if (r == 0)
            break;
        n += r;
    }
    int rc = pp ? pclose(pp) : -1;
    unlink(path);
    if (!text || rc != 0) {
        if (text)
            text[n] = 0;
        st = mt_fail(err, MT_E_IO, "instruction mix: %s failed on the code object%s%.300s",
                     tool, text ? ": " : "", text ? text : "");
    } else {
        text[n] = 0;
        dev_isa_parse(text, out);
        if (out->n_funcs == 0)
            st = mt_fail(err, MT_E_IO, "instruction mix: %s printed no functions", tool);
    }
    free(text);
    return st;
}
