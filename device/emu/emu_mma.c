/* emu_mma.c: the emulator's matrix instructions. An MMA is collective over
 * a wave: emu_exec.c gathers what every lane hands in (its A, B and C
 * registers, struct mt_emu_mma_lane) at a warp rendezvous, and emu_mma_run
 * forms the whole product once, from the vendor's lane/register layout of
 * the instruction, and writes each lane's own D registers back.
 *
 * Arithmetic: a product of two bf16 is exact in f32 (8 + 8 significant
 * bits), and D = C + sum over k of the products is accumulated in f32 in
 * increasing k. The hardware's summation order and internal precision are
 * not documented; kernels compare with a tolerance anyway.
 *
 * Layouts (lane l, element e of a lane's A or B registers counted in
 * register order, low half first; register i of C/D):
 *   AMD MFMA, one block: AMD Instinct MI200 / MI300 ISA guides and the AMD
 *     Matrix Instruction Calculator (github.com/ROCm/amd_matrix_instruction_
 *     calculator, --register-layout), checked against it for every element;
 *   NVIDIA mma.sync: PTX ISA, section "Matrix Fragments for mma.m16n8k16
 *     with floating point type" (groupID = l >> 2, threadID_in_group = l % 4).
 * tests/test_mma_layout.c pins entries of those tables. */
#include "emu_impl.h"

#include <assert.h>
#include <string.h>

typedef void (*rc_fn)(int lane, int e, int *row, int *col);

typedef struct mma_shape {
    const char *name;
    int m, n, k, wave;
    int a_elems, b_elems, c_regs;
    rc_fn a, b, c;
} mma_shape;

/* ---- AMD v_mfma_f32_16x16x16bf16_1k ---------------------------------- */
static void a_16x16x16(int l, int e, int *r, int *c) { *r = l % 16; *c = 4 * (l / 16) + e; }
static void b_16x16x16(int l, int e, int *r, int *c) { *r = 4 * (l / 16) + e; *c = l % 16; }
static void c_16x16(int l, int i, int *r, int *c) { *r = 4 * (l / 16) + i; *c = l % 16; }

/* ---- AMD v_mfma_f32_32x32x8bf16_1k ------------------------------------ */
static void a_32x32x8(int l, int e, int *r, int *c) { *r = l % 32; *c = 4 * (l / 32) + e; }
static void b_32x32x8(int l, int e, int *r, int *c) { *r = 4 * (l / 32) + e; *c = l % 32; }
static void c_32x32(int l, int i, int *r, int *c)
{
    *r = i % 4 + 4 * (l / 32) + 8 * (i / 4);
    *c = l % 32;
}

/* ---- NVIDIA mma.m16n8k16 .bf16 ---------------------------------------- */
static void a_16x8x16(int l, int e, int *r, int *c)
{
    *r = l / 4 + 8 * (e / 2 % 2);
    *c = 2 * (l % 4) + (e & 1) + 8 * (e / 4);
}
static void b_16x8x16(int l, int e, int *r, int *c)
{
    *r = 2 * (l % 4) + (e & 1) + 8 * (e / 2);
    *c = l / 4;
}
static void c_16x8(int l, int i, int *r, int *c)
{
    *r = l / 4 + 8 * (i / 2);
    *c = 2 * (l % 4) + (i & 1);
}

#define N_SHAPES (MT_EMU_MMA_BF16_16X8X16 + 1)
static const mma_shape shapes[N_SHAPES] = {
    [MT_EMU_MMA_BF16_16X16X16] = {"v_mfma_f32_16x16x16bf16_1k", 16, 16, 16, 64, 4, 4, 4,
                                  a_16x16x16, b_16x16x16, c_16x16},
    [MT_EMU_MMA_BF16_32X32X8] = {"v_mfma_f32_32x32x8bf16_1k", 32, 32, 8, 64, 4, 4, 16,
                                 a_32x32x8, b_32x32x8, c_32x32},
    [MT_EMU_MMA_BF16_16X8X16] = {"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 16,
                                 8, 16, 32, 8, 4, 4, a_16x8x16, b_16x8x16, c_16x8},
};

static const mma_shape *shape_get(int s)
{
    return s > 0 && s < N_SHAPES && shapes[s].name ? &shapes[s] : NULL;
}

bool emu_mma_shape(int shape, emu_mma_info *out)
{
    const mma_shape *s = shape_get(shape);
    if (!s)
        return false;
    *out = (emu_mma_info){s->name, s->m, s->n, s->k, s->wave, s->a_elems, s->b_elems,
                          s->c_regs};
    return true;
}

bool emu_mma_layout(int shape, emu_mma_operand op, int lane, int elem, int *row, int *col)
{
    const mma_shape *s = shape_get(shape);
    if (!s || lane < 0 || lane >= s->wave || elem < 0)
        return false;
    switch (op) {
    case EMU_MMA_A:
        if (elem >= s->a_elems)
            return false;
        s->a(lane, elem, row, col);
        return true;
    case EMU_MMA_B:
        if (elem >= s->b_elems)
            return false;
        s->b(lane, elem, row, col);
        return true;
    case EMU_MMA_C:
        if (elem >= s->c_regs)
            return false;
        s->c(lane, elem, row, col);
        return true;
    }
    return false;
}

/* Element e of a lane's A or B registers, as f32. */
static float elem_f32(const void *regs, int e)
{
    uint16_t h;
    memcpy(&h, (const char *)regs + 2 * e, 2);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int emu_mma_run(int ws, const struct mt_emu_mma_lane *const *lanes)
{
    int sid = -1;
    for (int l = 0; l < ws; l++) {
        if (!lanes[l])
            return MT_EMU_MMA_E_LANES;
        if (sid < 0)
            sid = lanes[l]->shape;
        else if (lanes[l]->shape != sid)
            return MT_EMU_MMA_E_SHAPE;
    }
    const mma_shape *s = shape_get(sid);
    if (!s || s->wave != ws)
        return MT_EMU_MMA_E_WAVE;
    /* The largest tiles: 32x32 C, 32x8 A, 8x32 B (16x16 A for 16x8x16). */
    float a[32 * 16], b[16 * 32], c[32 * 32];
    assert(s->m * s->k <= 32 * 16 && s->k * s->n <= 16 * 32 && s->m * s->n <= 32 * 32);
    int r, col;
    for (int l = 0; l < ws; l++) {
        for (int e = 0; e < s->a_elems; e++) {
            s->a(l, e, &r, &col);
            a[r * s->k + col] = elem_f32(lanes[l]->a, e);
        }
        for (int e = 0; e < s->b_elems; e++) {
            s->b(l, e, &r, &col);
            b[r * s->n + col] = elem_f32(lanes[l]->b, e);
        }
        for (int i = 0; i < s->c_regs; i++) {
            s->c(l, i, &r, &col);
            c[r * s->n + col] = lanes[l]->c[i];
        }
    }
    for (int i = 0; i < s->m; i++)
        for (int j = 0; j < s->n; j++) {
            float acc = c[i * s->n + j];
            for (int kk = 0; kk < s->k; kk++)
                acc += a[i * s->k + kk] * b[kk * s->n + j];
            c[i * s->n + j] = acc;
        }
    for (int l = 0; l < ws; l++)
        for (int i = 0; i < s->c_regs; i++) {
            s->c(l, i, &r, &col);
            lanes[l]->d[i] = c[r * s->n + col];
        }
    return MT_EMU_MMA_OK;
}
