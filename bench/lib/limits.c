/* limits.c: bandwidth and compute-peak probes compiled for the machine
 * (see limits.h). */
#include "limits.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "kernels/core/runner.h"

/* Compiled by the cpu backend (-march=native): 64-byte vectors where the
 * CPU has AVX-512, 32-byte otherwise. */
static const char probe_src[] =
    "#if defined(__AVX512F__)\n"
    "#define VW 16\n"
    "#else\n"
    "#define VW 8\n"
    "#endif\n"
    "typedef float mt_vf __attribute__((vector_size(VW * 4)));\n"
    "/* Compute peaks: each work item runs iters steps of 12 independent\n"
    " * vector chains of one instruction; out[1000 + k] gets the multiply-adds\n"
    " * one instruction does (0: the CPU lacks it). */\n"
    "MT_CPU_KERNEL void peak_fma(float *out, int iters)\n"
    "{\n"
    "    mt_vf a[12], m, c;\n"
    "    for (int k = 0; k < VW; k++) { m[k] = 0.999f; c[k] = 0.001f * (k + 1); }\n"
    "    for (int j = 0; j < 12; j++) a[j] = c + (float)j;\n"
    "    for (int i = 0; i < iters; i++)\n"
    "#pragma GCC unroll 12\n"
    "        for (int j = 0; j < 12; j++) a[j] = a[j] * m + c;\n"
    "    float s = 0.0f;\n"
    "    for (int j = 0; j < 12; j++) for (int k = 0; k < VW; k++) s += a[j][k];\n"
    "    out[itemIdx.x] = s;\n"
    "    if (itemIdx.x == 0) out[1000] = VW;\n"
    "}\n"
    "#if defined(__x86_64__)\n"
    "#include <immintrin.h>\n"
    "#endif\n"
    "/* vdpbf16ps: 16 lanes x 2 bf16 multiply-adds. */\n"
    "MT_CPU_KERNEL void peak_bf16(float *out, int iters)\n"
    "{\n"
    "#if defined(__AVX512F__) && defined(__AVX512BF16__)\n"
    "    __m512 a[12];\n"
    "    __m512i x = _mm512_set1_epi32(0x3f7f3f7f), y = _mm512_set1_epi32(0x3a803a80);\n"
    "    for (int j = 0; j < 12; j++) a[j] = _mm512_set1_ps((float)j);\n"
    "    for (int i = 0; i < iters; i++) {\n"
    "#pragma GCC unroll 12\n"
    "        for (int j = 0; j < 12; j++) a[j] = _mm512_dpbf16_ps(a[j], (__m512bh)x, (__m512bh)y);\n"
    "        __asm__ volatile(\"\" : \"+v\"(x));\n"
    "    }\n"
    "    float s = 0.0f;\n"
    "    for (int j = 0; j < 12; j++) s += _mm512_reduce_add_ps(a[j]);\n"
    "    out[itemIdx.x] = s;\n"
    "    if (itemIdx.x == 0) out[1001] = 32;\n"
    "#else\n"
    "    (void)iters;\n"
    "    if (itemIdx.x == 0) out[1001] = 0;\n"
    "#endif\n"
    "}\n"
    "/* u8 x s8 dot products into int32 lanes, as the integer MoE tiles run\n"
    " * them: vpdpbusd (VNNI, 4 per lane), else vpmaddubsw + vpmaddwd + add. */\n"
    "MT_CPU_KERNEL void peak_i8(float *out, int iters)\n"
    "{\n"
    "#if defined(__AVX512F__) && defined(__AVX512BW__)\n"
    "    __m512i a[12], x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-2);\n"
    "#ifndef __AVX512VNNI__\n"
    "    const __m512i one = _mm512_set1_epi16(1);\n"
    "#endif\n"
    "    for (int j = 0; j < 12; j++) a[j] = _mm512_set1_epi32(j);\n"
    "    for (int i = 0; i < iters; i++) {\n"
    "#pragma GCC unroll 12\n"
    "        for (int j = 0; j < 12; j++)\n"
    "#ifdef __AVX512VNNI__\n"
    "            a[j] = _mm512_dpbusd_epi32(a[j], x, y);\n"
    "#else\n"
    "            a[j] = _mm512_add_epi32(a[j], _mm512_madd_epi16(_mm512_maddubs_epi16(x, y), one));\n"
    "#endif\n"
    "        __asm__ volatile(\"\" : \"+v\"(x));\n"
    "    }\n"
    "    long s = 0;\n"
    "    for (int j = 0; j < 12; j++) s += _mm512_reduce_add_epi32(a[j]);\n"
    "    out[itemIdx.x] = (float)s;\n"
    "    if (itemIdx.x == 0) out[1002] = 64;\n"
    "#elif defined(__AVX2__)\n"
    "    __m256i a[12], x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(-2);\n"
    "    const __m256i one = _mm256_set1_epi16(1);\n"
    "    for (int j = 0; j < 12; j++) a[j] = _mm256_set1_epi32(j);\n"
    "    for (int i = 0; i < iters; i++) {\n"
    "#pragma GCC unroll 12\n"
    "        for (int j = 0; j < 12; j++)\n"
    "            a[j] = _mm256_add_epi32(a[j], _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), one));\n"
    "        __asm__ volatile(\"\" : \"+v\"(x));\n"
    "    }\n"
    "    int s = 0;\n"
    "    for (int j = 0; j < 12; j++) { int t[8]; _mm256_storeu_si256((__m256i *)t, a[j]);\n"
    "        for (int k = 0; k < 8; k++) s += t[k]; }\n"
    "    out[itemIdx.x] = (float)s;\n"
    "    if (itemIdx.x == 0) out[1002] = 32;\n"
    "#else\n"
    "    (void)iters;\n"
    "    if (itemIdx.x == 0) out[1002] = 0;\n"
    "#endif\n"
    "}\n"
    "/* AMX tdpbf16ps (16 x 16 x 32 bf16 multiply-adds into fp32 tiles), where\n"
    " * the cpu backend compiled with AMX: four independent sums from two A\n"
    " * and two B tiles, 12 tile ops per iters / 8 steps (out[1003]: 8192 / 8\n"
    " * multiply-adds per op and step). */\n"
    "MT_CPU_KERNEL void peak_amx_bf16(float *out, int iters)\n"
    "{\n"
    "#if defined(__AMX_TILE__) && defined(__AMX_BF16__)\n"
    "    struct { unsigned char palette, start, res[14]; unsigned short colsb[16];\n"
    "             unsigned char rows[16]; } cfg;\n"
    "    memset(&cfg, 0, sizeof cfg);\n"
    "    cfg.palette = 1;\n"
    "    for (int i = 0; i < 8; i++) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }\n"
    "    _Alignas(64) unsigned short ab[16 * 32];\n"
    "    _Alignas(64) float c[16 * 16];\n"
    "    for (int i = 0; i < 16 * 32; i++) ab[i] = 0x3a80; /* 2^-10 */\n"
    "    _tile_loadconfig(&cfg);\n"
    "    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);\n"
    "    _tile_loadd(4, ab, 64); _tile_loadd(5, ab, 64);\n"
    "    _tile_loadd(6, ab, 64); _tile_loadd(7, ab, 64);\n"
    "    for (int i = 0; i < iters / 8; i++) {\n"
    "        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6);\n"
    "        _tile_dpbf16ps(3, 5, 7); _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);\n"
    "        _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); _tile_dpbf16ps(0, 4, 6);\n"
    "        _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);\n"
    "    }\n"
    "    _tile_stored(0, c, 64);\n"
    "    _tile_release();\n"
    "    out[itemIdx.x] = c[0];\n"
    "    if (itemIdx.x == 0) out[1003] = 8192 / 8;\n"
    "#else\n"
    "    (void)iters;\n"
    "    if (itemIdx.x == 0) out[1003] = 0;\n"
    "#endif\n"
    "}\n"
    "/* The sum of bytes at p (a multiple of ns x 8 vectors, any alignment)\n"
    " * read as ns interleaved sequential streams, each with a software\n"
    " * prefetch pf bytes ahead (0: none) and one line of each 4 KiB page pg\n"
    " * bytes ahead (0: none), as a kernel may. Eight independent vector\n"
    " * accumulators: loads, not add latency, bound it. */\n"
    "typedef float mt_vfu __attribute__((vector_size(VW * 4), aligned(4)));\n"
    "MT_INLINE float read_streams(const char *at, long bytes, int ns, int pf, int pg)\n"
    "{\n"
    "    mt_vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};\n"
    "    const mt_vfu *base = (const mt_vfu *)at;\n"
    "    long n = bytes / (VW * 4) / ns;\n"
    "    for (long i = 0; i + 8 <= n; i += 8)\n"
    "        for (int s = 0; s < ns; s++) {\n"
    "            const mt_vfu *p = base + (long)s * n + i;\n"
    "            if (pf) {\n"
    "                const char *q = (const char *)p + pf;\n"
    "                for (int c = 0; c < 8 * VW * 4; c += 64) __builtin_prefetch(q + c);\n"
    "            }\n"
    "            if (pg) {\n"
    "                unsigned long q = (unsigned long)p + pg + 8 * VW * 4;\n"
    "                if ((q & 4095) < 8 * VW * 4)\n"
    "                    __builtin_prefetch((const char *)(q & ~4095ul), 0, 1);\n"
    "            }\n"
    "            a0 += p[0]; a1 += p[1]; a2 += p[2]; a3 += p[3];\n"
    "            a4 += p[4]; a5 += p[5]; a6 += p[6]; a7 += p[7];\n"
    "        }\n"
    "    mt_vf a = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;\n"
    "    float s = 0.0f;\n"
    "    for (int k = 0; k < VW; k++) s += a[k];\n"
    "    return s;\n"
    "}\n"
    "/* The bandwidth probe: work item i reads chunk floats from x + i chunk. */\n"
    "MT_CPU_KERNEL void stream_sum(float *out, const float *x, long chunk, int ns, int pf,\n"
    "                              int pg)\n"
    "{\n"
    "    out[itemIdx.x] =\n"
    "        read_streams((const char *)(x + (long)itemIdx.x * chunk), chunk * 4, ns, pf, pg);\n"
    "}\n"
    "/* A kernel's access pattern without its arithmetic: work item i reads\n"
    " * len[i] bytes from at[i]. */\n"
    "MT_CPU_KERNEL void stream_pieces(float *sums, const char *const *at, const long *len, int ns,\n"
    "                                 int pf, int pg)\n"
    "{\n"
    "    sums[itemIdx.x] = read_streams(at[itemIdx.x], len[itemIdx.x], ns, pf, pg);\n"
    "}\n";

