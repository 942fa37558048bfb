/* test_mma_layout.c: the matrix fragments (mt_mma_* and mt_mma8_* of
 * prelude_gpu.h) on the emu backend. Every (lane, element) cell of every A,
 * B and accumulator layout is checked against the vendors' published
 * formulas, written out independently below (vendor_cell), both in the
 * emulator's MMA (device/emu/emu_mma.c) and in what the prelude's loads and
 * accumulator positions give a kernel; a few cells are also pinned as the
 * vendors' own tables name them. Random products through kernels are
 * compared with a plain C matmul; a layout mistake made in the prelude
 * alone, or in the emulator alone, fails those products; the fragments'
 * misuses (a partial or diverged wave, a misaligned tile, a shape the wave
 * size lacks) fail loudly. wave64 is AMD MFMA's layout, wave32 NVIDIA
 * mma.sync's. */
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

/* ---- the vendors' formulas, cell by cell ----------------------------------
 * AMD (Matrix Instruction Calculator, "-i <instruction> --matrix-layout"):
 * each matrix element names its lane and item:
 *   16x16x16 bf16_1k, 16x16x32 fp8/i8:  A[i][k]: lane i + 16 floor(k/kl),
 *     item k mod kl; B[k][j]: lane j + 16 floor(k/kl), item k mod kl, with kl
 *     the items a lane holds (4 for bf16, 8 for the 8-bit types);
 *     D[i][j]: lane j + 16 floor(i/4), register i mod 4;
 *   32x32x8 bf16_1k: A[i][k]: lane i + 32 floor(k/4), item k mod 4;
 *     B[k][j]: lane j + 32 floor(k/4); D[i][j]: lane j + 32 floor((i mod
 *     8)/4), register (i mod 4) + 4 floor(i/8).
 * NVIDIA (PTX ISA, matrix fragments of mma.m16n8k16 (16-bit A/B) and
 * mma.m16n8k32 (8-bit A/B)): with groupID g = lane >> 2 and t = lane % 4,
 * each fragment element names its row and column:
 *   m16n8k16 A a_i: row g for i in {0,1,4,5}, else g + 8; col 2t + (i & 1),
 *     + 8 for i >= 4;  B b_i: row 2t + (i & 1), + 8 for i >= 2; col g;
 *   m16n8k32 A a_i: row g for i in {0..3, 8..11}, else g + 8; col 4t +
 *     (i & 3), + 16 for i >= 8;  B b_i: row 4t + (i & 3), + 16 for i >= 4;
 *     col g;
 *   C/D c_i (both): row g for i < 2, else g + 8; col 2t + (i & 1).
 * vendor_cell answers (lane, element) -> (row, col): the AMD direction is
 * searched over the matrix, so the two sides are written differently. */
static bool amd_forward(int id, emu_mma_operand op, int row, int col, int *lane, int *item)
{
    const int big = id == MT_EMU_MMA_BF16_32X32X8, kl = id == MT_EMU_MMA_BF16_16X16X16 ? 4 : big ? 4 : 8;
    const int w = big ? 32 : 16;
    if (op == EMU_MMA_A) {
        *lane = row + w * (col / kl), *item = col % kl;
    } else if (op == EMU_MMA_B) {
        *lane = col + w * (row / kl), *item = row % kl;
    } else if (big) {
        *lane = col + 32 * ((row % 8) / 4), *item = row % 4 + 4 * (row / 8);
    } else {
        *lane = col + 16 * (row / 4), *item = row % 4;
    }
    return true;
}

static bool vendor_cell(int id, emu_mma_operand op, int lane, int elem, int *row, int *col)
{
    const int g = lane >> 2, t = lane % 4;
    switch (id) {
    case MT_EMU_MMA_BF16_16X16X16:
    case MT_EMU_MMA_BF16_32X32X8:
    case MT_EMU_MMA_FP8_16X16X32:
    case MT_EMU_MMA_I8_16X16X32: {
        const int big = id == MT_EMU_MMA_BF16_32X32X8;
        const int M = big ? 32 : 16, N = M, K = big ? 8 : id == MT_EMU_MMA_BF16_16X16X16 ? 16 : 32;
        const int rows = op == EMU_MMA_B ? K : M, cols = op == EMU_MMA_A ? K : N;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) {
                int l, it;
                amd_forward(id, op, r, c, &l, &it);
                if (l == lane && it == elem) {
                    *row = r, *col = c;
                    return true;
                }
            }
        return false;
    }
    case MT_EMU_MMA_BF16_16X8X16:
        if (op == EMU_MMA_A)
            *row = g + ((elem == 2 || elem == 3 || elem >= 6) ? 8 : 0),
            *col = 2 * t + (elem & 1) + (elem >= 4 ? 8 : 0);
        else if (op == EMU_MMA_B)
            *row = 2 * t + (elem & 1) + (elem >= 2 ? 8 : 0), *col = g;
        else
            *row = g + (elem >= 2 ? 8 : 0), *col = 2 * t + (elem & 1);
        return true;
    case MT_EMU_MMA_E4M3_16X8X32:
    case MT_EMU_MMA_S8_16X8X32:
        if (op == EMU_MMA_A)
            *row = g + ((elem % 8) >= 4 ? 8 : 0), *col = 4 * t + (elem & 3) + (elem >= 8 ? 16 : 0);
        else if (op == EMU_MMA_B)
            *row = 4 * t + (elem & 3) + (elem >= 4 ? 16 : 0), *col = g;
        else
            *row = g + (elem >= 2 ? 8 : 0), *col = 2 * t + (elem & 1);
        return true;
    }
    return false;
}

