/* moe_example.c: a program outside moetune's tree, built with nothing but
 * `pkg-config --cflags --libs moetune`, that runs a MoE layer through
 * libmoetune and checks it against a plain C MoE layer written here.
 *
 *   moe_example [DEVICE [SHAPE [TOKENS]]]     (defaults: cpu glm5.2 4)
 *
 * SHAPE glm5.2 is GLM-5.2's layer: hidden 6144, expert width 2048, 256
 * experts, top-8, one shared expert of width 2048, sigmoid routing with a
 * correction bias, scaled by 2.5 (about 20 s for 4 tokens on cpu or emu,
 * 2 cores, warm compile cache). "small" is hidden 512, width 256, 32
 * experts in 4 groups (2 kept), top-4, shared width 256: group routing, in
 * a second. Activations bf16 (a16w4). The reference uses libm: cc
 * moe_example.c $(pkg-config --cflags --libs moetune) -lm
 *
 * The weights are random MXFP4 in the checkpoint's layout; only the experts
 * the tokens are routed to are filled (the rest stay untouched zero pages),
 * so GLM-5.2's 5 GB of expert weights cost little memory here. Exit status
 * 0 when every token's output agrees with the reference within 1e-2 of its
 * largest value (the layer tolerance of moetune's own tests), 1 otherwise,
 * 2 when the library reports an error. */
#include <math.h>
#include <moetune/moetune.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
    const char *name;
    int64_t H, I, E, S;
    int topk, ngroup, topkg;
    float scale;
} shape;

static const shape shapes[] = {
    {"glm5.2", 6144, 2048, 256, 2048, 8, 1, 1, 2.5f},
    {"small", 512, 256, 32, 256, 4, 4, 2, 2.5f},
};

/* ---- numbers: bf16, MXFP4, a seeded generator --------------------------- */

static float bf16_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_bf16(float f) /* round to nearest even */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

/* Row r of an MXFP4 matrix with k columns (Quark: packed [rows, k/2] low
 * nibble first, E8M0 scales [rows, k/32]) as floats. */
static void mxfp4_row(const uint8_t *packed, const uint8_t *scales, int64_t r, int64_t k,
                      float *out)
{
    const uint8_t *p = packed + r * k / 2, *s = scales + r * k / 32;
    for (int64_t i = 0; i < k; i++)
        out[i] = e2m1[(p[i / 2] >> (4 * (i & 1))) & 15] * ldexpf(1.0f, s[i / 32] - 127);
}

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint64_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static float uniform(void) { return (float)(next() >> 40) / 16777216.0f; }
static float normal(void) { return (uniform() + uniform() + uniform() + uniform() - 2.0f) * 1.732f; }

/* Random MXFP4 rows [r0, r0 + n) of a k-column matrix, scaled so that a dot
 * product with unit-normal activations is about 1. */
static void fill_mxfp4(uint8_t *packed, uint8_t *scales, int64_t r0, int64_t n, int64_t k)
{
    int base = 127 - (int)lround(log2(2.6 * sqrt((double)k)));
    for (int64_t i = r0 * k / 2; i < (r0 + n) * k / 2; i++)
        packed[i] = (uint8_t)next();
    for (int64_t i = r0 * k / 32; i < (r0 + n) * k / 32; i++)
        scales[i] = (uint8_t)(base - 1 + (int)(next() % 3));
}

/* ---- the reference layer ------------------------------------------------- */

typedef struct layer {
    shape s;
    uint16_t *gate;
    float *bias;
    uint8_t *w13, *s13, *w2, *s2, *sw13, *ss13, *sw2, *ss2;
} layer;

/* Token t's experts and weights by the routing rule of moetune/moe.h, in
 * double; *margin: how far the last chosen expert's biased score lies
 * above the best one left out (a near tie may go either way in float). */
