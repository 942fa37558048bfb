/* family.h: the kernel-family interface, shared by the tuner, `moetune
 * check`, the benchmarks and the model runtime.
 *
 * A family is data plus a few functions: a shape schema (named dims with a
 * canonical text key and named presets), per-backend implementations (GPU:
 * HIP text for hip/cuda/emu; CPU: C text for the cpu backend), each with a
 * parameter space, a validity predicate, compile-time defines, a default
 * config and a run() that issues the launches; plus a seeded problem
 * generator, a plain C reference (the test oracle), a comparison rule and a
 * cost model (flops and minimum bytes, for roofline ratios).
 *
 * The token count M is not part of the shape: it is the bucket dimension the
 * tuner sweeps and the runtime looks up, passed beside the shape everywhere.
 * Dims marked `runtime` (e.g. a context length) are part of a problem but
 * not of the tuning key. Families are immutable static data, safe to share
 * between threads. */
#ifndef MT_KERN_FAMILY_H
#define MT_KERN_FAMILY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "device/device.h"

#define KERN_MAX_DIMS 20
#define KERN_MAX_PARAMS 16
#define KERN_MAX_BUFS 20
#define KERN_KEY_MAX 512

/* Persisted (shape keys print names, not numbers, but keep it stable). */
typedef enum kern_dtype {
    KERN_DT_F32 = 0,
    KERN_DT_BF16 = 1,
    KERN_DT_F16 = 2,
    KERN_DT_MXFP4 = 3,   /* E2M1 pairs in bytes + E8M0 scales per 32 */
    KERN_DT_FP8E4M3 = 4,
    KERN_DT_I32 = 5,
    KERN_DT_U8 = 6,
    KERN_DT_I8 = 7,      /* int8 per 32-block with an fp32 scale (a8w4 activations) */
    KERN_DT_COUNT
} kern_dtype;

const char *kern_dtype_name(kern_dtype t); /* "f32", "bf16", "mxfp4", ... */
bool kern_dtype_parse(const char *s, kern_dtype *out);

typedef enum kern_dim_kind {
    KERN_DIM_INT = 0,
    KERN_DIM_DTYPE = 1, /* value is a kern_dtype, printed by name */
    KERN_DIM_INT_OPT = 2, /* an int a key may leave out: reads as min, and keys
                             print it only when it is not min (so a dim added
                             later leaves older keys and databases valid) */
} kern_dim_kind;

typedef struct kern_dim_desc {
    const char *name;   /* as in keys: "N", "K", "E", "topk", "a", "w" */
    kern_dim_kind kind;
    bool runtime;       /* varies per call; not part of the tuning key */
    int64_t min, max;   /* accepted range (ints); ignored for dtypes */
    const char *help;
} kern_dim_desc;

/* Values in the family's dim order. */
typedef struct kern_shape {
    int64_t v[KERN_MAX_DIMS];
} kern_shape;

typedef struct kern_preset {
    const char *name;   /* "tiny", "glm5.2" */
    const char *key;    /* a full shape key, every dim named */
} kern_preset;

typedef struct kern_param_desc {
    const char *name;   /* also the -D macro name: "BM", "BN", "WAVES" */
    const int *values;  /* allowed values, ascending */
    int n_values;
    const char *help;
} kern_param_desc;

/* A configuration: one value per parameter of the implementation. */
typedef struct kern_config {
    int n;
    int v[KERN_MAX_PARAMS];
} kern_config;

typedef enum kern_buf_role {
    KERN_BUF_IN = 0,      /* filled by fill(), read by the kernel */
    KERN_BUF_OUT = 1,     /* poisoned (NaN bytes) before a launch, compared */
    KERN_BUF_INOUT = 2,   /* filled by fill() before every launch, compared */
} kern_buf_role;

typedef struct kern_buf_desc {
    const char *name;
    kern_buf_role role;
    kern_dtype dtype;     /* element type, for the default comparison */
    size_t bytes;
    int64_t row;          /* elements per row for per-row error; 0 = whole */
    double atol, rtol;    /* default comparison: |g-w| <= atol + rtol*|w| */
} kern_buf_desc;

struct kern_family;
struct kern_impl;

/* What run() gets: everything needed to issue the launches for one call. */
typedef struct kern_ctx {
    dev_device *dev;
    dev_module *mod;
    const dev_props *props;
    const struct kern_family *fam;
    const struct kern_impl *impl;
    const kern_shape *shape;
    int64_t m;
    const kern_config *cfg;
    void *const *bufs;     /* device pointers, in the family's buffer order */
    void *scratch;         /* impl->scratch_bytes() bytes of device memory */
} kern_ctx;

