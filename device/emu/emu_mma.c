/* emu_mma.c: the emulator's matrix instructions. An MMA is collective over
 * a wave: emu_exec.c gathers what every lane hands in (its A, B and C
 * registers, struct mt_emu_mma_lane) at a warp rendezvous, and emu_mma_run
 * forms the whole product once, from the vendor's lane/register layout of
 * the instruction, and writes each lane's own D registers back.
 *
 * Arithmetic:
 *   bf16 and fp8 e4m3 operands: a product of two is exact in f32 (8 + 8 or
 *     4 + 4 significant bits), and D = C + sum over k of the products is
 *     accumulated in f32 in increasing k. Neither vendor documents the
 *     order or the internal precision of the sum (AMD's MI300 ISA guide and
 *     NVIDIA's PTX ISA say only that the result is f32), so kernels compare
 *     with a tolerance of a few f32 roundings of the sum of magnitudes;
 *   int8 operands: D = C + sum of the products in 32-bit two's complement,
 *     wrapping as the hardware does without saturation: exact, bit for bit.
 * An e4m3 operand follows OCP fp8 e4m3fn (bias 7, subnormals, 0x7f and
 * 0xff NaN, no infinities); a NaN operand makes its products NaN.
 *
 * Layouts (lane l, element e of a lane's A or B registers counted in
 * register order, lowest bits first; register i of C/D):
 *   AMD MFMA: AMD Instinct MI200 / MI300 ISA guides and the AMD Matrix
 *     Instruction Calculator (github.com/ROCm/amd_matrix_instruction_
 *     calculator, --register-layout);
 *   NVIDIA mma.sync: PTX ISA, "Matrix Fragments for mma.m16n8k16 with
 *     floating point type" and "... for mma.m16n8k32" (groupID = l >> 2,
 *     threadID_in_group = l % 4).
 * tests/device/test_mma_layout.c checks every cell of every table against
 * the vendors' formulas written out independently there. emu_mma_debug_swap
 * exchanges two cells of one table, so tests can show that a one-cell
 * mistake fails the kernels' checks. */
#include "emu_impl.h"

#include <assert.h>
#include <string.h>

typedef void (*rc_fn)(int lane, int e, int *row, int *col);

typedef enum elem_type { EL_BF16, EL_FP8, EL_I8 } elem_type;

