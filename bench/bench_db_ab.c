/* bench_db_ab.c: a checkpoint's speed with a tuning database against its
 * default configs (no database), in the paired rounds of lib/model_ab.h:
 * a prefill of --prompt tokens, then --decode single-token steps; prints
 * each phase's speedup with its 95% interval. bench/serve_tune_accept.sh
 * runs it on the database a live-tuning server wrote.
 *
 * usage: bench_db_ab --model DIR --db FILE [--device cpu] [--prompt 128]
 *                    [--decode 16] [--rounds 10] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/lib/model_ab.h"
#include "common/rng.h"
#include "model/runtime.h"

int main(int argc, char **argv)
{
    const char *dir = NULL, *db = NULL, *device = "cpu";
    int n_prompt = 128, n_dec = 16, rounds = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            dir = argv[i + 1];
        else if (!strcmp(argv[i], "--db"))
            db = argv[i + 1];
        else if (!strcmp(argv[i], "--device"))
            device = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt"))
            n_prompt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--decode"))
            n_dec = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
    }
    if (!dir || !db || n_prompt < 1 || n_dec < 1) {
        fprintf(stderr, "usage: bench_db_ab --model DIR --db FILE [--device cpu] [--prompt N] "
                "[--decode N] [--rounds R]\n");
        return 2;
    }
    FILE *quiet = fopen("/dev/null", "w");
    model_runtime_opts o = {.model_dir = dir, .device = device, .log = quiet};
    model_runtime *a = NULL, *b = NULL;
    mt_err err = MT_ERR_INIT;
    mt_status st = model_runtime_open(&o, &a, &err);
    o.db_path = db;
    if (st == MT_OK)
        st = model_runtime_open(&o, &b, &err);
    int32_t *tok = malloc(sizeof *tok * (size_t)n_prompt);
    model_ab_result r;
    if (st == MT_OK && tok) {
        mt_rng rng;
        mt_rng_seed(&rng, mt_seed_fresh());
        for (int i = 0; i < n_prompt; i++)
            tok[i] = 16 + (int32_t)mt_rng_below(&rng, 200);
        model_ab_opts ao = {.rounds = rounds, .level = 0.95, .seed = 1};
        st = model_ab_compare(a, b, tok, n_prompt, n_dec, &ao, &r, &err);
    }
    if (st == MT_OK) {
        char p[160], d[160];
        model_ab_phase_text(&r.prefill, r.level, p, sizeof p);
        model_ab_phase_text(&r.decode, r.level, d, sizeof d);
        printf("database %s against the defaults, %d paired rounds:\n"
               "  prefill %d tokens: %.0f -> %.0f tok/s, %s\n"
               "  decode %d steps:   %.0f -> %.0f tok/s, %s\n",
               db, r.rounds, n_prompt, r.prefill.a_tps, r.prefill.b_tps, p, n_dec,
               r.decode.a_tps, r.decode.b_tps, d);
    } else {
        fprintf(stderr, "bench_db_ab: %s\n", err.msg);
    }
    free(tok);
    model_runtime_close(a);
    model_runtime_close(b);
    if (quiet)
        fclose(quiet);
    return st == MT_OK ? 0 : 1;
}