static const int all_shapes[] = {MT_EMU_MMA_BF16_16X16X16, MT_EMU_MMA_BF16_32X32X8,
                                 MT_EMU_MMA_BF16_16X8X16,  MT_EMU_MMA_FP8_16X16X32,
                                 MT_EMU_MMA_I8_16X16X32,   MT_EMU_MMA_E4M3_16X8X32,
                                 MT_EMU_MMA_S8_16X8X32};

/* Cells where the emulator's table and the vendor's formula disagree. */
static int emulator_mismatches(int id, char *first, size_t cap)
{
    emu_mma_info in;
    cr_assert(emu_mma_shape(id, &in));
    const int per[3] = {in.a_elems, in.b_elems, in.c_regs};
    int bad = 0;
    for (int op = 0; op < 3; op++)
        for (int l = 0; l < in.wave; l++)
            for (int e = 0; e < per[op]; e++) {
                int r = -1, c = -1, vr = -2, vc = -2;
                cr_assert(emu_mma_layout(id, (emu_mma_operand)op, l, e, &r, &c));
                cr_assert(vendor_cell(id, (emu_mma_operand)op, l, e, &vr, &vc),
                          "shape %d op %d lane %d element %d: no cell in the vendor's table", id,
                          op, l, e);
                if ((r != vr || c != vc) && bad++ == 0)
                    snprintf(first, cap, "%s operand %c lane %d element %d: emu (%d,%d), vendor "
                             "(%d,%d)", in.name, "ABD"[op], l, e, r, c, vr, vc);
            }
    return bad;
}

Test(mma_layout, every_cell_of_every_emulator_table_is_the_vendors)
{
    for (size_t i = 0; i < sizeof all_shapes / sizeof *all_shapes; i++) {
        char first[256] = "";
        cr_assert_eq(emulator_mismatches(all_shapes[i], first, sizeof first), 0, "%s", first);
        check_bijection(all_shapes[i]);
    }
}