/* The GPU probe (hip, cuda): the device's own kernels on the same
 * compiler and prelude as the families, rather than the driver's copy
 * engine, whose rate a kernel never sees. A grid of 8 blocks of 256 per
 * compute unit; each thread keeps four 16-byte loads in flight per step
 * (the weights' read-once path, mt_load16_nt). bench_read folds what it
 * read into one word and stores it only when that word is a value a
 * zeroed buffer never gives, so no load can be dropped; bench_copy
 * copies the first n16 16-byte words to dst. */
static const char gpu_probe_src[] =
    "MT_DEVICE unsigned bench_fold(mt_u32x4 v) { return v.x ^ v.y ^ v.z ^ v.w; }\n"
    "MT_KERNEL __launch_bounds__(256) void bench_read(const void *src, long n16, unsigned *out)\n"
    "{\n"
    "    const mt_u32x4 *p = (const mt_u32x4 *)src;\n"
    "    const long stride = (long)gridDim.x * 256;\n"
    "    long i = (long)blockIdx.x * 256 + threadIdx.x;\n"
    "    unsigned acc = 0;\n"
    "    for (; i + 3 * stride < n16; i += 4 * stride) {\n"
    "        mt_u32x4 a = mt_load16_nt(p + i), b = mt_load16_nt(p + i + stride);\n"
    "        mt_u32x4 c = mt_load16_nt(p + i + 2 * stride), d = mt_load16_nt(p + i + 3 * stride);\n"
    "        acc ^= bench_fold(a) ^ bench_fold(b) ^ bench_fold(c) ^ bench_fold(d);\n"
    "    }\n"
    "    for (; i < n16; i += stride)\n"
    "        acc ^= bench_fold(mt_load16_nt(p + i));\n"
    "    if (acc == 0x9e3779b9u)\n"
    "        out[0] = acc;\n"
    "}\n"
    "MT_KERNEL __launch_bounds__(256) void bench_copy(const void *src, void *dst, long n16)\n"
    "{\n"
    "    const mt_u32x4 *p = (const mt_u32x4 *)src;\n"
    "    mt_u32x4 *q = (mt_u32x4 *)dst;\n"
    "    const long stride = (long)gridDim.x * 256;\n"
    "    long i = (long)blockIdx.x * 256 + threadIdx.x;\n"
    "    for (; i + 3 * stride < n16; i += 4 * stride) {\n"
    "        mt_u32x4 a = mt_load16_nt(p + i), b = mt_load16_nt(p + i + stride);\n"
    "        mt_u32x4 c = mt_load16_nt(p + i + 2 * stride), d = mt_load16_nt(p + i + 3 * stride);\n"
    "        q[i] = a;\n"
    "        q[i + stride] = b;\n"
    "        q[i + 2 * stride] = c;\n"
    "        q[i + 3 * stride] = d;\n"
    "    }\n"
    "    for (; i < n16; i += stride)\n"
    "        q[i] = mt_load16_nt(p + i);\n"
    "}\n";