typedef struct kern_impl {
    const char *source;    /* embedded source name: "rmsnorm.hip" */
    const char *source_text; /* optional: the text itself, used instead of the
                              * embedded source (test-only families) */
    const kern_param_desc *params;
    int n_params;
    /* False (with a reason) when cfg cannot run shape/m on this device. */
    bool (*valid)(const kern_shape *s, int64_t m, const kern_config *cfg,
                  const dev_props *p, char *why, size_t why_cap);
    /* The config used when the database has nothing. Must be valid. */
    void (*default_config)(const kern_shape *s, int64_t m, const dev_props *p,
                           kern_config *cfg);
    /* Extra -D defines beyond the automatic ones (every param NAME=value
     * and every non-runtime dim as S_name=value). Optional (NULL). Writes
     * up to cap defines using storage in buf; returns the count. */
    int (*defines)(const kern_shape *s, const kern_config *cfg,
                   const dev_props *p, dev_define *out, char (*buf)[64], int cap);
    /* Device scratch this config needs (0 if none). Optional. */
    size_t (*scratch_bytes)(const kern_shape *s, int64_t m, const kern_config *cfg);
    /* Issues the launches for one call. */
    mt_status (*run)(const kern_ctx *c, mt_err *err);
    /* True (with a reason) when cfg's results on shape s depend on thread
     * timing, e.g. partial sums added with float atomics (split-K), so that
     * the same input can give different last bits from run to run. Optional:
     * NULL means every config sums in an order fixed by the config and the
     * shape. The runtime's batch-invariant mode refuses such configs. */
    bool (*order_varies)(const kern_shape *s, const kern_config *cfg, char *why, size_t cap);
    /* True when every output's sum order depends on the shape and the
     * compile target alone, never on the config or on M (gemm and
     * ops_head_gemm on cpu: vector lanes over K, then a fixed tree). The
     * runtime's batch-invariant mode then lets each M run its own config
     * instead of pinning one. */
    bool order_fixed;
} kern_impl;

typedef struct kern_case {
    const char *key;       /* shape key or preset name */
    int64_t m;
} kern_case;

typedef struct kern_family {
    const char *name;
    int version;           /* bump when semantics change */
    const char *summary;
    const kern_dim_desc *dims;
    int n_dims;
    const kern_preset *presets;
    int n_presets;
    const kern_impl *gpu;  /* HIP source: hip, cuda, emu; may be NULL */
    const kern_impl *cpu;  /* C source: cpu; may be NULL */

    /* Shape-level validity beyond dim ranges (e.g. K % 32 == 0). Optional. */
    bool (*shape_ok)(const kern_shape *s, int64_t m, char *why, size_t cap);
    /* Buffers of a problem, in run() order. Returns the count (<= cap). */
    int (*buffers)(const kern_shape *s, int64_t m, kern_buf_desc *out, int cap);
    /* Fills IN and INOUT host buffers from seed. */
    void (*fill)(const kern_shape *s, int64_t m, uint64_t seed, void *const *host);
    /* Plain C reference: reads inputs, writes OUT and INOUT host buffers. */
    void (*reference)(const kern_shape *s, int64_t m, void *const *host);
    /* Custom comparison of output buffer b (e.g. order-insensitive); NULL
     * uses the per-dtype rule in kern_compare_default. Returns false with
     * a reason naming the first bad element. */
    bool (*compare)(const kern_shape *s, int64_t m, int b, const void *got,
                    void *const *host_ref, char *why, size_t cap);
    /* Floating-point operations and minimum bytes moved for one call. */
    void (*cost)(const kern_shape *s, int64_t m, double *flops, double *bytes);
    /* Small cases `moetune check` and the tests run. */
    const kern_case *cases;
    int n_cases;
} kern_family;

/* ---- registry -------------------------------------------------------- */

/* All built-in families, NULL-terminated, in a stable order. */
const kern_family *const *kern_families(void);
const kern_family *kern_family_find(const char *name);
/* The implementation for a backend (gpu for hip/cuda/emu, cpu for cpu). */
const kern_impl *kern_family_impl(const kern_family *f, dev_backend b);

/* The embedded text of a kernel source ("rmsnorm.hip", "prelude_gpu.h"),
 * or NULL. Sources are compiled into the binary at build time. */
const char *kern_source_get(const char *name);
/* sha256 of the source and of the prelude it includes (hex). */
void kern_source_hash(const kern_family *f, dev_backend b, char hex[65]);

/* ---- shapes and configs --------------------------------------------- */

/* Parses a preset name or a key "N=4096,K=6144,a=bf16"; missing dims take
 * the first preset's values; an "M=" entry, if present, goes to *m (may be
 * NULL). Unknown names and out-of-range values are MT_E_INVALID naming the
 * key. */
mt_status kern_shape_parse(const kern_family *f, const char *text, kern_shape *s,
                           int64_t *m, mt_err *err);