Test(mma_layout, a_one_cell_swap_in_the_emulator_is_caught)
{
    /* accumulator columns 1 and 2 of row 0 (lanes 1 and 2 on AMD), two K
     * rows of B in lanes 32..47 */
    char first[256] = "";
    emu_mma_debug_swap(MT_EMU_MMA_BF16_16X16X16, EMU_MMA_C, 1, 0, 2, 0);
    int bad = emulator_mismatches(MT_EMU_MMA_BF16_16X16X16, first, sizeof first);
    emu_mma_debug_swap(MT_EMU_MMA_FP8_16X16X32, EMU_MMA_B, 33, 1, 33, 2);
    int bad8 = emulator_mismatches(MT_EMU_MMA_FP8_16X16X32, first, sizeof first);
    emu_mma_debug_swap(0, EMU_MMA_A, 0, 0, 0, 0);
    cr_assert_eq(bad, 2, "the swap of two accumulator cells shows as 2 cells, got %d", bad);
    cr_assert_eq(bad8, 2, "the swap of two B cells shows as 2 cells, got %d", bad8);
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
    /* Every element is where the vendor's formula puts it... */
    for (int l = 0; l < in.wave; l++) {
        int r, c;
        for (int e = 0; e < in.a_elems; e++) {
            vendor_cell(sc->id, EMU_MMA_A, l, e, &r, &c);
            cr_assert_eq(fa[l * in.a_elems + e], r * 64 + c, "A lane %d element %d", l, e);
        }
        for (int e = 0; e < in.b_elems; e++) {
            vendor_cell(sc->id, EMU_MMA_B, l, e, &r, &c);
            cr_assert_eq(fb[l * in.b_elems + e], r * 64 + c, "B lane %d element %d", l, e);
            cr_assert_eq(fbt[l * in.b_elems + e], r * 64 + c, "B^T lane %d element %d", l, e);
        }
        for (int i = 0; i < in.c_regs; i++) {
            vendor_cell(sc->id, EMU_MMA_C, l, i, &r, &c);
            cr_assert(rc[(l * in.c_regs + i) * 2] == r && rc[(l * in.c_regs + i) * 2 + 1] == c,
                      "acc lane %d register %d", l, i);
        }
    }
    /* ...and at the cells the vendor's table names. */
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

/* ---- 8-bit fragments (mt_mma8_*) ---------------------------------------- */

/* A from two byte tiles (its own row; its own column); B's packed words
 * and their expansion from N columns of 4 blocks, whose every word encodes
 * (column, block, word) in its 8 sign bits and each nibble's element in its
 * magnitude; and the accumulator positions. */
static const char frag8_body[] =
    "MT_KERNEL void frag8_layout(unsigned char *far, unsigned char *fak, unsigned *braw,\n"
    "                            unsigned char *bexp, int *acc_rc, const unsigned *bmem)\n"
    "{\n"
    "    __shared__ __attribute__((aligned(16))) unsigned char ar[16 * 32];\n"
    "    __shared__ __attribute__((aligned(16))) unsigned char ak[16 * 32];\n"
    "    __shared__ __attribute__((aligned(16))) unsigned bs[MT_MMA8_N * 16];\n"
    "    for (int i = threadIdx.x; i < 16 * 32; i += blockDim.x) {\n"
    "        ar[i] = (unsigned char)(i / 32);\n"
    "        ak[i] = (unsigned char)(i % 32);\n"
    "    }\n"
    "    for (int i = threadIdx.x; i < MT_MMA8_N * 16; i += blockDim.x)\n"
    "        bs[i] = bmem[i];\n"
    "    __syncthreads();\n"
    "    const int l = mt_lane_id();\n"
    "    mt_mma8_a a = mt_mma8_load_a(ar, 32);\n"
    "    memcpy(far + l * sizeof a, &a, sizeof a);\n"
    "    a = mt_mma8_load_a(ak, 32);\n"
    "    memcpy(fak + l * sizeof a, &a, sizeof a);\n"
    "    unsigned raw[4];\n"
    "    mt_mma8_load_b_packed4((const unsigned char *)bs, 64, 16, raw);\n"
    "    for (int j = 0; j < 4; j++) {\n"
    "        unsigned w0, w1;\n"
    "        mt_mma8_b b;\n"
    "        braw[l * 4 + j] = raw[j];\n"
    "        mt_mma8_expand(raw[j], 0x03020100u, 0x07060504u, &w0, &w1);\n"
    "        mt_mma8_set_b(&b, w0, w1);\n"
    "        memcpy(bexp + (l * 4 + j) * 8, &b, 8);\n"
    "    }\n"
    "    for (int i = 0; i < 4; i++) {\n"
    "        acc_rc[(l * 4 + i) * 2] = mt_mma8_acc_row(i);\n"
    "        acc_rc[(l * 4 + i) * 2 + 1] = mt_mma8_acc_col(i);\n"
    "    }\n"
    "}\n";

/* The prelude's contract of where a pair lands: slot s of group q of K
 * (s < 4 the first word) takes MMA column kpos8(q, s) of A and row of B. */
static int kpos8(int wave, int q, int s)
{
    return wave == 64 ? 8 * q + s : s < 4 ? 4 * q + s : 16 + 4 * q + s - 4;
}

/* Element e of a group takes slot slot8(e) (prelude_gpu.h's MT_MMA8_SLOT). */
static int slot8(int wave, int e) { return wave == 64 ? (e & 1) * 4 + (e >> 1) : e; }

static unsigned code8(int n, int j, int d) { return (unsigned)(n | j << 4 | d << 6); }

/* The packed word d of column n's block j: nibble e holds e, with bit e of
 * code8(n, j, d) as its sign. */
static unsigned packed_word(int n, int j, int d)
{
    unsigned w = 0, c = code8(n, j, d);
    for (int e = 0; e < 8; e++)
        w |= ((unsigned)e | ((c >> e) & 1u) << 3) << (4 * e);
    return w;
}

static void check_frag8_layout(int wave)
{
    const int id = wave == 64 ? MT_EMU_MMA_FP8_16X16X32 : MT_EMU_MMA_E4M3_16X8X32;
    emu_mma_info in;
    cr_assert(emu_mma_shape(id, &in));
    dev_device *d = open_emu(wave);
    dev_module *m = td_build(d, "frag8_layout.hip", frag8_body, NULL, 0, true);
    dev_kernel *k = td_kernel(m, "frag8_layout", "pppppp");
    const int N = in.n, W = in.wave;
    unsigned *bmem = malloc((size_t)N * 16 * 4);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < 4; j++)
            for (int dd = 0; dd < 4; dd++)
                bmem[n * 16 + j * 4 + dd] = packed_word(n, j, dd);
    size_t na = (size_t)W * in.a_elems;
    void *gar = td_alloc(d, na), *gak = td_alloc(d, na), *graw = td_alloc(d, (size_t)W * 16),
         *gexp = td_alloc(d, (size_t)W * 32), *grc = td_alloc(d, (size_t)W * 4 * 2 * 4),
         *gmem = td_upload(d, bmem, (size_t)N * 16 * 4);
    void *args[] = {&gar, &gak, &graw, &gexp, &grc, &gmem};
    td_launch(d, k, (dev_dim3){1, 1, 1}, (dev_dim3){(unsigned)W, 1, 1}, 0, args);
    unsigned char *far = malloc(na), *fak = malloc(na), *bexp = malloc((size_t)W * 32);
    unsigned *braw = malloc((size_t)W * 16);
    int *rc = malloc((size_t)W * 4 * 2 * 4);
    td_download(d, far, gar, na);
    td_download(d, fak, gak, na);
    td_download(d, braw, graw, (size_t)W * 16);
    td_download(d, bexp, gexp, (size_t)W * 32);
    td_download(d, rc, grc, (size_t)W * 4 * 2 * 4);
    for (int l = 0; l < W; l++) {
        /* A: every byte of the lane's registers holds the memory cell its
         * vendor position asks for (row as is; column through the pairs). */
        for (int e = 0; e < in.a_elems; e++) {
            int r, c;
            vendor_cell(id, EMU_MMA_A, l, e, &r, &c);
            int q = -1, sl = -1;
            for (int qq = 0; qq < 4; qq++)
                for (int ss = 0; ss < 8; ss++)
                    if (kpos8(wave, qq, ss) == c)
                        q = qq, sl = ss;
            cr_assert_eq(far[l * in.a_elems + e], r, "A lane %d byte %d: row", l, e);
            cr_assert_eq(fak[l * in.a_elems + e], 8 * q + sl, "A lane %d byte %d: column", l, e);
        }
        /* B: the word of block j is (its column, block j, its group), and
         * each expanded byte is the element the slot order puts there. */
        for (int j = 0; j < 4; j++) {
            unsigned w = braw[l * 4 + j], c = 0;
            for (int e = 0; e < 8; e++) {
                cr_assert_eq((w >> (4 * e)) & 7u, (unsigned)e, "B lane %d block %d", l, j);
                c |= ((w >> (4 * e + 3)) & 1u) << e;
            }
            const int n = (int)(c & 15u), jj = (int)(c >> 4 & 3u), q = (int)(c >> 6);
            cr_assert_eq(jj, j, "B lane %d: block %d holds block %d's word", l, j, jj);
            for (int e = 0; e < in.b_elems; e++) {
                int r, col;
                vendor_cell(id, EMU_MMA_B, l, e, &r, &col);
                cr_assert_eq(n, col, "B lane %d: column %d, the vendor's %d", l, n, col);
                unsigned byte = bexp[(l * 4 + j) * 8 + e];
                const int el = (int)(byte & 7u);
                cr_assert_eq(slot8(wave, el), e, "B lane %d byte %d: element %d", l, e, el);
                cr_assert_eq(kpos8(wave, q, e), r, "B lane %d byte %d: K row %d, the vendor's %d",
                             l, e, kpos8(wave, q, e), r);
                cr_assert_eq(byte >> 7, (c >> el) & 1u, "B lane %d byte %d: sign", l, e);
                cr_assert_eq(byte & 0x78u, 0u, "B lane %d byte %d: %#x", l, e, byte);
            }
        }
        for (int i = 0; i < 4; i++) {
            int r, c;
            vendor_cell(id, EMU_MMA_C, l, i, &r, &c);
            cr_assert(rc[(l * 4 + i) * 2] == r && rc[(l * 4 + i) * 2 + 1] == c,
                      "acc lane %d register %d", l, i);
        }
    }
    free(bmem);
    free(far);
    free(fak);
    free(braw);
    free(bexp);
    free(rc);
    void *bufs[] = {gar, gak, graw, gexp, grc, gmem};
    for (int i = 0; i < 6; i++)
        dev_free(d, bufs[i]);
    dev_module_unload(m);
    dev_close(d);
}

