/* comgr.c: kernel resource usage from AMD code-object metadata, through
 * amd_comgr (see hip_comgr.h). Built only when ROCm is present. */
#ifdef MOETUNE_HAVE_HIP
#include "hip_comgr.h"

#include <amd_comgr.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Checks a comgr call; on failure records the expression, file and line
 * with the printf-style context, and jumps to label. */
#define COMGR_TRY(expr, err, st, label, ...)                                   \
    do {                                                                       \
        amd_comgr_status_t cs_ = (expr);                                       \
        if (cs_ != AMD_COMGR_STATUS_SUCCESS) {                                 \
            const char *cmsg_ = "unknown comgr status";                        \
            char what_[256];                                                   \
            amd_comgr_status_string(cs_, &cmsg_);                              \
            snprintf(what_, sizeof what_, __VA_ARGS__);                        \
            (st) = mt_fail_at((err), MT_E_FORMAT, __FILE__, __LINE__, #expr,   \
                              "%s: %s", what_, cmsg_);                         \
            goto label;                                                        \
        }                                                                      \
    } while (0)

static pthread_mutex_t llvm_lock = PTHREAD_MUTEX_INITIALIZER;

void hip_llvm_lock(void) { pthread_mutex_lock(&llvm_lock); }

void hip_llvm_unlock(void) { pthread_mutex_unlock(&llvm_lock); }

/* Copies a string node into buf; returns 0 when node is not a string. */
static int node_string(amd_comgr_metadata_node_t node, char *buf, size_t cap)
{
    amd_comgr_metadata_kind_t kind;
    if (amd_comgr_get_metadata_kind(node, &kind) != AMD_COMGR_STATUS_SUCCESS ||
        kind != AMD_COMGR_METADATA_KIND_STRING)
        return 0;
    size_t size = 0;
    if (amd_comgr_get_metadata_string(node, &size, NULL) != AMD_COMGR_STATUS_SUCCESS ||
        size == 0)
        return 0;
    char *tmp = malloc(size);
    if (!tmp)
        return 0;
    int ok = amd_comgr_get_metadata_string(node, &size, tmp) == AMD_COMGR_STATUS_SUCCESS;
    if (ok)
        snprintf(buf, cap, "%.*s", (int)size, tmp);
    free(tmp);
    return ok;
}

/* map[key] as text; 0 when absent. */
static int lookup_string(amd_comgr_metadata_node_t map, const char *key, char *buf,
                         size_t cap)
{
    amd_comgr_metadata_node_t v;
    if (amd_comgr_metadata_lookup(map, key, &v) != AMD_COMGR_STATUS_SUCCESS)
        return 0;
    int ok = node_string(v, buf, cap);
    amd_comgr_destroy_metadata(v);
    return ok;
}

/* map[key] as an integer; dflt when absent or not a number. */
static int64_t lookup_int(amd_comgr_metadata_node_t map, const char *key, int64_t dflt)
{
    char buf[64];
    if (!lookup_string(map, key, buf, sizeof buf))
        return dflt;
    char *end = NULL;
    long long v = strtoll(buf, &end, 0);
    return end && end != buf ? (int64_t)v : dflt;
}

static int clamp_int(int64_t v) { return v > INT32_MAX ? INT32_MAX : v < -1 ? -1 : (int)v; }

static int round_up(int v, int g) { return (v + g - 1) / g * g; }