static void route(const layer *l, const uint16_t *x, int32_t *ids, float *w, double *margin)
{
    const shape *s = &l->s;
    double score[1024], choice[1024];
    for (int64_t e = 0; e < s->E; e++) {
        double acc = 0;
        for (int64_t h = 0; h < s->H; h++)
            acc += (double)bf16_f32(x[h]) * bf16_f32(l->gate[e * s->H + h]);
        score[e] = 1.0 / (1.0 + exp(-acc));
        choice[e] = score[e] + l->bias[e];
    }
    /* Groups: each scores the sum of its two best; the topkg best stay. */
    int64_t per = s->E / s->ngroup;
    double gscore[64];
    for (int g = 0; g < s->ngroup; g++) {
        double a = -INFINITY, b = -INFINITY;
        for (int64_t e = g * per; e < (g + 1) * per; e++)
            if (choice[e] > a)
                b = a, a = choice[e];
            else if (choice[e] > b)
                b = choice[e];
        gscore[g] = s->ngroup > 1 ? a + b : 0;
    }
    for (int kept = 0; kept < s->ngroup - s->topkg; kept++) { /* drop the worst groups */
        int worst = -1;
        for (int g = 0; g < s->ngroup; g++)
            if (gscore[g] > -INFINITY && (worst < 0 || gscore[g] <= gscore[worst]))
                worst = g;
        gscore[worst] = -INFINITY;
        for (int64_t e = worst * per; e < (worst + 1) * per; e++)
            choice[e] = -INFINITY;
    }
    double sum = 0;
    for (int j = 0; j < s->topk; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < s->E; e++)
            if (choice[e] > -INFINITY && (best < 0 || choice[e] > choice[best]))
                best = e;
        ids[j] = (int32_t)best;
        *margin = choice[best];
        choice[best] = -INFINITY;
        sum += score[best];
    }
    double left = -INFINITY;
    for (int64_t e = 0; e < s->E; e++)
        left = fmax(left, choice[e]);
    *margin -= left;
    for (int j = 0; j < s->topk; j++)
        w[j] = (float)(score[ids[j]] / (sum + 1e-20) * s->scale);
}

/* y[H] += wt * down(silu(gate(x)) * up(x)) of one expert (inter n). */
static void expert(const shape *s, int64_t n, const uint8_t *w13, const uint8_t *s13,
                   const uint8_t *w2, const uint8_t *s2, const uint16_t *x, float wt, double *y)
{
    float *row = malloc(sizeof(float) * (size_t)(s->H > n ? s->H : n));
    float *xf = malloc(sizeof(float) * (size_t)s->H), *h = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < s->H; i++)
        xf[i] = bf16_f32(x[i]);
    for (int64_t r = 0; r < n; r++) {
        double g = 0, u = 0;
        mxfp4_row(w13, s13, r, s->H, row);
        for (int64_t i = 0; i < s->H; i++)
            g += (double)xf[i] * row[i];
        mxfp4_row(w13, s13, n + r, s->H, row);
        for (int64_t i = 0; i < s->H; i++)
            u += (double)xf[i] * row[i];
        float gf = (float)g;
        h[r] = bf16_f32(f32_bf16(gf / (1.0f + expf(-gf)) * (float)u)); /* stored as bf16 */
    }
    for (int64_t r = 0; r < s->H; r++) {
        double acc = 0;
        mxfp4_row(w2, s2, r, n, row);
        for (int64_t i = 0; i < n; i++)
            acc += (double)h[i] * row[i];
        y[r] += wt * acc;
    }
    free(row);
    free(xf);
    free(h);
}