const char *bench_limits_gpu_source(void)
{
    return gpu_probe_src;
}

/* Work items of a probe launch: 2 MiB each of a 1 GiB slice. With 64 (16
 * MiB each) a thread sat idle for up to one item at the end and the probe
 * read 7-10 % below what 512 items read in the same run (Zen 5 VM: 69-74
 * against 78-79 GB/s, the kernels' times unchanged), which overstated
 * every fraction by as much. */
enum { ITEMS = 512 };
#define SLICE ((size_t)1 << 30) /* a sample's read */

struct bench_limits {
    dev_device *dev;
    const dev_props *props;
    dev_code *code;
    dev_module *mod;
    dev_kernel *fma, *bf16, *i8, *amx, *sum, *pieces;
    void *piece_at, *piece_len, *piece_sum; /* BENCH_MAX_PIECES of each */
    bench_peaks peaks; /* the best of every peak probe so far */
    float *out;       /* 4096 bytes: per-item sums, [1000] the vector width */
    float *big;       /* streamed for bandwidth, and to flush caches */
    size_t big_bytes;
    int best[2];      /* the two read patterns fastest at the last probe */
    int slice;        /* the slice of big the next sample reads */
    int n_slices;     /* big_bytes / SLICE */
    /* GPU backends: the probe kernels (NULL where they could not be built:
     * then device-to-device copies, gpu_why says why), their buffer (read
     * whole, or its first half copied to its second), events, and the
     * last bench_limits_bandwidth's median per kernel (GB/s). */
    dev_kernel *gread, *gcopy;
    void *gbuf;
    dev_event *g0, *g1;
    unsigned grid;
    int gbest;        /* 0 read, 1 copy: the faster at the last probe */
    double gmed[2];
    char gpu_why[160];
};

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void bench_spread_of(double *v, int n, bench_spread *out)
{
    memset(out, 0, sizeof *out);
    if (n <= 0)
        return;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    /* Nearest-rank percentiles, interpolated. */
    double q[3] = {0.1, 0.5, 0.9}, r[3];
    for (int i = 0; i < 3; i++) {
        double pos = q[i] * (n - 1);
        int lo = (int)pos, hi = lo + 1 < n ? lo + 1 : lo;
        r[i] = v[lo] + (v[hi] - v[lo]) * (pos - lo);
    }
    *out = (bench_spread){r[0], r[1], r[2], n, v[n - 1]};
}

