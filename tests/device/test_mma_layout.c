/* test_mma_layout.c: the matrix fragments (mt_mma_* of prelude_gpu.h) on the
 * emu backend. Entries of the vendors' lane/register tables are pinned, both
 * in the emulator's MMA (device/emu_mma.c) and in what the prelude's loads
 * and accumulator positions give a kernel; random products through a kernel
 * are compared with a plain C matmul; the fragments' misuses (a partial or
 * diverged wave, a misaligned tile, a shape the wave size lacks) fail
 * loudly. wave64 is AMD MFMA's layout, wave32 NVIDIA mma.sync's. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numeric.h"
#include "common/rng.h"
#include "device/device.h"
#include "device/emu/emu_impl.h"
#include "test_dev_util.h"

/* (lane, element or register) -> (row, col) of one operand. */
typedef struct pin {
    int lane, elem, row, col;
    const char *cell; /* how the vendor's table names it */
} pin;

/* AMD Matrix Instruction Calculator (github.com/ROCm/amd_matrix_instruction_
 * calculator), `-a cdna2 -i <instruction> --register-layout -A/-B/-D`: the
 * cell of A[M][K], B[K][N] or D[M][N] names vN{lane}.[bits]; element =
 * 2*N + (bits == [31:16]) for the 16-bit operands, register N for D. */
static const pin amd16_a[] = {
    {0, 0, 0, 0, "v0{0}.[15:0]"},    {17, 3, 1, 7, "v1{17}.[31:16]"},
    {37, 2, 5, 10, "v1{37}.[15:0]"}, {63, 3, 15, 15, "v1{63}.[31:16]"},
};
static const pin amd16_b[] = {
    {0, 1, 1, 0, "v0{0}.[31:16]"},    {21, 0, 4, 5, "v0{21}.[15:0]"},
    {46, 3, 11, 14, "v1{46}.[31:16]"}, {63, 0, 12, 15, "v0{63}.[15:0]"},
};
static const pin amd16_d[] = {
    {0, 0, 0, 0, "v0{0}"}, {19, 2, 6, 3, "v2{19}"}, {45, 3, 11, 13, "v3{45}"},
    {63, 3, 15, 15, "v3{63}"},
};
static const pin amd32_a[] = {
    {0, 0, 0, 0, "v0{0}.[15:0]"},     {33, 3, 1, 7, "v1{33}.[31:16]"},
    {31, 1, 31, 1, "v0{31}.[31:16]"}, {62, 2, 30, 6, "v1{62}.[15:0]"},
};
static const pin amd32_b[] = {
    {5, 1, 1, 5, "v0{5}.[31:16]"},   {40, 2, 6, 8, "v1{40}.[15:0]"},
    {63, 3, 7, 31, "v1{63}.[31:16]"}, {32, 0, 4, 0, "v0{32}.[15:0]"},
};
static const pin amd32_d[] = {
    {0, 0, 0, 0, "v0{0}"},      {33, 1, 5, 1, "v1{33}"},    {7, 4, 8, 7, "v4{7}"},
    {40, 6, 14, 8, "v6{40}"},   {63, 15, 31, 31, "v15{63}"}, {31, 12, 24, 31, "v12{31}"},
};

/* PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type",
 * figures for A (.bf16), B (.bf16) and C/D (.f32): thread T<lane>, element
 * a<i>, b<i> or c<i> (i counts .bf16x2 halves low first). */
static const pin nv16_a[] = {
    {0, 0, 0, 0, "T0 a0"}, {5, 3, 9, 3, "T5 a3"}, {30, 6, 15, 12, "T30 a6"},
    {31, 5, 7, 15, "T31 a5"},
};
static const pin nv16_b[] = {
    {0, 0, 0, 0, "T0 b0"}, {9, 1, 3, 2, "T9 b1"}, {22, 2, 12, 5, "T22 b2"},
    {31, 3, 15, 7, "T31 b3"},
};
static const pin nv16_d[] = {
    {0, 0, 0, 0, "T0 c0"}, {6, 1, 1, 5, "T6 c1"}, {13, 2, 11, 2, "T13 c2"},
    {31, 3, 15, 7, "T31 c3"},
};