typedef struct mma_shape {
    const char *name;
    int m, n, k, wave;
    int a_elems, b_elems, c_regs;
    elem_type el;
    bool int_acc; /* C and D are int32 */
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

/* ---- AMD v_mfma_{f32_16x16x32_fp8_fp8, i32_16x16x32_i8}: eight 8-bit
 * elements (two registers) of consecutive k per lane ------------------- */
static void a_16x16x32(int l, int e, int *r, int *c) { *r = l % 16; *c = 8 * (l / 16) + e; }
static void b_16x16x32(int l, int e, int *r, int *c) { *r = 8 * (l / 16) + e; *c = l % 16; }

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

/* ---- NVIDIA mma.m16n8k32 with 8-bit operands (.e4m3, .s8): A a0..a15 in
 * four registers (rows g, g+8, g, g+8; columns 4t.. then 16+4t..), B
 * b0..b7 in two (k 4t.. then 16+4t..) --------------------------------- */
static void a_16x8x32(int l, int e, int *r, int *c)
{
    *r = l / 4 + 8 * (e / 4 % 2);
    *c = 4 * (l % 4) + e % 4 + 16 * (e / 8);
}
static void b_16x8x32(int l, int e, int *r, int *c)
{
    *r = 4 * (l % 4) + e % 4 + 16 * (e / 4);
    *c = l / 4;
}

#define N_SHAPES (MT_EMU_MMA_S8_16X8X32 + 1)
static const mma_shape shapes[N_SHAPES] = {
    [MT_EMU_MMA_BF16_16X16X16] = {"v_mfma_f32_16x16x16bf16_1k", 16, 16, 16, 64, 4, 4, 4,
                                  EL_BF16, false, a_16x16x16, b_16x16x16, c_16x16},
    [MT_EMU_MMA_BF16_32X32X8] = {"v_mfma_f32_32x32x8bf16_1k", 32, 32, 8, 64, 4, 4, 16, EL_BF16,
                                 false, a_32x32x8, b_32x32x8, c_32x32},
    [MT_EMU_MMA_BF16_16X8X16] = {"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 16,
                                 8, 16, 32, 8, 4, 4, EL_BF16, false, a_16x8x16, b_16x8x16,
                                 c_16x8},
    [MT_EMU_MMA_FP8_16X16X32] = {"v_mfma_f32_16x16x32_fp8_fp8", 16, 16, 32, 64, 8, 8, 4,
                                 EL_FP8, false, a_16x16x32, b_16x16x32, c_16x16},
    [MT_EMU_MMA_I8_16X16X32] = {"v_mfma_i32_16x16x32_i8", 16, 16, 32, 64, 8, 8, 4, EL_I8,
                                true, a_16x16x32, b_16x16x32, c_16x16},
    [MT_EMU_MMA_E4M3_16X8X32] = {"mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", 16,
                                 8, 32, 32, 16, 8, 4, EL_FP8, false, a_16x8x32, b_16x8x32,
                                 c_16x8},
    [MT_EMU_MMA_S8_16X8X32] = {"mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", 16, 8, 32,
                               32, 16, 8, 4, EL_I8, true, a_16x8x32, b_16x8x32, c_16x8},
};

static const mma_shape *shape_get(int s)
{
    return s > 0 && s < N_SHAPES && shapes[s].name ? &shapes[s] : NULL;
}

/* ---- test hook: one swapped pair of cells -------------------------------- */

static struct {
    _Atomic int shape; /* 0: none */
    int op, lane0, e0, lane1, e1;
} swap;

void emu_mma_debug_swap(int shape, emu_mma_operand op, int lane0, int e0, int lane1, int e1)
{
    swap.op = (int)op;
    swap.lane0 = lane0, swap.e0 = e0, swap.lane1 = lane1, swap.e1 = e1;
    swap.shape = shape;
}

/* The layout with the test hook's swap applied. */
static void place(const mma_shape *s, int sid, emu_mma_operand op, int lane, int e, int *r,
                  int *c)
{
    if (swap.shape == sid && swap.op == (int)op) {
        if (lane == swap.lane0 && e == swap.e0)
            lane = swap.lane1, e = swap.e1;
        else if (lane == swap.lane1 && e == swap.e1)
            lane = swap.lane0, e = swap.e0;
    }
    (op == EMU_MMA_A ? s->a : op == EMU_MMA_B ? s->b : s->c)(lane, e, r, c);
}

bool emu_mma_shape(int shape, emu_mma_info *out)
{
    const mma_shape *s = shape_get(shape);
    if (!s)
        return false;
    *out = (emu_mma_info){s->name, s->m, s->n, s->k, s->wave, s->a_elems, s->b_elems,
                          s->c_regs, s->el == EL_BF16 ? 2 : 1, s->int_acc};
    return true;
}

bool emu_mma_layout(int shape, emu_mma_operand op, int lane, int elem, int *row, int *col)
{
    const mma_shape *s = shape_get(shape);
    if (!s || lane < 0 || lane >= s->wave || elem < 0)
        return false;
    int n = op == EMU_MMA_A ? s->a_elems : op == EMU_MMA_B ? s->b_elems
          : op == EMU_MMA_C ? s->c_regs : 0;
    if (elem >= n)
        return false;
    place(s, shape, op, lane, elem, row, col);
    return true;
}

/* OCP fp8 e4m3fn as f32 (exact). */
static float fp8_f32(uint8_t v)
{
    unsigned e = (v >> 3) & 15u, m = v & 7u;
    float f;
    if (e == 15u && m == 7u)
        f = __builtin_nanf("");
    else if (e == 0)
        f = (float)m * 0x1p-9f;
    else
        f = (float)(8u + m) * 0x1p-3f * __builtin_ldexpf(1.0f, (int)e - 7);
    return (v & 0x80u) ? -f : f;
}

/* A shape's layout as flat cell indexes (row * cols + col), lane-major:
 * the gather and scatter of emu_mma_run. Built once per shape from the
 * layout functions; while the test hook swaps two cells of a shape, that
 * shape's are built per call through place (on the worker thread's own
 * copy: the fiber stacks are small). */
#define MAX_LANE_ELEMS (64 * 16)
typedef struct layout_cells {
    int16_t a[MAX_LANE_ELEMS], b[MAX_LANE_ELEMS], c[MAX_LANE_ELEMS];
} layout_cells;
static layout_cells cells[N_SHAPES];
static _Thread_local layout_cells hooked_cells;
static float fp8_table[256];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void cells_fill(const mma_shape *s, int sid, bool hooked, layout_cells *out)
{
    assert(s->wave * s->a_elems <= MAX_LANE_ELEMS && s->wave * s->b_elems <= MAX_LANE_ELEMS);
    int r, col;
    for (int l = 0; l < s->wave; l++) {
        for (int e = 0; e < s->a_elems; e++) {
            hooked ? place(s, sid, EMU_MMA_A, l, e, &r, &col) : s->a(l, e, &r, &col);
            out->a[l * s->a_elems + e] = (int16_t)(r * s->k + col);
        }
        for (int e = 0; e < s->b_elems; e++) {
            hooked ? place(s, sid, EMU_MMA_B, l, e, &r, &col) : s->b(l, e, &r, &col);
            out->b[l * s->b_elems + e] = (int16_t)(r * s->n + col);
        }
        for (int i = 0; i < s->c_regs; i++) {
            hooked ? place(s, sid, EMU_MMA_C, l, i, &r, &col) : s->c(l, i, &r, &col);
            out->c[l * s->c_regs + i] = (int16_t)(r * s->n + col);
        }
    }
}

static void tables_build(void)
{
    for (int v = 0; v < 256; v++)
        fp8_table[v] = fp8_f32((uint8_t)v);
    for (int sid = 0; sid < N_SHAPES; sid++)
        if (shapes[sid].name)
            cells_fill(&shapes[sid], sid, false, &cells[sid]);
}

/* Element e of a lane's A or B registers, as f32 (bf16, fp8: e4m3 by the
 * table) or as an integer in the float (int8: exact). */
static inline float elem_f32(elem_type el, const void *regs, int e)
{
    if (el == EL_BF16) {
        uint16_t h;
        memcpy(&h, (const char *)regs + 2 * e, 2);
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    uint8_t b = ((const uint8_t *)regs)[e];
    return el == EL_FP8 ? fp8_table[b] : (float)(int8_t)b;
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
    pthread_once(&tables_once, tables_build);
    /* The largest tiles: 32x32 C, 32x8 A, 8x32 B, 16x32 A, 32x16 B. */
    float a[512], b[512];
    union { float f[1024]; uint32_t i[1024]; } c;
    assert(s->m * s->k <= 512 && s->k * s->n <= 512 && s->m * s->n <= 1024);
    const layout_cells *lc = &cells[sid];
    if (swap.shape == sid) {
        cells_fill(s, sid, true, &hooked_cells);
        lc = &hooked_cells;
    }
    for (int l = 0; l < ws; l++) {
        const struct mt_emu_mma_lane *ln = lanes[l];
        for (int e = 0; e < s->a_elems; e++)
            a[lc->a[l * s->a_elems + e]] = elem_f32(s->el, ln->a, e);
        for (int e = 0; e < s->b_elems; e++)
            b[lc->b[l * s->b_elems + e]] = elem_f32(s->el, ln->b, e);
        for (int i = 0; i < s->c_regs; i++)
            memcpy(&c.i[lc->c[l * s->c_regs + i]], (const char *)ln->c + 4 * i, 4);
    }
    /* Each D cell sums its products in increasing k; the loop runs over
     * the cells of a row innermost (the compiler's vectors), which leaves
     * every cell's order of additions as it is. */
    const int m = s->m, n = s->n, k = s->k;
    if (s->int_acc) {
        for (int i = 0; i < m; i++)
            for (int kk = 0; kk < k; kk++) {
                uint32_t x = (uint32_t)(int32_t)a[i * k + kk];
                for (int j = 0; j < n; j++)
                    c.i[i * n + j] += x * (uint32_t)(int32_t)b[kk * n + j];
            }
    } else {
        for (int i = 0; i < m; i++)
            for (int kk = 0; kk < k; kk++) {
                float x = a[i * k + kk];
                for (int j = 0; j < n; j++)
                    c.f[i * n + j] += x * b[kk * n + j];
            }
    }
    for (int l = 0; l < ws; l++)
        for (int i = 0; i < s->c_regs; i++)
            memcpy((char *)lanes[l]->d + 4 * i, &c.i[lc->c[l * s->c_regs + i]], 4);
    return MT_EMU_MMA_OK;
}