Test(mma_layout, prelude_fragments_match_amd_16x16x32_fp8_on_wave64) { check_frag8_layout(64); }
Test(mma_layout, prelude_fragments_match_nvidia_m16n8k32_e4m3_on_wave32) { check_frag8_layout(32); }

/* d = c + a x b over KS blocks of K: a as fp8 bytes [16][32 KS] with every
 * 8-byte group in slot order, b as packed MXFP4 [N][16 KS] expanded with
 * the magnitude table (tlo, thi). BREAK 1 swaps the two words of lane 5's
 * B pair after the expansion: a mistake in the prelude alone. */
static const char prod8_body[] =
    "MT_KERNEL void mma8_tile(float *d, const unsigned char *a, const unsigned char *b,\n"
    "                         const float *c, unsigned tlo, unsigned thi)\n"
    "{\n"
    "    __shared__ __attribute__((aligned(16))) unsigned char as[16 * 32 * KS];\n"
    "    __shared__ __attribute__((aligned(16))) unsigned char bs[MT_MMA8_N * 16 * KS];\n"
    "    for (int i = threadIdx.x; i < 16 * 32 * KS; i += blockDim.x)\n"
    "        as[i] = a[i];\n"
    "    for (int i = threadIdx.x; i < MT_MMA8_N * 16 * KS; i += blockDim.x)\n"
    "        bs[i] = b[i];\n"
    "    __syncthreads();\n"
    "    mt_mma8_acc acc;\n"
    "    for (int i = 0; i < 4; i++)\n"
    "        acc.x[i] = c[mt_mma8_acc_row(i) * MT_MMA8_N + mt_mma8_acc_col(i)];\n"
    "    for (int s0 = 0; s0 < KS; s0 += 4) {\n"
    "        unsigned raw[4];\n"
    "        mt_mma8_load_b_packed4(bs + s0 * 16, 16 * KS, 16, raw);\n"
    "        for (int s = s0; s < s0 + 4; s++) {\n"
    "            mt_mma8_a fa = mt_mma8_load_a(as + s * 32, 32 * KS);\n"
    "            unsigned w0, w1;\n"
    "            mt_mma8_expand(raw[s - s0], tlo, thi, &w0, &w1);\n"
    "            if (BREAK && mt_lane_id() == 5) {\n"
    "                unsigned t = w0;\n"
    "                w0 = w1;\n"
    "                w1 = t;\n"
    "            }\n"
    "            mt_mma8_b fb;\n"
    "            mt_mma8_set_b(&fb, w0, w1);\n"
    "            acc = mt_mma8_fp8(fa, fb, acc);\n"
    "        }\n"
    "    }\n"
    "    for (int i = 0; i < 4; i++)\n"
    "        d[mt_mma8_acc_row(i) * MT_MMA8_N + mt_mma8_acc_col(i)] = acc.x[i];\n"
    "}\n";