int hip_waves_per_simd(const char *arch, int vgprs, int agprs)
{
    if (vgprs < 0)
        return -1;
    if (agprs < 0)
        agprs = 0;
    if (!strcmp(arch, "gfx90a") || !strcmp(arch, "gfx940") || !strcmp(arch, "gfx941") ||
        !strcmp(arch, "gfx942") || !strcmp(arch, "gfx950")) {
        /* One 512-entry file: AGPRs follow the VGPRs (aligned to 4), in
         * granules of 8; at most 8 waves per SIMD (CDNA2, CDNA3, CDNA4). */
        int total = round_up(round_up(vgprs, 4) + agprs, 8);
        int w = total ? 512 / total : 8;
        return w > 8 ? 8 : w;
    }
    if (!strcmp(arch, "gfx908") || !strcmp(arch, "gfx906") || !strcmp(arch, "gfx900")) {
        /* 256 VGPRs (and on gfx908 a separate 256 AGPRs), granule 4, 10 waves. */
        int used = vgprs > agprs ? vgprs : agprs;
        int total = round_up(used, 4);
        int w = total ? 256 / total : 10;
        return w > 10 ? 10 : w;
    }
    return -1;
}

/* "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-" -> "gfx90a". */
static void target_arch(const char *triple, char *out, size_t cap)
{
    const char *dash = strrchr(triple, '-');
    const char *a = dash ? dash + 1 : triple;
    size_t n = strcspn(a, ":");
    snprintf(out, cap, "%.*s", (int)n, a);
}

static void read_kernel(amd_comgr_metadata_node_t k, const char *arch, dev_kernel_res *r)
{
    memset(r, 0, sizeof *r);
    if (!lookup_string(k, ".name", r->name, sizeof r->name))
        snprintf(r->name, sizeof r->name, "?");
    r->vgprs = clamp_int(lookup_int(k, ".vgpr_count", -1));
    r->sgprs = clamp_int(lookup_int(k, ".sgpr_count", -1));
    r->agprs = clamp_int(lookup_int(k, ".agpr_count", 0)); /* absent before gfx908 */
    r->spill_vgprs = clamp_int(lookup_int(k, ".vgpr_spill_count", -1));
    r->spill_sgprs = clamp_int(lookup_int(k, ".sgpr_spill_count", -1));
    r->lds_bytes = lookup_int(k, ".group_segment_fixed_size", -1);
    r->private_bytes = lookup_int(k, ".private_segment_fixed_size", -1);
    r->max_threads = clamp_int(lookup_int(k, ".max_flat_workgroup_size", -1));
    r->waves_per_simd = hip_waves_per_simd(arch, r->vgprs, r->agprs);
}

/* The parsed metadata of one code object. */
typedef struct code_md {
    amd_comgr_data_t data;
    amd_comgr_metadata_node_t root, kernels;
    int have_data, have_root, have_kernels;
    size_t n_kernels;
    char arch[64];
} code_md;

static void md_close(code_md *m)
{
    if (m->have_kernels)
        amd_comgr_destroy_metadata(m->kernels);
    if (m->have_root)
        amd_comgr_destroy_metadata(m->root);
    if (m->have_data)
        amd_comgr_release_data(m->data);
}

/* On failure m is closed again. */
static mt_status md_open(code_md *m, const void *bytes, size_t len, mt_err *err)
{
    mt_status st = MT_OK;
    memset(m, 0, sizeof *m);
    const unsigned char *b = bytes;
    if (len < 20 || memcmp(b, "\177ELF", 4) != 0)
        return mt_fail(err, MT_E_FORMAT, "code object of %zu bytes is not an ELF file",
                       len);
    uint16_t e_type = (uint16_t)(b[16] | (b[17] << 8));
    amd_comgr_data_kind_t kind =
        e_type == 1 ? AMD_COMGR_DATA_KIND_RELOCATABLE : AMD_COMGR_DATA_KIND_EXECUTABLE;

    COMGR_TRY(amd_comgr_create_data(kind, &m->data), err, st, fail, "code object");
    m->have_data = 1;
    COMGR_TRY(amd_comgr_set_data(m->data, len, bytes), err, st, fail, "code object");
    COMGR_TRY(amd_comgr_get_data_metadata(m->data, &m->root), err, st, fail,
              "code object metadata");
    m->have_root = 1;
    char triple[128];
    if (lookup_string(m->root, "amdhsa.target", triple, sizeof triple))
        target_arch(triple, m->arch, sizeof m->arch);
    COMGR_TRY(amd_comgr_metadata_lookup(m->root, "amdhsa.kernels", &m->kernels), err, st,
              fail, "code object metadata has no amdhsa.kernels");
    m->have_kernels = 1;
    COMGR_TRY(amd_comgr_get_metadata_list_size(m->kernels, &m->n_kernels), err, st, fail,
              "amdhsa.kernels");
    return MT_OK;
fail:
    md_close(m);
    return st;
}

