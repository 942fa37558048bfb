/* fuzz_config.c: libFuzzer target for config.json parsing (model_config_parse,
 * including the Quark quantization_config with its globs and regular
 * expressions). Accepted configs must have consistent per-layer arrays; the
 * Quark rules are then exercised on a few module names. Built by run.sh. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/format/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    model_config *c = NULL;
    mt_err err = MT_ERR_INIT;
    if (model_config_parse(buf, size, "config.json", &c, &err) == MT_OK) {
        if (c->layer_count != c->num_hidden_layers + c->num_nextn_predict_layers ||
            !c->layer_indexer_full[0])
            abort();
        volatile int sink = 0;
        for (int64_t i = 0; i < c->layer_count; i++)
            sink += c->layer_moe[i] + c->layer_indexer_full[i];
        static const char *const modules[] = {
            "model.layers.3.mlp.experts.7.gate_proj", "model.layers.78.mlp.shared_experts.up_proj",
            "model.layers.0.self_attn.q_a_proj", "lm_head", "", "model.layers.1.mlp.gate"};
        for (size_t i = 0; i < sizeof modules / sizeof *modules; i++) {
            model_quark_match m;
            model_quark_lookup(c->quark, modules[i], &m);
            sink += (int)m.weight.kind;
        }
        (void)sink;
        model_config_destroy(c);
    } else if (!strstr(err.msg, "config.json")) {
        abort();
    }
    free(buf);
    return 0;
}