#define KS8 8

static double fp8_value(unsigned v)
{
    unsigned e = (v >> 3) & 15u, mm = v & 7u;
    double f = e ? ldexp(8.0 + mm, (int)e - 10) : ldexp((double)mm, -9);
    return (v & 0x80u) ? -f : f;
}

/* Cells of the product that miss the plain matmul. */
static int product8_mismatches(int wave, int brk, uint64_t seed)
{
    const int N = wave == 64 ? 16 : 8, K = 32 * KS8;
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    unsigned char *a = malloc((size_t)16 * K), *b = malloc((size_t)N * K / 2);
    float *c = malloc((size_t)16 * N * 4), *d = malloc((size_t)16 * N * 4);
    double *av = malloc(sizeof(double) * 16 * K), *bv = malloc(sizeof(double) * K * N);
    unsigned char tab[8];
    tab[0] = 0;
    for (int i = 1; i < 8; i++) /* finite e4m3 magnitudes */
        tab[i] = (unsigned char)(1 + mt_rng_below(&rng, 0x7e));
    unsigned tlo = (unsigned)tab[0] | (unsigned)tab[1] << 8 | (unsigned)tab[2] << 16 |
                   (unsigned)tab[3] << 24,
             thi = (unsigned)tab[4] | (unsigned)tab[5] << 8 | (unsigned)tab[6] << 16 |
                   (unsigned)tab[7] << 24;
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < K; k++) {
            unsigned v = (unsigned)mt_rng_below(&rng, 256);
            if ((v & 0x7fu) == 0x7fu)
                v &= 0xfeu; /* not NaN */
            av[i * K + k] = fp8_value(v);
            a[i * K + (k & ~7) + slot8(wave, k & 7)] = (unsigned char)v;
        }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            unsigned code = (unsigned)mt_rng_below(&rng, 16);
            bv[k * N + n] = (code & 8u ? -1 : 1) * fp8_value(tab[code & 7u]);
            unsigned char *p = &b[n * K / 2 + k / 2];
            *p = (unsigned char)((k & 1) ? (*p & 0x0fu) | code << 4 : (*p & 0xf0u) | code);
        }
    for (int i = 0; i < 16 * N; i++)
        c[i] = mt_rng_uniform(&rng, -4.0f, 4.0f);
    dev_device *dv = open_emu(wave);
    char ks[8], br[8];
    snprintf(ks, sizeof ks, "%d", KS8);
    snprintf(br, sizeof br, "%d", brk);
    dev_define defs[] = {{"KS", ks}, {"BREAK", br}};
    dev_module *m = td_build(dv, "mma8_tile.hip", prod8_body, defs, 2, true);
    dev_kernel *k = td_kernel(m, "mma8_tile", "ppppuu");
    void *gd = td_alloc(dv, (size_t)16 * N * 4), *ga = td_upload(dv, a, (size_t)16 * K),
         *gb = td_upload(dv, b, (size_t)N * K / 2), *gc = td_upload(dv, c, (size_t)16 * N * 4);
    void *args[] = {&gd, &ga, &gb, &gc, &tlo, &thi};
    td_launch(dv, k, (dev_dim3){1, 1, 1}, (dev_dim3){(unsigned)wave, 1, 1}, 0, args);
    td_download(dv, d, gd, (size_t)16 * N * 4);
    int bad = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < N; j++) {
            double want = c[i * N + j], mag = fabs(want);
            for (int kk = 0; kk < K; kk++) {
                double p = av[i * K + kk] * bv[kk * N + j];
                want += p;
                mag += fabs(p);
            }
            bad += !(fabs(d[i * N + j] - want) <= 1e-6 * mag + 1e-30);
        }
    free(a);
    free(b);
    free(c);
    free(d);
    free(av);
    free(bv);
    dev_free(dv, gd);
    dev_free(dv, ga);
    dev_free(dv, gb);
    dev_free(dv, gc);
    dev_module_unload(m);
    dev_close(dv);
    return bad;
}