typedef struct shape_case {
    int id;         /* MT_EMU_MMA_* */
    int wave, mma_shape;
    const pin *a, *b, *d;
    int na, nb, nd;
} shape_case;

#define PINS(x) x, (int)(sizeof x / sizeof x[0])
static const shape_case amd16 = {MT_EMU_MMA_BF16_16X16X16, 64, 16, amd16_a, amd16_b, amd16_d,
                                 4, 4, 4};
static const shape_case amd32 = {MT_EMU_MMA_BF16_32X32X8, 64, 32, amd32_a, amd32_b, amd32_d,
                                 4, 4, 6};
static const shape_case nv16 = {MT_EMU_MMA_BF16_16X8X16, 32, 16, nv16_a, nv16_b, nv16_d,
                                4, 4, 4};

static void check_pins(const shape_case *sc, emu_mma_operand op, const pin *p, int n)
{
    static const char *const names[] = {"A", "B", "D"};
    for (int i = 0; i < n; i++) {
        int r = -1, c = -1;
        cr_assert(emu_mma_layout(sc->id, op, p[i].lane, p[i].elem, &r, &c));
        cr_assert(r == p[i].row && c == p[i].col,
                  "shape %d %s %s (lane %d element %d): emu puts it at (%d,%d), the vendor "
                  "at (%d,%d)", sc->id, names[op], p[i].cell, p[i].lane, p[i].elem, r, c,
                  p[i].row, p[i].col);
    }
}

/* Every element of every lane lands on a distinct matrix position. */
static void check_bijection(int id)
{
    emu_mma_info in;
    cr_assert(emu_mma_shape(id, &in));
    const int dims[3][2] = {{in.m, in.k}, {in.k, in.n}, {in.m, in.n}};
    const int per_lane[3] = {in.a_elems, in.b_elems, in.c_regs};
    for (int op = 0; op < 3; op++) {
        int cells = dims[op][0] * dims[op][1];
        cr_assert_eq(cells, per_lane[op] * in.wave, "shape %d operand %d", id, op);
        char *seen = calloc((size_t)cells, 1);
        for (int l = 0; l < in.wave; l++)
            for (int e = 0; e < per_lane[op]; e++) {
                int r, c;
                cr_assert(emu_mma_layout(id, (emu_mma_operand)op, l, e, &r, &c));
                cr_assert(r >= 0 && r < dims[op][0] && c >= 0 && c < dims[op][1]);
                cr_assert_not(seen[r * dims[op][1] + c], "shape %d operand %d: (%d,%d) twice",
                              id, op, r, c);
                seen[r * dims[op][1] + c] = 1;
            }
        free(seen);
    }
}

Test(mma_layout, emulator_matches_amd_16x16x16_bf16_1k)
{
    check_pins(&amd16, EMU_MMA_A, amd16.a, amd16.na);
    check_pins(&amd16, EMU_MMA_B, amd16.b, amd16.nb);
    check_pins(&amd16, EMU_MMA_C, amd16.d, amd16.nd);
    check_bijection(amd16.id);
}

Test(mma_layout, emulator_matches_amd_32x32x8_bf16_1k)
{
    check_pins(&amd32, EMU_MMA_A, amd32.a, amd32.na);
    check_pins(&amd32, EMU_MMA_B, amd32.b, amd32.nb);
    check_pins(&amd32, EMU_MMA_C, amd32.d, amd32.nd);
    check_bijection(amd32.id);
}

Test(mma_layout, emulator_matches_nvidia_m16n8k16_bf16)
{
    check_pins(&nv16, EMU_MMA_A, nv16.a, nv16.na);
    check_pins(&nv16, EMU_MMA_B, nv16.b, nv16.nb);
    check_pins(&nv16, EMU_MMA_C, nv16.d, nv16.nd);
    check_bijection(nv16.id);
}