void bench_paired_fraction(const double *bytes, const double *ms, const double *limit, int n,
                           bench_spread *out)
{
    double *r = n > 0 ? malloc(sizeof *r * (size_t)n) : NULL;
    int k = 0;
    for (int i = 0; r && i < n; i++)
        if (limit[i] > 0 && ms[i] > 0)
            r[k++] = bytes[i] / (ms[i] * 1e6) / limit[i];
    bench_spread_of(r, k, out);
    free(r);
}

/* The GPU probe's kernels and buffer (GPU_BYTES); on any failure none of
 * them, and gpu_why says why (the probes then time driver copies). */
#define GPU_BYTES ((size_t)1 << 30)

static void gpu_open(bench_limits *l)
{
    mt_err e = MT_ERR_INIT;
    dev_compile_req req = {.name = "bench_limits.hip", .source = gpu_probe_src};
    l->grid = (unsigned)(l->props->compute_units > 0 ? l->props->compute_units : 1) * 8;
    if (dev_compile(l->dev, &req, &l->code, &e) != MT_OK ||
        dev_module_load(l->dev, l->code, &l->mod, &e) != MT_OK ||
        dev_module_get_kernel(l->mod, "bench_read", "plp", &l->gread, &e) != MT_OK ||
        dev_module_get_kernel(l->mod, "bench_copy", "ppl", &l->gcopy, &e) != MT_OK ||
        dev_alloc(l->dev, GPU_BYTES, &l->gbuf, &e) != MT_OK ||
        dev_alloc(l->dev, 4096, (void **)&l->out, &e) != MT_OK ||
        dev_memset(l->dev, l->gbuf, 0, GPU_BYTES, &e) != MT_OK ||
        dev_memset(l->dev, l->out, 0, 4096, &e) != MT_OK ||
        dev_event_create(l->dev, &l->g0, &e) != MT_OK ||
        dev_event_create(l->dev, &l->g1, &e) != MT_OK) {
        snprintf(l->gpu_why, sizeof l->gpu_why, "probe kernels unavailable (%.120s)", e.msg);
        dev_event_destroy(l->dev, l->g0);
        dev_event_destroy(l->dev, l->g1);
        dev_free(l->dev, l->gbuf);
        dev_free(l->dev, l->out);
        dev_module_unload(l->mod);
        dev_code_free(l->code);
        l->g0 = l->g1 = NULL;
        l->gbuf = NULL;
        l->out = NULL;
        l->mod = NULL;
        l->code = NULL;
        l->gread = l->gcopy = NULL;
    }
}