Test(mma_layout, random_fp8_products_of_packed_mxfp4_on_both_wave_sizes)
{
    for (int wave = 32; wave <= 64; wave *= 2) {
        uint64_t seed = mt_seed_fresh();
        int bad = product8_mismatches(wave, 0, seed);
        cr_assert_eq(bad, 0, "wave%d seed %" PRIu64 ": %d cells off the plain matmul", wave,
                     seed, bad);
    }
}

Test(mma_layout, a_mistake_in_the_prelude_alone_or_the_emulator_alone_fails_the_product)
{
    for (int wave = 32; wave <= 64; wave *= 2) {
        uint64_t seed = mt_seed_fresh();
        cr_assert_gt(product8_mismatches(wave, 1, seed), 0, "wave%d: prelude swap unseen", wave);
        /* two K rows of B in one lane; then two accumulator columns */
        int id = wave == 64 ? MT_EMU_MMA_FP8_16X16X32 : MT_EMU_MMA_E4M3_16X8X32;
        int lane = wave == 64 ? 33 : 9;
        emu_mma_debug_swap(id, EMU_MMA_B, lane, 1, lane, 2);
        int bad_b = product8_mismatches(wave, 0, seed);
        emu_mma_debug_swap(id, EMU_MMA_C, 1, 0, 2, 0);
        int bad_c = product8_mismatches(wave, 0, seed);
        emu_mma_debug_swap(0, EMU_MMA_A, 0, 0, 0, 0);
        cr_assert_gt(bad_b, 0, "wave%d: emulator B swap unseen", wave);
        cr_assert_gt(bad_c, 0, "wave%d: emulator accumulator swap unseen", wave);
    }
}

/* Plain fp8 tiles (mt_mma8_load_a_tile, mt_mma8_load_bt_tile): every byte
 * of every lane holds the matrix element its vendor position names, and a
 * random product of e4m3 tiles is the plain matmul. */