/* ---- through kernels ---------------------------------------------------- */

/* SHAPE picks MT_MMA_SHAPE. */
static const char shape_head[] =
    "#if SHAPE == 32\n"
    "#undef MT_MMA_SHAPE\n"
    "#define MT_MMA_SHAPE 32\n"
    "#endif\n"
    "#define TM MT_MMA_M\n"
    "#define TN MT_MMA_N\n"
    "#define TK MT_MMA_K\n";

/* What the prelude's loads put in each lane's fragment, and where it says
 * each accumulator register sits. A[m][k] and B[k][n] hold their own
 * position as a code (row * 64 + col); the fragments are copied out as
 * they lie in registers (emu: 16-bit elements in register order). */
static const char layout_body[] =
    "MT_KERNEL void frag_layout(unsigned short *fa, unsigned short *fb, unsigned short *fbt,\n"
    "                           int *acc_rc)\n"
    "{\n"
    "    __shared__ mt_bf16 as[TM * TK];\n"
    "    __shared__ mt_bf16 bs[TK * TN];\n"
    "    __shared__ mt_bf16 bts[TN * TK];\n"
    "    for (int i = threadIdx.x; i < TM * TK; i += blockDim.x)\n"
    "        as[i] = (mt_bf16)((i / TK) * 64 + i % TK);\n"
    "    for (int i = threadIdx.x; i < TK * TN; i += blockDim.x) {\n"
    "        bs[i] = (mt_bf16)((i / TN) * 64 + i % TN);\n"
    "        bts[i] = (mt_bf16)((i % TK) * 64 + i / TK);\n"
    "    }\n"
    "    __syncthreads();\n"
    "    int l = mt_lane_id();\n"
    "    mt_mma_a a = mt_mma_load_a(as, TK);\n"
    "    mt_mma_b b = mt_mma_load_b(bs, TN);\n"
    "    mt_mma_b bt = mt_mma_load_bt(bts, TK);\n"
    "    memcpy(fa + l * (sizeof a / 2), &a, sizeof a);\n"
    "    memcpy(fb + l * (sizeof b / 2), &b, sizeof b);\n"
    "    memcpy(fbt + l * (sizeof bt / 2), &bt, sizeof bt);\n"
    "    for (int i = 0; i < MT_MMA_ACC_REGS; i++) {\n"
    "        acc_rc[(l * MT_MMA_ACC_REGS + i) * 2] = mt_mma_acc_row(i);\n"
    "        acc_rc[(l * MT_MMA_ACC_REGS + i) * 2 + 1] = mt_mma_acc_col(i);\n"
    "    }\n"
    "}\n";

static char *cat(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    cr_assert_not_null(s);
    memcpy(s, a, na);
    memcpy(s + na, b, nb + 1);
    return s;
}

static dev_device *open_emu(int wave)
{
    return td_open(wave == 32 ? "emu:wave32" : "emu:wave64", NULL);
}

static dev_module *build_shape(dev_device *d, const char *name, const char *body, int shape,
                               const dev_define *extra, int n_extra)
{
    char s[8];
    snprintf(s, sizeof s, "%d", shape);
    dev_define defs[8] = {{"SHAPE", NULL}};
    defs[0].value = s;
    for (int i = 0; i < n_extra && i < 7; i++)
        defs[1 + i] = extra[i];
    char *src = cat(shape_head, body);
    dev_module *m = td_build(d, name, src, defs, 1 + n_extra, true);
    free(src);
    return m;
}