/* Canonical key of the tuning dims ("N=4096,K=6144,a=bf16"); with_runtime
 * adds runtime dims too. */
void kern_shape_key(const kern_family *f, const kern_shape *s, bool with_runtime,
                    char *out, size_t cap);
/* Value of dim `name`, or -1 if the family has none. */
int64_t kern_shape_get(const kern_family *f, const kern_shape *s, const char *name);

/* Canonical config key "BM=32,BN=64" and JSON {"BM":32,"BN":64}. */
void kern_config_key(const kern_impl *im, const kern_config *c, char *out, size_t cap);
void kern_config_json(const kern_impl *im, const kern_config *c, char *out, size_t cap);
/* Parses either form; every parameter must be present with an allowed value. */
mt_status kern_config_parse(const kern_impl *im, const char *text, kern_config *c,
                            mt_err *err);
/* Number of points in the full space (product of value counts). */
uint64_t kern_space_size(const kern_impl *im);
/* The idx-th point of the space in mixed-radix order (first param fastest). */
void kern_space_point(const kern_impl *im, uint64_t idx, kern_config *c);
/* The fragment tile (tm x tn x tk) of a config parameter MMA=mma (1:
 * MT_MMA_SHAPE 16, 2: 32) on p, as prelude_gpu.h defines it; false where p
 * has no such instruction (AMD MFMA bf16_1k on gfx90a/gfx94x/gfx950 and emu
 * wave64: 16x16x16, 32x32x8; NVIDIA mma.sync on sm_80+ and emu wave32:
 * 16x8x16 only); mma 3 the fp8 e4m3 tile (16x16x32 on CDNA3/CDNA4 and emu
 * wave64, 16x8x32 on sm_89+ and emu wave32). Shared by every family with an
 * MMA parameter. */
bool kern_mma_tile(const dev_props *p, int mma, int *tm, int *tn, int *tk);

/* Value of parameter `name` in c, or `dflt` when the impl has none. */
int kern_config_get(const kern_impl *im, const kern_config *c, const char *name,
                    int dflt);
/* True when valid() accepts (or is NULL) and every value is allowed. */
bool kern_config_valid(const kern_family *f, const kern_impl *im,
                       const kern_shape *s, int64_t m, const kern_config *c,
                       const dev_props *p, char *why, size_t cap);

/* Up to cap distinct valid configs drawn at random from the space with
 * seed (the default config first when include_default). Returns the count.
 * Deterministic for a seed. */
int kern_space_sample(const kern_family *f, const kern_impl *im, const kern_shape *s,
                      int64_t m, const dev_props *p, uint64_t seed,
                      bool include_default, kern_config *out, int cap);

/* The configs `moetune check` runs on a case, every code path first: the
 * default at m (out[0]), the defaults of the runtime's M buckets that are
 * valid at m, for each mode parameter (MMA, GEMV) a config of every value
 * that has a valid one, then n_random more at random; distinct, at most
 * cap. Returns 0, with the reason in refused (may be NULL), when the
 * default is not valid: the backend cannot run the shape (an impl refuses,
 * say, the cpu kernels' weight layout). The code paths are the same for
 * every seed (a stream fixed by family, shape and M); the random ones are
 * deterministic for a seed. */
int kern_space_sample_paths(const kern_family *f, const kern_impl *im, const kern_shape *s,
                            int64_t m, const dev_props *p, uint64_t seed, int n_random,
                            kern_config *out, int cap, char *refused, size_t rcap);

/* Builds the compile request of a config: source, and the automatic plus
 * the impl's defines. Storage for the strings lives in *defs. */
typedef struct kern_defines {
    int n;
    dev_define d[KERN_MAX_PARAMS + KERN_MAX_DIMS + 16];
    char buf[KERN_MAX_PARAMS + KERN_MAX_DIMS + 16][64];
} kern_defines;
mt_status kern_compile_req(const kern_family *f, const kern_impl *im,
                           const kern_shape *s, const kern_config *c,
                           const dev_props *p, kern_defines *defs,
                           dev_compile_req *req, mt_err *err);

/* Default comparison of one buffer: floats by |g-w| <= atol + rtol*|w| with
 * the worst element per row reported, NaN in got where want is not NaN is a
 * failure, integers and bytes exactly. */
bool kern_compare_default(const kern_buf_desc *b, const void *got,
                          const void *want, char *why, size_t cap);

/* Kernel lookup through the module's cache, for run(): kern_get(c, "name",
 * "ppi", &k). */
mt_status kern_get(const kern_ctx *c, const char *name, const char *sig,
                   dev_kernel **k, mt_err *err);

static inline unsigned kern_cdiv(int64_t a, int64_t b) { return (unsigned)((a + b - 1) / b); }

#endif
