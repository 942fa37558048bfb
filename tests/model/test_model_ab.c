/* test_model_ab.c: paired A/B timing of two kernel selections of the model
 * (bench/lib/model_ab.h) on the tiny checkpoint, and `moetune tune`'s
 * --model-check option: the result is consistent (interval around its
 * estimate, the faster/slower flags from the interval) and bad arguments
 * are refused before anything runs. Speed itself is not asserted (no timed asserts). */
#include <math.h>
#include <sys/wait.h>

#include "bench/lib/model_ab.h"
#include "test_forward_util.h"

Test(model_ab, result_is_consistent_and_bad_arguments_are_refused, .timeout = 300)
{
    char *dir = fw_tiny_dir();
    model_runtime *a = fw_open(dir, (fw_open_args){.act = MODEL_ACT_MXFP4});
    model_runtime *b = fw_open(dir, (fw_open_args){.act = MODEL_ACT_MXFP4,
                                                   .batch_invariant = true});
    int32_t *tok = fw_tokens(mt_seed_fresh(), 24, model_runtime_vocab(a));
    model_ab_opts o = {.rounds = 4, .level = 0.9, .seed = 7};
    model_ab_result r;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(model_ab_compare(a, b, tok, 24, 4, &o, &r, &err), MT_OK, "%s", err.msg);
    cr_assert_eq(r.rounds, 4);
    cr_assert_float_eq(r.level, 0.9, 1e-12);
    const model_ab_phase *ph[2] = {&r.prefill, &r.decode};
    for (int i = 0; i < 2; i++) {
        const model_ab_phase *p = ph[i];
        cr_assert(isfinite(p->a_tps) && p->a_tps > 0 && isfinite(p->b_tps) && p->b_tps > 0);
        cr_assert(p->lo > 0 && p->lo <= p->speedup && p->speedup <= p->hi, "%g %g %g", p->lo,
                  p->speedup, p->hi);
        cr_assert_eq(p->b_faster, p->lo > 1);
        cr_assert_eq(p->b_slower, p->hi < 1);
        char text[128];
        model_ab_phase_text(p, r.level, text, sizeof text);
        cr_assert(strstr(text, "x [") && strstr(text, "at 90%"), "%s", text);
    }
    /* Refused before running. */
    o.rounds = 1;
    cr_assert_eq(model_ab_compare(a, b, tok, 24, 4, &o, &r, &err), MT_E_INVALID);
    cr_assert(strstr(err.msg, "rounds"), "%s", err.msg);
    o.rounds = TUNE_CONFIRM_MAX_ROUNDS + 1;
    cr_assert_eq(model_ab_compare(a, b, tok, 24, 4, &o, &r, &err), MT_E_INVALID);
    o.rounds = 2;
    cr_assert_eq(model_ab_compare(a, b, tok, 0, 4, &o, &r, &err), MT_E_INVALID);
    cr_assert_eq(model_ab_compare(a, b, tok, 24, 0, &o, &r, &err), MT_E_INVALID);
    free(tok);
    model_runtime_close(b);
    model_runtime_close(a);
    fw_rm_dir(dir);
}

static int tune_exit(const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s tune %s >/dev/null 2>&1", MOETUNE_BIN, args);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(model_ab, tune_model_check_option_is_validated)
{
    cr_assert_eq(tune_exit("--model /nonexistent --model-check 1"), 2);
    cr_assert_eq(tune_exit("--model /nonexistent --model-check x"), 2);
    cr_assert_eq(tune_exit("--model /nonexistent --model-check 65"), 2);
    cr_assert_eq(tune_exit("--family gemm --shape tiny --model-check 4"), 2);
}
