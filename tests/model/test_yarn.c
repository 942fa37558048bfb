/* test_yarn.c: YaRN RoPE numbers (model/config.h) against an implementation
 * written here from the formulas of the YaRN paper as transformers applies
 * them (_compute_yarn_parameters: a ramp over frequency indices between
 * the dims where beta_fast and beta_slow rotations fit the original
 * context, floor/ceil unless truncate is false), and against constants
 * printed by a separate Python transcription of transformers' code (float64)
 * for the GLM-5.x-like shapes: rope dim 64, theta 8e6 / 1e6, factor 40 / 4,
 * original context 4096 / 65536. Also the attention factor, DeepSeek-V3's
 * softmax-scale correction, and that plain RoPE keeps its old table. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attn/attn_common.h"
#include "model/format/config.h"

/* ---- the independent implementation ------------------------------------------ */

typedef struct yarn_case {
    double theta, factor, orig, beta_fast, beta_slow;
    int dim;
    bool truncate;
} yarn_case;

/* Frequency index at which a wave turns `rot` times over `orig` positions:
 * wavelength 2 pi theta^(2d/dim) = orig / rot, solved for d. */
static double index_for_rotations(const yarn_case *y, double rot)
{
    double wavelength = y->orig / rot;
    return log(wavelength / (2.0 * 3.14159265358979323846)) / log(y->theta) * y->dim / 2.0;
}

static void indep_inv_freq(const yarn_case *y, double *out)
{
    double a = index_for_rotations(y, y->beta_fast), b = index_for_rotations(y, y->beta_slow);
    if (y->truncate) {
        a = floor(a);
        b = ceil(b);
    }
    if (a < 0)
        a = 0;
    if (b > y->dim - 1)
        b = y->dim - 1;
    double span = a == b ? 0.001 : b - a;
    for (int i = 0; i < y->dim / 2; i++) {
        double theta_i = exp(-(2.0 * i / y->dim) * log(y->theta)); /* plain RoPE */
        double t = (i - a) / span;
        double interp_share = t <= 0 ? 0 : t >= 1 ? 1 : t;
        out[i] = theta_i * (1 - interp_share) + theta_i / y->factor * interp_share;
    }
}

static double indep_mscale(double s, double m) { return s <= 1 ? 1.0 : 1.0 + 0.1 * m * log(s); }

/* ---- configs ------------------------------------------------------------------ */

/* A GLM-5-shaped config.json with the given rope_parameters object text. */
static model_config *config_with(const char *rope_params, int64_t max_pos)
{
    char json[2048];
    snprintf(json, sizeof json,
             "{\"model_type\":\"glm_moe_dsa\",\"hidden_size\":6144,\"num_hidden_layers\":4,"
             "\"vocab_size\":1000,\"max_position_embeddings\":%lld,\"rms_norm_eps\":1e-5,"
             "\"first_k_dense_replace\":1,\"intermediate_size\":128,"
             "\"moe_intermediate_size\":64,\"n_routed_experts\":8,\"n_shared_experts\":1,"
             "\"num_experts_per_tok\":2,\"routed_scaling_factor\":2.5,\"norm_topk_prob\":true,"
             "\"num_attention_heads\":64,\"q_lora_rank\":2048,\"kv_lora_rank\":512,"
             "\"qk_nope_head_dim\":192,\"qk_rope_head_dim\":64,\"v_head_dim\":256,"
             "\"index_topk\":2048,\"index_n_heads\":32,\"index_head_dim\":128,"
             "\"rope_parameters\":%s}",
             (long long)max_pos, rope_params);
    model_config *c = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_config_parse(json, strlen(json), "config.json", &c, &err), MT_OK, "%s",
                 err.msg);
    return c;
}

static void expect_close(double got, double want, double rel, const char *what, int i)
{
    cr_expect(fabs(got - want) <= rel * fabs(want), "%s[%d]: got %.17g, want %.17g", what, i,
              got, want);
}