static mt_status inspect_locked(const void *bytes, size_t len, dev_code_info *info,
                                char *target, size_t target_cap, mt_err *err)
{
    info->n_kernels = 0;
    if (target && target_cap)
        target[0] = 0;
    code_md m;
    mt_status st = md_open(&m, bytes, len, err);
    if (st != MT_OK)
        return st;
    if (target && target_cap)
        snprintf(target, target_cap, "%s", m.arch);
    for (size_t i = 0; i < m.n_kernels && info->n_kernels < DEV_MAX_KERNELS_PER_CODE; i++) {
        amd_comgr_metadata_node_t k;
        COMGR_TRY(amd_comgr_index_list_metadata(m.kernels, i, &k), err, st, out,
                  "amdhsa.kernels entry");
        read_kernel(k, m.arch, &info->kernels[info->n_kernels++]);
        amd_comgr_destroy_metadata(k);
    }
out:
    md_close(&m);
    return st;
}

static int count_explicit_args(amd_comgr_metadata_node_t k)
{
    amd_comgr_metadata_node_t args;
    if (amd_comgr_metadata_lookup(k, ".args", &args) != AMD_COMGR_STATUS_SUCCESS)
        return 0;
    size_t n = 0;
    int count = 0;
    if (amd_comgr_get_metadata_list_size(args, &n) == AMD_COMGR_STATUS_SUCCESS)
        for (size_t i = 0; i < n; i++) {
            amd_comgr_metadata_node_t a;
            if (amd_comgr_index_list_metadata(args, i, &a) != AMD_COMGR_STATUS_SUCCESS)
                continue;
            char kind[64] = "";
            lookup_string(a, ".value_kind", kind, sizeof kind);
            if (strncmp(kind, "hidden_", 7) != 0)
                count++;
            amd_comgr_destroy_metadata(a);
        }
    amd_comgr_destroy_metadata(args);
    return count;
}

static mt_status count_args_locked(const void *bytes, size_t len, const char *name,
                                   int *n, mt_err *err)
{
    *n = -1;
    code_md m;
    mt_status st = md_open(&m, bytes, len, err);
    if (st != MT_OK)
        return st;
    for (size_t i = 0; i < m.n_kernels && *n < 0; i++) {
        amd_comgr_metadata_node_t k;
        COMGR_TRY(amd_comgr_index_list_metadata(m.kernels, i, &k), err, st, out,
                  "amdhsa.kernels entry");
        char kname[256] = "";
        if (lookup_string(k, ".name", kname, sizeof kname) && !strcmp(kname, name))
            *n = count_explicit_args(k);
        amd_comgr_destroy_metadata(k);
    }
    if (*n < 0)
        st = mt_fail(err, MT_E_NOT_FOUND, "kernel %s is not in the code object", name);
out:
    md_close(&m);
    return st;
}

mt_status hip_comgr_inspect(const void *bytes, size_t len, dev_code_info *info,
                            char *target, size_t target_cap, mt_err *err)
{
    hip_llvm_lock();
    mt_status st = inspect_locked(bytes, len, info, target, target_cap, err);
    hip_llvm_unlock();
    return st;
}

mt_status hip_comgr_count_args(const void *bytes, size_t len, const char *name, int *n,
                               mt_err *err)
{
    hip_llvm_lock();
    mt_status st = count_args_locked(bytes, len, name, n, err);
    hip_llvm_unlock();
    return st;
}

#endif /* MOETUNE_HAVE_HIP */
