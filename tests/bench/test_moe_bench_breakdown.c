/* test_moe_bench_breakdown.c: `moetune bench --family moe --breakdown` on
 * the tiny shape: after each M's layer line comes one line with the time
 * of each kernel the served layer ran (router, expert sort, both expert
 * GEMMs, combine; the shared expert's three when the shape has one), each
 * positive, and nothing for kernels it did not run. Speed itself is not
 * asserted. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/lib/moe_bench.h"
#include "common/rng.h"
#include "model/moe_layer.h"

enum { N_M = 2 };
static const int64_t test_ms[N_M] = {1, 5};

Test(moe_bench_breakdown, prints_each_kernel_of_the_served_layer_per_m, .timeout = 300)
{
    dev_device *d = NULL;
    mt_err err = MT_ERR_INIT;
    cr_assert_eq(dev_open("cpu", NULL, &d, &err), MT_OK, "%s", err.msg);
    uint64_t seed = mt_seed_fresh();
    cr_log_info("seed %llu", (unsigned long long)seed);
    char *text = NULL, *log_text = NULL;
    size_t len = 0, log_len = 0;
    FILE *out = open_memstream(&text, &len), *log = open_memstream(&log_text, &log_len);
    cr_assert(out && log);
    moe_bench_opts o = {.shape = "tiny", .family = "moe", .ms = test_ms, .n_ms = N_M,
                        .json = true, .breakdown = true, .max_ms = 1e-6, .seed = seed,
                        .no_limits = true, .log = log};
    mt_status st = moe_bench_run(d, &o, out, &err);
    fclose(out);
    fclose(log);
    cr_assert_eq(st, MT_OK, "%s", err.msg);

    int layers = 0, breakdowns = 0;
    int64_t last_layer_m = -1;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        cr_assert(j, "not JSON: %s", line);
        const cJSON *stage = cJSON_GetObjectItemCaseSensitive(j, "stage");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "M");
        if (cJSON_IsString(stage) && !strcmp(stage->valuestring, "layer")) {
            layers++;
            last_layer_m = (int64_t)m->valuedouble;
        } else if (cJSON_IsString(stage) && !strcmp(stage->valuestring, "layer_kernels")) {
            breakdowns++;
            cr_assert_eq((int64_t)m->valuedouble, last_layer_m,
                         "the breakdown follows its M's layer line: %s", line);
            const cJSON *ms = cJSON_GetObjectItemCaseSensitive(j, "ms");
            cr_assert(cJSON_IsObject(ms), "%s", line);
            static const int routed[] = {MODEL_MOE_ROUTE, MODEL_MOE_ALIGN, MODEL_MOE_UP,
                                         MODEL_MOE_DOWN, MODEL_MOE_COMBINE};
            for (size_t i = 0; i < sizeof routed / sizeof routed[0]; i++) {
                const char *name = model_moe_kernel_names[routed[i]];
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(ms, name);
                cr_assert(cJSON_IsNumber(v) && v->valuedouble > 0, "no time for %s: %s", name,
                          line);
            }
            /* The shared expert's kernels: all three or none. */
            int shared = 0;
            for (int k = MODEL_MOE_SH_ALIGN; k <= MODEL_MOE_SH_DOWN; k++) {
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(ms, model_moe_kernel_names[k]);
                if (v) {
                    cr_assert(cJSON_IsNumber(v) && v->valuedouble > 0, "%s", line);
                    shared++;
                }
            }
            cr_assert(shared == 0 || shared == 3, "%d of the shared expert's 3 kernels: %s",
                      shared, line);
            cr_assert_eq(cJSON_GetArraySize(ms), 5 + shared, "unexpected kernels: %s", line);
        }
        cJSON_Delete(j);
    }
    cr_assert_eq(layers, N_M, "%s", text);
    cr_assert_eq(breakdowns, N_M, "%s", text);
    free(text);
    free(log_text);
    dev_close(d);
}