static void check_kernel_layout(const shape_case *sc)
{
    emu_mma_info in;
    cr_assert(emu_mma_shape(sc->id, &in));
    dev_device *d = open_emu(sc->wave);
    dev_module *m = build_shape(d, "frag_layout.hip", layout_body, sc->mma_shape, NULL, 0);
    dev_kernel *k = td_kernel(m, "frag_layout", "pppp");
    size_t na = (size_t)in.wave * in.a_elems, nb = (size_t)in.wave * in.b_elems,
           nc = (size_t)in.wave * in.c_regs;
    void *ga = td_alloc(d, na * 2), *gb = td_alloc(d, nb * 2), *gbt = td_alloc(d, nb * 2),
         *grc = td_alloc(d, nc * 2 * sizeof(int));
    void *args[] = {&ga, &gb, &gbt, &grc};
    td_launch(d, k, (dev_dim3){1, 1, 1}, (dev_dim3){(unsigned)in.wave, 1, 1}, 0, args);
    unsigned short *fa = malloc(na * 2), *fb = malloc(nb * 2), *fbt = malloc(nb * 2);
    int *rc = malloc(nc * 2 * sizeof(int));
    td_download(d, fa, ga, na * 2);
    td_download(d, fb, gb, nb * 2);
    td_download(d, fbt, gbt, nb * 2);
    td_download(d, rc, grc, nc * 2 * sizeof(int));
    /* Every element agrees with the emulator's MMA... */
    for (int l = 0; l < in.wave; l++) {
        int r, c;
        for (int e = 0; e < in.a_elems; e++) {
            emu_mma_layout(sc->id, EMU_MMA_A, l, e, &r, &c);
            cr_assert_eq(fa[l * in.a_elems + e], r * 64 + c, "A lane %d element %d", l, e);
        }
        for (int e = 0; e < in.b_elems; e++) {
            emu_mma_layout(sc->id, EMU_MMA_B, l, e, &r, &c);
            cr_assert_eq(fb[l * in.b_elems + e], r * 64 + c, "B lane %d element %d", l, e);
            cr_assert_eq(fbt[l * in.b_elems + e], r * 64 + c, "B^T lane %d element %d", l, e);
        }
        for (int i = 0; i < in.c_regs; i++) {
            emu_mma_layout(sc->id, EMU_MMA_C, l, i, &r, &c);
            cr_assert(rc[(l * in.c_regs + i) * 2] == r && rc[(l * in.c_regs + i) * 2 + 1] == c,
                      "acc lane %d register %d", l, i);
        }
    }
    /* ...and with the vendor's table. */
    for (int i = 0; i < sc->na; i++) {
        const pin *p = &sc->a[i];
        cr_assert_eq(fa[p->lane * in.a_elems + p->elem], p->row * 64 + p->col, "A %s",
                     p->cell);
    }
    for (int i = 0; i < sc->nb; i++) {
        const pin *p = &sc->b[i];
        cr_assert_eq(fb[p->lane * in.b_elems + p->elem], p->row * 64 + p->col, "B %s",
                     p->cell);
    }
    for (int i = 0; i < sc->nd; i++) {
        const pin *p = &sc->d[i];
        const int *x = &rc[(p->lane * in.c_regs + p->elem) * 2];
        cr_assert(x[0] == p->row && x[1] == p->col, "D %s: prelude says (%d,%d)", p->cell,
                  x[0], x[1]);
    }
    free(fa);
    free(fb);
    free(fbt);
    free(rc);
    dev_free(d, ga);
    dev_free(d, gb);
    dev_free(d, gbt);
    dev_free(d, grc);
    dev_module_unload(m);
    dev_close(d);
}

Test(mma_layout, prelude_fragments_match_amd_16x16x16_on_wave64) { check_kernel_layout(&amd16); }
Test(mma_layout, prelude_fragments_match_amd_32x32x8_on_wave64) { check_kernel_layout(&amd32); }
Test(mma_layout, prelude_fragments_match_nvidia_m16n8k16_on_wave32) { check_kernel_layout(&nv16); }

