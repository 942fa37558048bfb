/* attn_mma.c: the attention families' matrix-instruction tiling rules and
 * default search (see attn_mma.h). */
#include "attn_mma.h"

#include <stdio.h>

bool attn_mma_tile(const dev_props *p, int mma, int *tm, int *tn, int *tk, char *why,
                   size_t cap)
{
    if (kern_mma_tile(p, mma, tm, tn, tk))
        return true;
    snprintf(why, cap, "MMA=%d: %s has no such matrix instruction", mma, p->arch);
    return false;
}

/* "L+R=576" or "D=192 and R=64": the reduction dims of the scores. */
static void k_dims(const attn_mma_tiling *t, char *out, size_t cap)
{
    if (t->n_k == 1)
        snprintf(out, cap, "%s=%lld", t->k_name[0], (long long)t->k[0]);
    else
        snprintf(out, cap, "%s=%lld and %s=%lld", t->k_name[0], (long long)t->k[0],
                 t->k_name[1], (long long)t->k[1]);
}

bool attn_mma_valid(const attn_mma_tiling *t, const dev_props *p, char *why, size_t cap)
{
    int mma = t->mma, rows = t->rows, bn = t->bn, waves = t->waves;
    int tm, tn, tk;
    if (!attn_mma_tile(p, mma, &tm, &tn, &tk, why, cap))
        return false;
    if (t->stages && t->stages != 1) {
        snprintf(why, cap, "MMA=%d: STAGES=%d, the MMA path loads one key tile at a time "
                 "(STAGES=1)", mma, t->stages);
        return false;
    }
    bool k_whole = true;
    for (int i = 0; i < t->n_k; i++)
        k_whole = k_whole && t->k[i] % tk == 0;
    if (rows % tm || bn % tn || bn % tk || !k_whole) {
        char k[96];
        k_dims(t, k, sizeof k);
        snprintf(why, cap, "MMA=%d: %dx%dx%d fragments do not tile %s=%d %s x BN=%d %s over %s",
                 mma, tm, tn, tk, t->rows_name, rows, t->rows_noun, bn, t->bn_noun, k);
        return false;
    }
    int64_t out = t->out;
    int wn = out / tn < waves ? (int)(out / tn) : waves, wm = wn ? waves / wn : 0;
    if (!wn || out % ((int64_t)wn * tn) || waves % wn || rows % (wm * tm)) {
        snprintf(why, cap, "MMA=%d: WAVES=%d waves of %dx%d fragments do not tile the "
                 "%s=%d x %s=%lld output", mma, waves, tm, tn, t->rows_name, rows,
                 t->out_name, (long long)out);
        return false;
    }
    int64_t regs = (int64_t)rows * out / ((int64_t)waves * p->warp_size);
    if (regs > 128) {
        snprintf(why, cap, "MMA=%d: %lld accumulator registers per lane (%s*%s/threads, at "
                 "most 128)", mma, (long long)regs, t->rows_name, t->out_name);
        return false;
    }
    size_t limit = t->static_shared ? p->static_shared_per_block : p->shared_mem_per_block;
    if (t->shared > limit) {
        snprintf(why, cap, "MMA=%d: %s=%d, BN=%d need %zu bytes of %sshared memory, the "
                 "device allows %zu", mma, t->rows_name, rows, bn, t->shared,
                 t->static_shared ? "static " : "", limit);
        return false;
    }
    return true;
}

bool attn_scalar_valid(int64_t acc, int nt, const char *what, size_t shm, const dev_props *p,
                       char *why, size_t cap)
{
    int64_t nacc = (acc + nt - 1) / nt;
    if (nacc > 128) {
        snprintf(why, cap, "%lld accumulators per thread (%s/threads) exceed 128", (long long)nacc,
                 what);
        return false;
    }
    return attn_shared_ok(shm, p, why, cap);
}

bool attn_shared_ok(size_t shm, const dev_props *p, char *why, size_t cap)
{
    if (shm > p->shared_mem_per_block) {
        snprintf(why, cap, "needs %zu bytes of shared memory, the device has %zu", shm,
                 p->shared_mem_per_block);
        return false;
    }
    return true;
}

bool attn_mma_pick(const kern_shape *s, int64_t m, const dev_props *p,
                   bool (*valid)(const kern_shape *s, int64_t m, const kern_config *c,
                                 const dev_props *p, char *why, size_t cap),
                   const kern_config *from, int mma_param, const int *set, int n_set,
                   const int *tiles, int n_tiles, kern_config *out)
{
    int tm, tn, tk;
    if (!kern_mma_tile(p, 1, &tm, &tn, &tk))
        return false;
    char why[128];
    for (int i = 0; i < n_tiles; i++) {
        kern_config t = *from;
        for (int j = 0; j < n_set; j++)
            t.v[set[j]] = tiles[i * n_set + j];
        t.v[mma_param] = 1;
        if (valid(s, m, &t, p, why, sizeof why)) {
            *out = t;
            return true;
        }
    }
    return false;
}