static void check_against_independent(const model_config *c, const yarn_case *y)
{
    double got[32], want[32];
    model_config_rope_inv_freq(c, got);
    indep_inv_freq(y, want);
    for (int i = 0; i < 32; i++)
        expect_close(got[i], want[i], 1e-12, "inv_freq", i);
}

/* ---- tests -------------------------------------------------------------------- */

Test(yarn, glm_factor_40_from_4096_matches_independent_and_python_numbers)
{
    model_config *c = config_with("{\"rope_type\":\"yarn\",\"rope_theta\":8000000,\"factor\":40,"
                                  "\"original_max_position_embeddings\":4096,\"beta_fast\":32,"
                                  "\"beta_slow\":1,\"mscale\":1,\"mscale_all_dim\":1}",
                                  163840);
    check_against_independent(c, &(yarn_case){8e6, 40, 4096, 32, 1, 64, true});
    double f[32];
    model_config_rope_inv_freq(c, f);
    /* Python transcription of transformers: range [6, 14]. */
    const struct {
        int i;
        double v;
    } py[] = {{0, 1.0}, {5, 0.08344343802580334}, {10, 0.0035684387666526166},
              {11, 0.0016550947140719515}, {16, 8.838834764831843e-06},
              {20, 1.212017154679286e-06}, {31, 5.135368156349986e-09}};
    for (size_t k = 0; k < sizeof py / sizeof py[0]; k++)
        expect_close(f[py[k].i], py[k].v, 1e-13, "python", py[k].i);
    /* mscale == mscale_all_dim: no factor on cos/sin; softmax x mscale^2. */
    cr_expect_eq(model_config_rope_attention_factor(c), 1.0);
    expect_close(c->yarn.softmax_mult, 1.8738542070926265, 1e-15, "softmax_mult", 0);
    expect_close(c->yarn.softmax_mult, pow(indep_mscale(40, 1), 2), 1e-15, "softmax_mult", 1);
    expect_close(model_config_softmax_scale(c), 0.11711588794328916, 1e-15, "softmax_scale", 0);
    model_config_destroy(c);
}

Test(yarn, factor_4_from_65536_theta_1e6)
{
    model_config *c = config_with("{\"rope_type\":\"yarn\",\"rope_theta\":1000000,\"factor\":4,"
                                  "\"original_max_position_embeddings\":65536,"
                                  "\"mscale\":1,\"mscale_all_dim\":1}",
                                  262144);
    check_against_independent(c, &(yarn_case){1e6, 4, 65536, 32, 1, 64, true});
    double f[32];
    model_config_rope_inv_freq(c, f);
    expect_close(f[5], 0.1154781984689458, 1e-13, "python", 5);
    expect_close(f[11], 0.008659643233600653, 1e-13, "python", 11);
    expect_close(f[16], 0.00075, 1e-13, "python", 16);
    expect_close(f[31], 3.84981631514873e-07, 1e-13, "python", 31);
    expect_close(model_config_softmax_scale(c), 0.08102981204879414, 1e-15, "softmax_scale", 0);
    model_config_destroy(c);
}

Test(yarn, truncate_false_keeps_the_fractional_range)
{
    model_config *c = config_with("{\"rope_type\":\"yarn\",\"rope_theta\":8000000,\"factor\":40,"
                                  "\"original_max_position_embeddings\":4096,\"truncate\":false}",
                                  163840);
    check_against_independent(c, &(yarn_case){8e6, 40, 4096, 32, 1, 64, false});
    double f[32];
    model_config_rope_inv_freq(c, f);
    expect_close(f[10], 0.003137202829304806, 1e-12, "python", 10);
    expect_close(f[11], 0.0013169852886853765, 1e-12, "python", 11);
    model_config_destroy(c);
}