/* d = c + a x b over KSTEPS K-tiles; one wave per block. a is TM x K
 * row-major; b is K x TN row-major (BMODE 1, mt_mma_load_b) or given as
 * its TN x K transpose (BMODE 0, mt_mma_load_bt). */
static const char product_body[] =
    "MT_KERNEL void mma_tile(float *d, const mt_bf16 *a, const mt_bf16 *b, const float *c)\n"
    "{\n"
    "    __shared__ mt_bf16 as[TM * KSTEPS * TK];\n"
    "    __shared__ mt_bf16 bs[TN * KSTEPS * TK];\n"
    "    const int kk = KSTEPS * TK;\n"
    "    for (int i = threadIdx.x; i < TM * kk; i += blockDim.x)\n"
    "        as[i] = a[i];\n"
    "    for (int i = threadIdx.x; i < TN * kk; i += blockDim.x)\n"
    "        bs[i] = b[i];\n"
    "    __syncthreads();\n"
    "    mt_mma_acc acc;\n"
    "    for (int i = 0; i < MT_MMA_ACC_REGS; i++)\n"
    "        acc.x[i] = c[mt_mma_acc_row(i) * TN + mt_mma_acc_col(i)];\n"
    "    for (int s = 0; s < KSTEPS; s++) {\n"
    "        mt_mma_a fa = mt_mma_load_a(as + s * TK, kk);\n"
    "#if BMODE\n"
    "        mt_mma_b fb = mt_mma_load_b(bs + s * TK * TN, TN);\n"
    "#else\n"
    "        mt_mma_b fb = mt_mma_load_bt(bs + s * TK, kk);\n"
    "#endif\n"
    "        acc = mt_mma_bf16(fa, fb, acc);\n"
    "    }\n"
    "    mt_mma_store_acc(d, TN, acc);\n"
    "}\n";

#define KSTEPS 3

static void check_product(const shape_case *sc, int bmode)
{
    emu_mma_info in;
    cr_assert(emu_mma_shape(sc->id, &in));
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    int M = in.m, N = in.n, K = KSTEPS * in.k;
    uint16_t *a = malloc((size_t)M * K * 2), *b = malloc((size_t)K * N * 2);
    float *c = malloc((size_t)M * N * 4), *d = malloc((size_t)M * N * 4);
    for (int i = 0; i < M * K; i++)
        a[i] = mt_f32_to_bf16(mt_rng_uniform(&rng, -2.0f, 2.0f));
    for (int i = 0; i < K * N; i++)
        b[i] = mt_f32_to_bf16(mt_rng_uniform(&rng, -2.0f, 2.0f));
    for (int i = 0; i < M * N; i++)
        c[i] = mt_rng_uniform(&rng, -4.0f, 4.0f);
    /* b as the kernel wants it: K x N, or N x K */
    uint16_t *bk = malloc((size_t)K * N * 2);
    for (int kk = 0; kk < K; kk++)
        for (int n = 0; n < N; n++)
            bk[bmode ? kk * N + n : n * K + kk] = b[kk * N + n];

    dev_device *d_ = open_emu(sc->wave);
    char ks[8], bm[8];
    snprintf(ks, sizeof ks, "%d", KSTEPS);
    snprintf(bm, sizeof bm, "%d", bmode);
    dev_define extra[] = {{"KSTEPS", ks}, {"BMODE", bm}};
    dev_module *m = build_shape(d_, "mma_tile.hip", product_body, sc->mma_shape, extra, 2);
    dev_kernel *k = td_kernel(m, "mma_tile", "pppp");
    void *gd = td_alloc(d_, (size_t)M * N * 4), *ga = td_upload(d_, a, (size_t)M * K * 2),
         *gb = td_upload(d_, bk, (size_t)K * N * 2), *gc = td_upload(d_, c, (size_t)M * N * 4);
    void *args[] = {&gd, &ga, &gb, &gc};
    td_launch(d_, k, (dev_dim3){1, 1, 1}, (dev_dim3){(unsigned)in.wave, 1, 1}, 0, args);
    td_download(d_, d, gd, (size_t)M * N * 4);

    /* The plain matmul, in double; f32 accumulation of 3*K exact products
     * is within a few ulps of the sum of magnitudes. */
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double want = c[i * N + j], mag = fabs(want);
            for (int kk = 0; kk < K; kk++) {
                double p = (double)mt_bf16_to_f32(a[i * K + kk]) * mt_bf16_to_f32(b[kk * N + j]);
                want += p;
                mag += fabs(p);
            }
            double got = d[i * N + j];
            cr_assert(fabs(got - want) <= 1e-6 * mag + 1e-30,
                      "shape %d bmode %d seed %" PRIu64 ": d[%d][%d] = %.9g, want %.9g",
                      sc->id, bmode, seed, i, j, got, want);
        }
    free(a);
    free(b);
    free(bk);
    free(c);
    free(d);
    dev_free(d_, gd);
    dev_free(d_, ga);
    dev_free(d_, gb);
    dev_free(d_, gc);
    dev_module_unload(m);
    dev_close(d_);
}