static const char tile8_body[] =
    "MT_KERNEL void tile8(unsigned char *far, unsigned char *fak, unsigned char *fbn,\n"
    "                     unsigned char *fbk, float *d, const unsigned char *a,\n"
    "                     const unsigned char *b, const float *c)\n"
    "{\n"
    "    __shared__ __attribute__((aligned(16))) unsigned char tr[16 * 48], tk[16 * 48];\n"
    "    __shared__ __attribute__((aligned(16))) unsigned char as[16 * 32 * KS];\n"
    "    __shared__ __attribute__((aligned(16))) unsigned char bs[MT_MMA8_N * 32 * KS];\n"
    "    for (int i = threadIdx.x; i < 16 * 48; i += blockDim.x) {\n"
    "        tr[i] = (unsigned char)(i / 48);\n"
    "        tk[i] = (unsigned char)(i % 48);\n"
    "    }\n"
    "    for (int i = threadIdx.x; i < 16 * 32 * KS; i += blockDim.x)\n"
    "        as[i] = a[i];\n"
    "    for (int i = threadIdx.x; i < MT_MMA8_N * 32 * KS; i += blockDim.x)\n"
    "        bs[i] = b[i];\n"
    "    __syncthreads();\n"
    "    const int l = mt_lane_id();\n"
    "    mt_mma8_a x = mt_mma8_load_a_tile(tr, 48);\n"
    "    memcpy(far + l * sizeof x, &x, sizeof x);\n"
    "    x = mt_mma8_load_a_tile(tk, 48);\n"
    "    memcpy(fak + l * sizeof x, &x, sizeof x);\n"
    "    mt_mma8_b y = mt_mma8_load_bt_tile(tr, 48);\n"
    "    memcpy(fbn + l * sizeof y, &y, sizeof y);\n"
    "    y = mt_mma8_load_bt_tile(tk, 48);\n"
    "    memcpy(fbk + l * sizeof y, &y, sizeof y);\n"
    "    mt_mma8_acc acc;\n"
    "    for (int i = 0; i < 4; i++)\n"
    "        acc.x[i] = c[mt_mma8_acc_row(i) * MT_MMA8_N + mt_mma8_acc_col(i)];\n"
    "    for (int s = 0; s < KS; s++)\n"
    "        acc = mt_mma8_fp8(mt_mma8_load_a_tile(as + 32 * s, 32 * KS),\n"
    "                          mt_mma8_load_bt_tile(bs + 32 * s, 32 * KS), acc);\n"
    "    for (int i = 0; i < 4; i++)\n"
    "        d[mt_mma8_acc_row(i) * MT_MMA8_N + mt_mma8_acc_col(i)] = acc.x[i];\n"
    "}\n";

static void check_tile8(int wave)
{
    const int id = wave == 64 ? MT_EMU_MMA_FP8_16X16X32 : MT_EMU_MMA_E4M3_16X8X32;
    emu_mma_info in;
    cr_assert(emu_mma_shape(id, &in));
    const int N = in.n, K = 32 * KS8, W = in.wave;
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    unsigned char *a = malloc((size_t)16 * K), *b = malloc((size_t)N * K);
    float *c = malloc((size_t)16 * N * 4), *d = malloc((size_t)16 * N * 4);
    for (int i = 0; i < 16 * K; i++) {
        unsigned v = (unsigned)mt_rng_below(&rng, 256);
        a[i] = (unsigned char)((v & 0x7fu) == 0x7fu ? v & 0xfeu : v);
    }
    for (int i = 0; i < N * K; i++) {
        unsigned v = (unsigned)mt_rng_below(&rng, 256);
        b[i] = (unsigned char)((v & 0x7fu) == 0x7fu ? v & 0xfeu : v);
    }
    for (int i = 0; i < 16 * N; i++)
        c[i] = mt_rng_uniform(&rng, -4.0f, 4.0f);
    dev_device *dv = open_emu(wave);
    char ks[8];
    snprintf(ks, sizeof ks, "%d", KS8);
    dev_define defs[] = {{"KS", ks}};
    dev_module *m = td_build(dv, "tile8.hip", tile8_body, defs, 1, true);
    dev_kernel *k = td_kernel(m, "tile8", "pppppppp");
    size_t na = (size_t)W * in.a_elems, nb = (size_t)W * in.b_elems;
    void *g1 = td_alloc(dv, na), *g2 = td_alloc(dv, na), *g3 = td_alloc(dv, nb),
         *g4 = td_alloc(dv, nb), *gd = td_alloc(dv, (size_t)16 * N * 4),
         *ga = td_upload(dv, a, (size_t)16 * K), *gb = td_upload(dv, b, (size_t)N * K),
         *gc = td_upload(dv, c, (size_t)16 * N * 4);
    void *args[] = {&g1, &g2, &g3, &g4, &gd, &ga, &gb, &gc};
    td_launch(dv, k, (dev_dim3){1, 1, 1}, (dev_dim3){(unsigned)W, 1, 1}, 0, args);
    unsigned char *far = malloc(na), *fak = malloc(na), *fbn = malloc(nb), *fbk = malloc(nb);
    td_download(dv, far, g1, na);
    td_download(dv, fak, g2, na);
    td_download(dv, fbn, g3, nb);
    td_download(dv, fbk, g4, nb);
    td_download(dv, d, gd, (size_t)16 * N * 4);
    for (int l = 0; l < W; l++) {
        for (int e = 0; e < in.a_elems; e++) {
            int r, col;
            vendor_cell(id, EMU_MMA_A, l, e, &r, &col);
            cr_assert(far[l * in.a_elems + e] == r && fak[l * in.a_elems + e] == col,
                      "A tile lane %d byte %d: (%d,%d), the vendor's (%d,%d)", l, e,
                      far[l * in.a_elems + e], fak[l * in.a_elems + e], r, col);
        }
        for (int e = 0; e < in.b_elems; e++) {
            int r, col;
            vendor_cell(id, EMU_MMA_B, l, e, &r, &col);
            cr_assert(fbn[l * in.b_elems + e] == col && fbk[l * in.b_elems + e] == r,
                      "B^T tile lane %d byte %d: (k %d, n %d), the vendor's (k %d, n %d)", l, e,
                      fbk[l * in.b_elems + e], fbn[l * in.b_elems + e], r, col);
        }
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < N; j++) {
            double want = c[i * N + j], mag = fabs(want);
            for (int kk = 0; kk < K; kk++) {
                double p = fp8_value(a[i * K + kk]) * fp8_value(b[j * K + kk]);
                want += p;
                mag += fabs(p);
            }
            cr_assert(fabs(d[i * N + j] - want) <= 1e-6 * mag + 1e-30,
                      "wave%d seed %" PRIu64 ": d[%d][%d] = %.9g, want %.9g", wave, seed, i, j,
                      d[i * N + j], want);
        }
    free(a);
    free(b);
    free(c);
    free(d);
    free(far);
    free(fak);
    free(fbn);
    free(fbk);
    void *bufs[] = {g1, g2, g3, g4, gd, ga, gb, gc};
    for (int i = 0; i < 8; i++)
        dev_free(dv, bufs[i]);
    dev_module_unload(m);
    dev_close(dv);
}