int main(int argc, char **argv)
{
    const char *spec = argc > 1 ? argv[1] : "cpu", *sname = argc > 2 ? argv[2] : "glm5.2";
    int64_t M = argc > 3 ? atoll(argv[3]) : 4;
    layer l = {0};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!strcmp(shapes[i].name, sname))
            l.s = shapes[i];
    const shape *s = &l.s;
    if (!s->name || M < 1 || M > 64) {
        fprintf(stderr, "usage: moe_example [DEVICE [glm5.2|small [TOKENS (1-64)]]]\n");
        return 2;
    }
    int64_t H = s->H, I = s->I, E = s->E, S = s->S, K = s->topk;
    /* Inputs and the router; the experts' weights once routing is known. */
    uint16_t *x = malloc((size_t)(M * H) * 2);
    l.gate = malloc((size_t)(E * H) * 2);
    l.bias = malloc((size_t)E * 4);
    for (int64_t i = 0; i < M * H; i++)
        x[i] = f32_bf16(normal());
    for (int64_t i = 0; i < E * H; i++)
        l.gate[i] = f32_bf16(normal() * 2.0f / sqrtf((float)H));
    for (int64_t e = 0; e < E; e++)
        l.bias[e] = (uniform() - 0.5f) * 0.2f;
    int32_t *ids = malloc((size_t)(M * K) * 4);
    float *tw = malloc((size_t)(M * K) * 4);
    double *margin = malloc((size_t)M * sizeof(double));
    for (int64_t t = 0; t < M; t++)
        route(&l, x + t * H, ids + t * K, tw + t * K, &margin[t]);
    l.w13 = calloc((size_t)(E * 2 * I * H / 2), 1), l.s13 = calloc((size_t)(E * 2 * I * H / 32), 1);
    l.w2 = calloc((size_t)(E * H * I / 2), 1), l.s2 = calloc((size_t)(E * H * I / 32), 1);
    l.sw13 = malloc((size_t)(2 * S * H / 2)), l.ss13 = malloc((size_t)(2 * S * H / 32));
    l.sw2 = malloc((size_t)(H * S / 2)), l.ss2 = malloc((size_t)(H * S / 32));
    char *used = calloc((size_t)E, 1);
    for (int64_t p = 0; p < M * K; p++)
        if (!used[ids[p]]++) {
            fill_mxfp4(l.w13, l.s13, ids[p] * 2 * I, 2 * I, H);
            fill_mxfp4(l.w2, l.s2, ids[p] * H, H, I);
        }
    fill_mxfp4(l.sw13, l.ss13, 0, 2 * S, H);
    fill_mxfp4(l.sw2, l.ss2, 0, H, S);

    /* The library. */
    moetune_device *dev;
    moetune_moe *moe = NULL;
    float *y = aligned_alloc(64, (size_t)(M * H) * 4);
    moetune_moe_desc d;
    moetune_moe_desc_init(&d);
    d.hidden = H, d.inter = I, d.experts = E, d.topk = (int)K, d.shared_inter = S;
    d.n_group = s->ngroup, d.topk_group = s->topkg, d.routed_scale = s->scale;
    d.max_tokens = M;
    moetune_moe_weights w = {.gate = l.gate, .bias = l.bias, .w13 = l.w13, .s13 = l.s13,
                             .w2 = l.w2, .s2 = l.s2, .shared_w13 = l.sw13,
                             .shared_s13 = l.ss13, .shared_w2 = l.sw2, .shared_s2 = l.ss2};
    if (moetune_device_open(spec, &dev) != MOETUNE_OK ||
        moetune_moe_create(dev, &d, &w, &moe) != MOETUNE_OK ||
        moetune_moe_run(moe, x, M, y, NULL) != MOETUNE_OK) {
        fprintf(stderr, "moe_example: %s: %s\n", moetune_status_str(moetune_errcode(dev)),
                moetune_errmsg(dev));
        return 2;
    }
    const char *report = moetune_moe_report(moe), *summary = strstr(report, "summary:");

    /* The reference, token by token, and the comparison. */
    int bad = 0, ties = 0;
    double worst = 0;
    double *ref = malloc(sizeof(double) * (size_t)H);
    for (int64_t t = 0; t < M; t++) {
        memset(ref, 0, sizeof(double) * (size_t)H);
        expert(s, S, l.sw13, l.ss13, l.sw2, l.ss2, x + t * H, 1.0f, ref);
        for (int64_t j = 0; j < K; j++) {
            int64_t e = ids[t * K + j];
            expert(s, I, l.w13 + e * 2 * I * H / 2, l.s13 + e * 2 * I * H / 32,
                   l.w2 + e * H * I / 2, l.s2 + e * H * I / 32, x + t * H, tw[t * K + j], ref);
        }
        double rowmax = 0, err = 0;
        for (int64_t n = 0; n < H; n++)
            rowmax = fmax(rowmax, fabs(ref[n]));
        int64_t at = -1;
        for (int64_t n = 0; n < H; n++) {
            double e = fabs(y[t * H + n] - ref[n]);
            if (!(e <= 1e-2 * rowmax + 1e-2 * fabs(ref[n])) && at < 0)
                at = n;
            err = fmax(err, e / rowmax);
        }
        if (margin[t] < 1e-5) { /* a near tie in routing: either choice is right */
            ties++;
            continue;
        }
        worst = fmax(worst, err);
        if (at >= 0) {
            fprintf(stderr, "moe_example: token %lld column %lld: got %g, reference %g\n",
                    (long long)t, (long long)at, y[t * H + at], ref[at]);
            bad++;
        }
    }
    printf("moe_example: %s, %s layer (H=%lld I=%lld E=%lld top-%lld shared %lld), %lld tokens: "
           "largest error %.2e of a row's largest value%s; %s\n%s",
           spec, sname, (long long)H, (long long)I, (long long)E, (long long)K, (long long)S,
           (long long)M, worst, ties ? " (near-tie tokens skipped)" : "",
           bad ? "MISMATCH" : "matches the reference", summary ? summary : report);
    moetune_moe_destroy(moe);
    moetune_device_close(dev);
    void *mem[] = {x, l.gate, l.bias, ids, tw, margin, l.w13, l.s13, l.w2, l.s2, l.sw13,
                   l.ss13, l.sw2, l.ss2, used, y, ref};
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++)
        free(mem[i]);
    return bad ? 1 : 0;
}