Test(mma_layout, random_product_16x16x16_on_wave64)
{
    check_product(&amd16, 0);
    check_product(&amd16, 1);
}

Test(mma_layout, random_product_32x32x8_on_wave64)
{
    check_product(&amd32, 0);
    check_product(&amd32, 1);
}

Test(mma_layout, random_product_16x8x16_on_wave32)
{
    check_product(&nv16, 0);
    check_product(&nv16, 1);
}

/* ---- misuse fails loudly ------------------------------------------------ */

/* Launches product_body's kernel with `threads` threads (KSTEPS 1) after
 * compiling it with the extra text ahead of the body; returns the status
 * and the message. */
static mt_status run_misuse(int wave, int shape, const char *src, unsigned threads,
                            char *msg, size_t cap)
{
    dev_device *d = open_emu(wave);
    dev_define extra[] = {{"KSTEPS", "1"}, {"BMODE", "0"}};
    char s[8];
    snprintf(s, sizeof s, "%d", shape);
    dev_define defs[] = {{"SHAPE", s}, extra[0], extra[1]};
    char *text = cat(shape_head, src);
    dev_module *m = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = td_try_build(d, "misuse.hip", text, defs, 3, true, &m, &err);
    free(text);
    if (st == MT_OK) {
        dev_kernel *k = td_kernel(m, "mma_tile", "pppp");
        void *buf = td_alloc(d, 1 << 16);
        void *args[] = {&buf, &buf, &buf, &buf};
        st = dev_launch(d, k, (dev_dim3){1, 1, 1}, (dev_dim3){threads, 1, 1}, 0, args, &err);
        dev_free(d, buf);
        dev_module_unload(m);
    }
    snprintf(msg, cap, "%s", err.msg);
    dev_close(d);
    return st;
}

Test(mma_layout, a_partial_wave_is_a_fault_naming_the_call)
{
    char msg[MT_ERR_MSG_MAX];
    mt_status st = run_misuse(64, 16, product_body, 48, msg, sizeof msg);
    cr_assert_eq(st, MT_E_FAULT, "%s: %s", mt_status_str(st), msg);
    cr_assert(strstr(msg, "not every lane of the wave") && strstr(msg, "misuse.hip:"), "%s",
              msg);
}