/* A in fragment order: mt_mma8_a_cell names the vendor's cell of every
 * byte, and mt_mma8_load_a_frag hands each lane its bytes in order. */
static const char frag8_cell_body[] =
    "MT_KERNEL void frag8_cell(int *cells, unsigned char *got, const unsigned char *buf)\n"
    "{\n"
    "    const int l = mt_lane_id();\n"
    "    for (int e = 0; e < MT_MMA8_A_BYTES; e++) {\n"
    "        int r, k;\n"
    "        mt_mma8_a_cell(l, e, &r, &k);\n"
    "        cells[(l * MT_MMA8_A_BYTES + e) * 2] = r;\n"
    "        cells[(l * MT_MMA8_A_BYTES + e) * 2 + 1] = k;\n"
    "    }\n"
    "    mt_mma8_a a = mt_mma8_load_a_frag(buf);\n"
    "    memcpy(got + l * MT_MMA8_A_BYTES, &a, MT_MMA8_A_BYTES);\n"
    "}\n";

Test(mma_layout, fp8_fragment_order_cells_are_the_vendors)
{
    for (int wave = 32; wave <= 64; wave *= 2) {
        const int id = wave == 64 ? MT_EMU_MMA_FP8_16X16X32 : MT_EMU_MMA_E4M3_16X8X32;
        emu_mma_info in;
        cr_assert(emu_mma_shape(id, &in));
        dev_device *d = open_emu(wave);
        dev_module *m = td_build(d, "frag8_cell.hip", frag8_cell_body, NULL, 0, true);
        dev_kernel *k = td_kernel(m, "frag8_cell", "ppp");
        const size_t n = 512; /* 16 x 32 bytes: every lane's A */
        unsigned char buf[512], got[512];
        for (size_t i = 0; i < n; i++)
            buf[i] = (unsigned char)(i * 7 + 3);
        int *cells = malloc(n * 2 * sizeof(int));
        void *gc = td_alloc(d, n * 2 * sizeof(int)), *gg = td_alloc(d, n),
             *gb = td_upload(d, buf, n);
        void *args[] = {&gc, &gg, &gb};
        td_launch(d, k, (dev_dim3){1, 1, 1}, (dev_dim3){(unsigned)wave, 1, 1}, 0, args);
        td_download(d, cells, gc, n * 2 * sizeof(int));
        td_download(d, got, gg, n);
        for (int l = 0; l < wave; l++)
            for (int e = 0; e < in.a_elems; e++) {
                int r, c;
                vendor_cell(id, EMU_MMA_A, l, e, &r, &c);
                const int *x = &cells[(l * in.a_elems + e) * 2];
                cr_assert(x[0] == r && x[1] == c, "wave%d lane %d byte %d: (%d,%d), the "
                          "vendor's (%d,%d)", wave, l, e, x[0], x[1], r, c);
            }
        cr_assert_eq(memcmp(buf, got, n), 0, "wave%d: fragment-order bytes moved", wave);
        free(cells);
        dev_free(d, gc);
        dev_free(d, gg);
        dev_free(d, gb);
        dev_module_unload(m);
        dev_close(d);
    }
}

Test(mma_layout, fp8_tiles_are_plain_matrices_on_both_wave_sizes)
{
    check_tile8(64);
    check_tile8(32);
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
