/* quickstart.c: the smallest program on libmoetune: a MoE layer with random
 * MXFP4 weights on the cpu, one run, the kernel selection (docs/LIBRARY.md
 * shows this file). cc quickstart.c $(pkg-config --cflags --libs moetune) */
#include <moetune/moetune.h>
#include <stdio.h>
#include <stdlib.h>

enum { H = 256, I = 128, E = 16, M = 4 };

static void *fill(size_t n, int mod, int base) /* random bytes in [base, base + mod) */
{
    unsigned char *p = aligned_alloc(64, n);
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(base + rand() % mod);
    return p;
}

int main(void)
{
    moetune_device *dev;
    if (moetune_device_open("cpu", &dev) != MOETUNE_OK) {
        fprintf(stderr, "%s\n", moetune_errmsg(dev));
        return 1;
    }
    moetune_moe_desc d;
    moetune_moe_desc_init(&d);
    d.hidden = H, d.inter = I, d.experts = E, d.topk = 4, d.max_tokens = M;
    d.routing = MOETUNE_ROUTE_GATE, d.routed_scale = 2.5f;
    moetune_moe_weights w = {
        .gate = fill(E * H * 2, 64, 0), /* bf16 bits: small positive values */
        .w13 = fill(E * 2 * I * H / 2, 256, 0), .s13 = fill(E * 2 * I * H / 32, 4, 118),
        .w2 = fill(E * H * I / 2, 256, 0), .s2 = fill(E * H * I / 32, 4, 118)};
    moetune_moe *layer;
    uint16_t *x = fill(M * H * 2, 64, 0);
    float *y = aligned_alloc(64, M * H * sizeof(float));
    if (moetune_moe_create(dev, &d, &w, &layer) != MOETUNE_OK ||
        moetune_moe_run(layer, x, M, y, NULL) != MOETUNE_OK) {
        fprintf(stderr, "%s\n", moetune_errmsg(dev));
        return 1;
    }
    printf("y[0][0..3] = %g %g %g %g\n%s", y[0], y[1], y[2], y[3], moetune_moe_report(layer));
    moetune_moe_destroy(layer);
    moetune_device_close(dev);
    return 0;
}