/* One probe launch on the GPU: kernel 0 reads GPU_BYTES, kernel 1 copies
 * half of them to the other half; *gbps (if not NULL) gets the bytes
 * moved (read + written) over the launch's time by device events. */
static mt_status gpu_pass(bench_limits *l, int kernel, double *gbps, mt_err *err)
{
    long n16 = (long)(kernel == 0 ? GPU_BYTES : GPU_BYTES / 2) / 16;
    void *src = l->gbuf, *dst = (char *)l->gbuf + GPU_BYTES / 2;
    void *rargs[] = {&src, &n16, &l->out}, *cargs[] = {&src, &dst, &n16};
    mt_status st = gbps ? dev_event_record(l->dev, l->g0, err) : MT_OK;
    if (st == MT_OK)
        st = dev_launch(l->dev, kernel == 0 ? l->gread : l->gcopy, (dev_dim3){l->grid, 1, 1},
                        (dev_dim3){256, 1, 1}, 0, kernel == 0 ? rargs : cargs, err);
    if (st != MT_OK || !gbps)
        return st;
    double ms = 0;
    if ((st = dev_event_record(l->dev, l->g1, err)) == MT_OK &&
        (st = dev_synchronize(l->dev, err)) == MT_OK &&
        (st = dev_event_elapsed_ms(l->dev, l->g0, l->g1, &ms, err)) == MT_OK)
        *gbps = ms > 0 ? (double)GPU_BYTES / (ms * 1e6) : 0;
    return st;
}

mt_status bench_limits_open(dev_device *d, bench_limits **out, mt_err *err)
{
    *out = NULL;
    bench_limits *l = calloc(1, sizeof *l);
    if (!l)
        return mt_fail(err, MT_E_NOMEM, "limits");
    l->dev = d;
    l->props = dev_get_props(d);
    mt_status st = MT_OK;
    if (l->props->backend == DEV_BACKEND_CPU) {
        dev_compile_req req = {.name = "bench_limits.cpu", .source = probe_src};
        /* 16x the last-level cache, at least 1 GiB, at most 4 GiB (some VMs
         * report a host-sized L3 of hundreds of MiB). */
        l->big_bytes = (size_t)1 << 30;
        if (l->props->llc_bytes * 16 > l->big_bytes)
            l->big_bytes = l->props->llc_bytes * 16;
        if (l->big_bytes > ((size_t)4 << 30))
            l->big_bytes = (size_t)4 << 30;
        l->big_bytes -= l->big_bytes % SLICE; /* whole slices; a slice's items split evenly */
        l->n_slices = (int)(l->big_bytes / SLICE);
        if ((st = dev_compile(d, &req, &l->code, err)) != MT_OK ||
            (st = dev_module_load(d, l->code, &l->mod, err)) != MT_OK ||
            (st = dev_module_get_kernel(l->mod, "peak_fma", "pi", &l->fma, err)) != MT_OK ||
            (st = dev_module_get_kernel(l->mod, "peak_bf16", "pi", &l->bf16, err)) != MT_OK ||
            (st = dev_module_get_kernel(l->mod, "peak_i8", "pi", &l->i8, err)) != MT_OK ||
            (st = dev_module_get_kernel(l->mod, "peak_amx_bf16", "pi", &l->amx, err)) != MT_OK ||
            (st = dev_module_get_kernel(l->mod, "stream_sum", "ppliii", &l->sum, err)) != MT_OK ||
            (st = dev_module_get_kernel(l->mod, "stream_pieces", "pppiii", &l->pieces, err)) !=
                MT_OK ||
            (st = dev_alloc(d, BENCH_MAX_PIECES * sizeof(void *), &l->piece_at, err)) != MT_OK ||
            (st = dev_alloc(d, BENCH_MAX_PIECES * sizeof(long), &l->piece_len, err)) != MT_OK ||
            (st = dev_alloc(d, BENCH_MAX_PIECES * sizeof(float), &l->piece_sum, err)) != MT_OK ||
            (st = dev_alloc(d, 4096, (void **)&l->out, err)) != MT_OK ||
            (st = dev_alloc(d, l->big_bytes, (void **)&l->big, err)) != MT_OK ||
            (st = dev_memset(d, l->big, 0, l->big_bytes, err)) != MT_OK) {
            bench_limits_close(l);
            return mt_err_prefix(err, "limit probes");
        }
    } else if ((l->props->backend == DEV_BACKEND_HIP || l->props->backend == DEV_BACKEND_CUDA) &&
               !l->props->compile_only) {
        gpu_open(l);
    }
    *out = l;
    return MT_OK;
}