Test(mma_layout, a_lane_that_exited_is_a_fault)
{
    static const char early_exit[] =
        "MT_KERNEL void mma_tile(float *d, const mt_bf16 *a, const mt_bf16 *b, "
        "const float *c)\n"
        "{\n"
        "    __shared__ mt_bf16 s[TM * TK + TN * TK];\n"
        "    (void)a; (void)b; (void)c;\n"
        "    for (int i = threadIdx.x; i < TM * TK + TN * TK; i += blockDim.x)\n"
        "        s[i] = 0;\n"
        "    __syncthreads();\n"
        "    if (mt_lane_id() == 7)\n"
        "        return;\n"
        "    mt_mma_acc acc = mt_mma_bf16(mt_mma_load_a(s, TK), mt_mma_load_bt(s + TM * TK, "
        "TK), mt_mma_acc_zero());\n"
        "    mt_mma_store_acc(d, TN, acc);\n"
        "}\n";
    char msg[MT_ERR_MSG_MAX];
    mt_status st = run_misuse(32, 16, early_exit, 32, msg, sizeof msg);
    cr_assert_eq(st, MT_E_FAULT, "%s: %s", mt_status_str(st), msg);
    cr_assert(strstr(msg, "not every lane of the wave"), "%s", msg);
}

Test(mma_layout, lanes_at_different_warp_operations_are_a_diverged_warp)
{
    static const char diverged[] =
        "MT_KERNEL void mma_tile(float *d, const mt_bf16 *a, const mt_bf16 *b, "
        "const float *c)\n"
        "{\n"
        "    __shared__ mt_bf16 s[TM * TK + TN * TK];\n"
        "    (void)a; (void)b; (void)c;\n"
        "    for (int i = threadIdx.x; i < TM * TK + TN * TK; i += blockDim.x)\n"
        "        s[i] = 0;\n"
        "    __syncthreads();\n"
        "    if (mt_lane_id() < 16) {\n"
        "        mt_mma_acc acc = mt_mma_bf16(mt_mma_load_a(s, TK), "
        "mt_mma_load_bt(s + TM * TK, TK), mt_mma_acc_zero());\n"
        "        mt_mma_store_acc(d, TN, acc);\n"
        "    } else {\n"
        "        d[0] = mt_shfl_xor_f32(1.0f, 1);\n"
        "    }\n"
        "}\n";
    char msg[MT_ERR_MSG_MAX];
    mt_status st = run_misuse(64, 16, diverged, 64, msg, sizeof msg);
    cr_assert_eq(st, MT_E_DEADLOCK, "%s: %s", mt_status_str(st), msg);
    cr_assert(strstr(msg, "diverged") && strstr(msg, "mma"), "%s", msg);
}

Test(mma_layout, a_misaligned_tile_is_a_fault)
{
    static const char misaligned[] =
        "MT_KERNEL void mma_tile(float *d, const mt_bf16 *a, const mt_bf16 *b, "
        "const float *c)\n"
        "{\n"
        "    __shared__ mt_bf16 s[2 * TM * TK + 8];\n"
        "    (void)a; (void)b; (void)c;\n"
        "    for (int i = threadIdx.x; i < 2 * TM * TK + 8; i += blockDim.x)\n"
        "        s[i] = 0;\n"
        "    __syncthreads();\n"
        "    mt_mma_a x = mt_mma_load_a(s + 2, TK);\n"
        "    mt_mma_acc acc = mt_mma_bf16(x, mt_mma_load_bt(s, TK), mt_mma_acc_zero());\n"
        "    mt_mma_store_acc(d, TN, acc);\n"
        "}\n";
    char msg[MT_ERR_MSG_MAX];
    mt_status st = run_misuse(64, 32, misaligned, 64, msg, sizeof msg);
    cr_assert_eq(st, MT_E_FAULT, "%s: %s", mt_status_str(st), msg);
    cr_assert(strstr(msg, "mt_mma_load_a") && strstr(msg, "8-byte aligned"), "%s", msg);
}

Test(mma_layout, the_32_shape_does_not_compile_for_wave32)
{
    char msg[MT_ERR_MSG_MAX];
    mt_status st = run_misuse(32, 32, product_body, 32, msg, sizeof msg);
    cr_assert_eq(st, MT_E_COMPILE, "%s: %s", mt_status_str(st), msg);
    cr_assert(strstr(msg, "mt_mma_shape_32_needs_an_amd_wave64_target"), "%s", msg);
}