Test(yarn, attention_factor_defaults_and_override)
{
    /* No mscales: get_mscale(factor) on cos/sin, no softmax correction. */
    model_config *c = config_with("{\"rope_type\":\"yarn\",\"rope_theta\":10000,\"factor\":8,"
                                  "\"original_max_position_embeddings\":512,\"beta_fast\":16,"
                                  "\"beta_slow\":2}",
                                  4096);
    check_against_independent(c, &(yarn_case){1e4, 8, 512, 16, 2, 64, true});
    expect_close(model_config_rope_attention_factor(c), indep_mscale(8, 1), 1e-15, "af", 0);
    cr_expect_eq(c->yarn.softmax_mult, 1.0);
    cr_expect_eq(model_config_softmax_scale(c), 1.0 / 16.0);
    model_config_destroy(c);
    /* Both mscales: their ratio; mscale_all_dim also corrects the softmax. */
    c = config_with("{\"rope_type\":\"yarn\",\"rope_theta\":10000,\"factor\":40,"
                    "\"original_max_position_embeddings\":4096,\"mscale\":2,"
                    "\"mscale_all_dim\":1}",
                    163840);
    expect_close(model_config_rope_attention_factor(c), 1.269480015985188, 1e-15, "af", 1);
    expect_close(c->yarn.softmax_mult, pow(indep_mscale(40, 1), 2), 1e-15, "softmax_mult", 0);
    model_config_destroy(c);
    /* Only mscale: falls back to get_mscale(factor, 1). */
    c = config_with("{\"rope_type\":\"yarn\",\"rope_theta\":10000,\"factor\":40,"
                    "\"original_max_position_embeddings\":4096,\"mscale\":3}",
                    163840);
    expect_close(model_config_rope_attention_factor(c), indep_mscale(40, 1), 1e-15, "af", 2);
    cr_expect_eq(c->yarn.softmax_mult, 1.0);
    model_config_destroy(c);
    /* Given: used as is. */
    c = config_with("{\"rope_type\":\"yarn\",\"rope_theta\":10000,\"factor\":40,"
                    "\"original_max_position_embeddings\":4096,\"attention_factor\":0.75,"
                    "\"mscale\":1,\"mscale_all_dim\":1}",
                    163840);
    cr_expect_eq(model_config_rope_attention_factor(c), 0.75);
    model_config_destroy(c);
}

Test(yarn, table_holds_scaled_cos_sin_of_the_frequencies)
{
    model_config *c = config_with("{\"rope_type\":\"yarn\",\"rope_theta\":10000,\"factor\":8,"
                                  "\"original_max_position_embeddings\":512}",
                                  4096);
    enum { P = 300 };
    float *cs = malloc(sizeof(float) * P * 64);
    model_config_rope_table(c, P, cs);
    double want[32], af = indep_mscale(8, 1);
    indep_inv_freq(&(yarn_case){1e4, 8, 512, 32, 1, 64, true}, want);
    for (int p = 0; p < P; p += 37)
        for (int i = 0; i < 32; i++) {
            cr_expect(fabs(cs[p * 64 + i] - cos(p * want[i]) * af) <= 1e-6, "cos p %d i %d", p,
                      i);
            cr_expect(fabs(cs[p * 64 + 32 + i] - sin(p * want[i]) * af) <= 1e-6, "sin p %d i %d",
                      p, i);
        }
    free(cs);
    model_config_destroy(c);
}

Test(yarn, plain_rope_table_is_bit_identical_to_the_kernel_table)
{
    model_config *c = config_with("{\"rope_type\":\"default\",\"rope_theta\":8000000}", 4096);
    enum { P = 2048 };
    float *a = malloc(sizeof(float) * P * 64), *b = malloc(sizeof(float) * P * 64);
    model_config_rope_table(c, P, a);
    attn_rope_table(8e6, 64, P, b);
    cr_expect_eq(memcmp(a, b, sizeof(float) * P * 64), 0);
    cr_expect_eq(model_config_rope_attention_factor(c), 1.0);
    cr_expect_eq(model_config_softmax_scale(c), 1.0 / 16.0);
    free(a);
    free(b);
    model_config_destroy(c);
}