void bench_limits_close(bench_limits *l)
{
    if (!l)
        return;
    dev_free(l->dev, l->out);
    dev_free(l->dev, l->big);
    dev_free(l->dev, l->piece_at);
    dev_free(l->dev, l->piece_len);
    dev_free(l->dev, l->piece_sum);
    dev_free(l->dev, l->gbuf);
    dev_event_destroy(l->dev, l->g0);
    dev_event_destroy(l->dev, l->g1);
    dev_module_unload(l->mod);
    dev_code_free(l->code);
    free(l);
}

/* The read patterns the bandwidth probe tries: streams per work item and
 * software prefetch distance. Which one a machine reads fastest with
 * differs (hardware prefetchers stop at page boundaries; a VM's pages may
 * or may not be huge), and a probe that under-reads the limit makes
 * kernels look better than they are, so the limit is the best pattern.
 * Which one wins moves from day to day on the same Zen 5 VM kind: one or
 * two streams with prefetch 2-4 KiB ahead on 2026-12-02 (four streams
 * without prefetch a third slower), four streams without prefetch on
 * 2026-12-03 (80 GB/s against 60 for one stream). pg touches one line of
 * each 4 KiB page that far ahead, as the MoE kernels do (on AMD cpus):
 * in a standalone read on that VM one stream with it read 75-77 GB/s
 * against 59 without and 66 for four streams, so without these patterns
 * the probe would under-read kernels that use it. */
static const struct {
    int streams, pf, pg;
} patterns[] = {{1, 0, 0},     {1, 2048, 0},     {1, 4096, 0}, {2, 2048, 0},
                {2, 4096, 0},  {4, 0, 0},        {4, 2048, 0}, {1, 4096, 32768},
                {2, 4096, 32768}, {4, 0, 32768}};
enum { N_PATTERNS = sizeof patterns / sizeof patterns[0] };

/* Reads bytes of big from byte offset off in pattern pat. */
static mt_status stream_range(bench_limits *l, int pat, size_t off, size_t bytes, double *ms,
                              mt_err *err)
{
    long chunk = (long)(bytes / 4 / ITEMS);
    const float *from = l->big + off / 4;
    int ns = patterns[pat].streams, pf = patterns[pat].pf, pg = patterns[pat].pg;
    void *args[] = {&l->out, &from, &chunk, &ns, &pf, &pg};
    double t0 = mt_now_ms();
    mt_status st = dev_launch(l->dev, l->sum, (dev_dim3){ITEMS, 1, 1}, (dev_dim3){1, 1, 1}, 0,
                              args, err);
    if (st == MT_OK)
        st = dev_synchronize(l->dev, err);
    if (ms)
        *ms = mt_now_ms() - t0;
    return st;
}

static mt_status stream_pattern(bench_limits *l, int pat, double *ms, mt_err *err)
{
    return stream_range(l, pat, 0, l->big_bytes, ms, err);
}

mt_status bench_limits_wake(bench_limits *l, mt_err *err)
{
    /* 4 KiB a work item, synchronized (stream_range) */
    return l->sum ? stream_range(l, 0, 0, (size_t)ITEMS * 4096, NULL, err) : MT_OK;
}

mt_status bench_limits_flush(bench_limits *l, mt_err *err)
{
    if (l->gread) /* one read of 1 GiB: nothing of a kernel's stays in L2 */
        return gpu_pass(l, 0, NULL, err);
    if (!l->sum)
        return MT_OK;
    mt_status st = stream_pattern(l, 0, NULL, err);
    /* Then a short launch: a pool thread that finished its share of the
     * long stream early may have gone to sleep, and waking it costs the
     * next launch tens of microseconds in a VM. Between the launches of a
     * decode step the threads are awake. */
    return st == MT_OK ? bench_limits_wake(l, err) : st;
}

mt_status bench_limits_bandwidth(bench_limits *l, int reps, bench_spread *out, mt_err *err)
{
    memset(out, 0, sizeof *out);
    if (reps < 3)
        reps = 3;
    if (reps > 64)
        reps = 64;
    double v[64];
    mt_status st = MT_OK;
    if (l->gread) {
        /* GPU: the read and the copy kernel, interleaved after one warm-up
         * pass of each; the limit is the one with the better median. */
        double gv[2][64];
        for (int k = 0; k < 2 && st == MT_OK; k++)
            st = gpu_pass(l, k, NULL, err);
        for (int i = 0; i < reps && st == MT_OK; i++)
            for (int k = 0; k < 2 && st == MT_OK; k++)
                st = gpu_pass(l, k, &gv[k][i], err);
        if (st != MT_OK)
            return st;
        bench_spread sp[2];
        for (int k = 0; k < 2; k++) {
            bench_spread_of(gv[k], reps, &sp[k]);
            l->gmed[k] = sp[k].median;
        }
        l->gbest = sp[1].median > sp[0].median;
        *out = sp[l->gbest];
        return MT_OK;
    }
    if (!l->sum) { /* GPU backends without the probe kernels: device-to-device copies */
        for (int i = 0; i < reps && st == MT_OK; i++)
            st = kern_device_bandwidth(l->dev, (size_t)1 << 30, &v[i], err);
    } else {
        /* Every pattern reps times, interleaved; the limit is the pattern
         * with the best median. */
        double pv[N_PATTERNS][64];
        st = stream_pattern(l, 0, NULL, err); /* warm-up: pages, frequency */
        for (int i = 0; i < reps && st == MT_OK; i++)
            for (int p = 0; p < N_PATTERNS && st == MT_OK; p++) {
                double ms = 0;
                st = stream_pattern(l, p, &ms, err);
                pv[p][i] = (double)l->big_bytes / (ms * 1e6);
            }
        if (st != MT_OK)
            return st;
        bench_spread sp[N_PATTERNS];
        int b0 = 0;
        for (int p = 0; p < N_PATTERNS; p++)
            bench_spread_of(pv[p], reps, &sp[p]);
        for (int p = 1; p < N_PATTERNS; p++)
            if (sp[p].median > sp[b0].median)
                b0 = p;
        int b1 = b0 == 0 ? 1 : 0;
        for (int p = 0; p < N_PATTERNS; p++)
            if (p != b0 && sp[p].median > sp[b1].median)
                b1 = p;
        l->best[0] = b0;
        l->best[1] = b1;
        *out = sp[b0];
        return MT_OK;
    }
    if (st == MT_OK)
        bench_spread_of(v, reps, out);
    return st;
}

mt_status bench_limits_sample(bench_limits *l, double *gbps, mt_err *err)
{
    *gbps = 0;
    if (l->gread)
        return gpu_pass(l, l->gbest, gbps, err);
    if (!l->sum)
        return kern_device_bandwidth(l->dev, (size_t)1 << 30, gbps, err);
    /* The faster of the two best patterns: which one reads fastest moves
     * with the machine, and a sample that under-reads flatters the
     * kernels paired with it. */
    mt_status st = MT_OK;
    int q = l->slice;
    l->slice = (q + 1) % l->n_slices;
    /* First an untimed read of the slice: on the Zen 5 VM memory left
     * unread for a second or more reads slower (tens of seconds: about 10x
     * slower once), so after a long round of kernels a cold sample read
     * 15-25 % low (62-65 GB/s at M = 256 against 78 at M = 1 in one run),
     * and the kernels' paired fractions and the plain read's went above 1. */
    st = stream_range(l, l->best[0], (size_t)q * SLICE, SLICE, NULL, err);
    for (int i = 0; i < 2 && st == MT_OK; i++) {
        double ms = 0;
        st = stream_range(l, l->best[i], (size_t)q * SLICE, SLICE, &ms, err);
        if (st == MT_OK && (double)SLICE / (ms * 1e6) > *gbps)
            *gbps = (double)SLICE / (ms * 1e6);
    }
    /* A short launch after the long ones, as in bench_limits_flush: the
     * kernel timed next must not pay for waking a pool thread that went
     * to sleep at the end of the sample. */
    return st == MT_OK ? bench_limits_wake(l, err) : st;
}

int bench_limits_pattern_count(void)
{
    return N_PATTERNS;
}

bool bench_limits_use_pattern(bench_limits *l, int i)
{
    if (i < 0 || i >= N_PATTERNS)
        return false;
    l->best[0] = i;
    return true;
}

void bench_limits_pattern_name(const bench_limits *l, char *out, size_t cap)
{
    if (l->gread) {
        snprintf(out, cap, "%s kernel, %u blocks of 256, 16-byte loads",
                 l->gbest ? "copy" : "read", l->grid);
        return;
    }
    if (!l->sum) {
        snprintf(out, cap, "device-to-device copies%s%s", l->gpu_why[0] ? ": " : "",
                 l->gpu_why);
        return;
    }
    int p = l->best[0], ns = patterns[p].streams;
    int n = snprintf(out, cap, "%d stream%s", ns, ns == 1 ? "" : "s");
    if (n >= 0 && (size_t)n < cap && patterns[p].pf)
        n += snprintf(out + n, cap - (size_t)n, ", line prefetch %d B ahead", patterns[p].pf);
    if (n >= 0 && (size_t)n < cap && patterns[p].pg)
        snprintf(out + n, cap - (size_t)n, ", page touch %d B ahead", patterns[p].pg);
}

int64_t bench_limits_piece_step(const bench_limits *l)
{
    return 512 * (int64_t)patterns[l->best[0]].streams;
}

mt_status bench_limits_read_pieces(bench_limits *l, const void *const *at, const int64_t *len,
                                   int n, double *ms, double *checksum, mt_err *err)
{
    *ms = 0;
    if (checksum)
        *checksum = 0;
    if (!l->pieces || n <= 0)
        return MT_OK;
    if (n > BENCH_MAX_PIECES)
        return mt_fail(err, MT_E_INVALID, "read pieces: %d pieces, at most %d", n,
                       BENCH_MAX_PIECES);
    /* The probe's fastest pattern, whole steps of 8 vectors per stream. */
    int ns = patterns[l->best[0]].streams, pf = patterns[l->best[0]].pf,
        pg = patterns[l->best[0]].pg;
    int64_t step = bench_limits_piece_step(l);
    long lens[BENCH_MAX_PIECES];
    for (int i = 0; i < n; i++)
        lens[i] = (long)(len[i] - len[i] % step);
    void *args[] = {&l->piece_sum, &l->piece_at, &l->piece_len, &ns, &pf, &pg};
    mt_status st = dev_copy_to(l->dev, l->piece_at, at, (size_t)n * sizeof(void *), err);
    if (st == MT_OK)
        st = dev_copy_to(l->dev, l->piece_len, lens, (size_t)n * sizeof(long), err);
    if (st == MT_OK)
        st = bench_limits_wake(l, err); /* as before a timed kernel call */
    double t0 = mt_now_ms();
    if (st == MT_OK)
        st = dev_launch(l->dev, l->pieces, (dev_dim3){(unsigned)n, 1, 1}, (dev_dim3){1, 1, 1}, 0,
                        args, err);
    if (st == MT_OK)
        st = dev_synchronize(l->dev, err);
    if (st == MT_OK)
        *ms = mt_now_ms() - t0;
    if (st == MT_OK && checksum) {
        float sums[BENCH_MAX_PIECES];
        st = dev_copy_from(l->dev, sums, l->piece_sum, (size_t)n * sizeof(float), err);
        for (int i = 0; st == MT_OK && i < n; i++)
            *checksum += sums[i];
    }
    return st;
}

/* One launch of a peak probe: 64 work items of PEAK_ITERS steps; the
 * rate in G multiply-add x 2 per second, 0 where the CPU lacks it. */
enum { PEAK_ITEMS = 64, PEAK_ITERS = 40000 };

static mt_status time_peak(bench_limits *l, dev_kernel *k, int slot, double *rate, mt_err *err)
{
    int iters = PEAK_ITERS;
    void *args[] = {&l->out, &iters};
    double t0 = mt_now_ms();
    mt_status st = dev_launch(l->dev, k, (dev_dim3){PEAK_ITEMS, 1, 1}, (dev_dim3){1, 1, 1}, 0,
                              args, err);
    if (st == MT_OK)
        st = dev_synchronize(l->dev, err);
    double ms = mt_now_ms() - t0;
    float mads = 0;
    if (st == MT_OK)
        st = dev_copy_from(l->dev, &mads, l->out + slot, sizeof mads, err);
    *rate = st == MT_OK ? (double)PEAK_ITEMS * PEAK_ITERS * 12 * mads * 2 / (ms * 1e6) : 0;
    return st;
}

mt_status bench_limits_peaks(bench_limits *l, int launches, bench_peaks *out, mt_err *err)
{
    memset(out, 0, sizeof *out);
    if (!l->fma)
        return MT_OK;
    mt_status st = MT_OK;
    for (int i = 0; i < launches && st == MT_OK; i++) {
        double f = 0, b = 0, q = 0, a = 0;
        if ((st = time_peak(l, l->fma, 1000, &f, err)) != MT_OK ||
            (st = time_peak(l, l->bf16, 1001, &b, err)) != MT_OK ||
            (st = time_peak(l, l->i8, 1002, &q, err)) != MT_OK ||
            (st = time_peak(l, l->amx, 1003, &a, err)) != MT_OK)
            break;
        l->peaks.amx_bf16 = a > l->peaks.amx_bf16 ? a : l->peaks.amx_bf16;
        l->peaks.fma = f > l->peaks.fma ? f : l->peaks.fma;
        l->peaks.bf16 = b > l->peaks.bf16 ? b : l->peaks.bf16;
        l->peaks.i8 = q > l->peaks.i8 ? q : l->peaks.i8;
    }
    *out = l->peaks;
    return st;
}

void bench_limits_gpu_rates(const bench_limits *l, double *read_gbps, double *copy_gbps)
{
    *read_gbps = l->gread ? l->gmed[0] : 0;
    *copy_gbps = l->gread ? l->gmed[1] : 0;
}
