/* cmd_make_tiny.c: `moetune make-tiny-model`: writes a small random GLM-5
 * checkpoint in the real Quark MXFP4 format, then loads it back to prove it
 * is complete and prints what it holds. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/format/tiny.h"
#include "model/format/tokenizer.h"
#include "model/format/weights.h"
#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: moetune make-tiny-model --out DIR [--seed N] [--mtp-map]\n"
               "Writes config.json (with a Quark MXFP4 quantization_config), two safetensors\n"
               "shards with model.safetensors.index.json, and tokenizer.json into DIR: a tiny\n"
               "GLM-5 (hidden 256, 4 layers + 1 MTP layer, 16 experts top-4, vocab 512) with\n"
               "seeded random weights (default seed 1). The same seed writes the same files.\n"
               "--mtp-map builds it as a next-token map (each token continues with a fixed\n"
               "other one) whose MTP layer predicts the main model's next token, so\n"
               "speculative decoding accepts nearly every draft.\n");
}

int cmd_make_tiny_model(int argc, char **argv)
{
    const char *out = NULL, *v;
    uint64_t seed = 1;
    bool bad = false, mtp_map = false;
    for (int i = 1; i < argc; i++) {
        if (cli_flag(argv[i], "--help") || cli_flag(argv[i], "-h")) {
            usage(stdout);
            return CLI_OK;
        } else if (cli_flag(argv[i], "--mtp-map")) {
            mtp_map = true;
        } else if ((v = cli_opt(argc, argv, &i, "--out", &bad))) {
            out = v;
        } else if ((v = cli_opt(argc, argv, &i, "--seed", &bad))) {
            char *end;
            seed = strtoull(v, &end, 0);
            if (!*v || *end) {
                cli_error("make-tiny-model", "--seed '%s' is not a number", v);
                return CLI_USAGE;
            }
        } else if (!bad) {
            cli_error("make-tiny-model", "unknown option '%s'", argv[i]);
            bad = true;
        }
    }
    if (bad || !out) {
        if (!out && !bad)
            cli_error("make-tiny-model", "--out DIR is required");
        usage(stderr);
        return CLI_USAGE;
    }
    mt_err err = MT_ERR_INIT;
    if ((mtp_map ? model_tiny_write_mtp_map(out, seed, &err) : model_tiny_write(out, seed, &err)) !=
        MT_OK) {
        cli_error("make-tiny-model", "%s", err.msg);
        return CLI_FAIL;
    }
    model_weights *w = NULL;
    if (model_weights_open(out, &w, &err) != MT_OK) {
        cli_error("make-tiny-model", "the written checkpoint does not load: %s", err.msg);
        return CLI_FAIL;
    }
    size_t n = strlen(out) + 32;
    char *tok_path = malloc(n);
    model_tokenizer *tok = NULL;
    mt_status st = MT_E_NOMEM;
    if (tok_path) {
        snprintf(tok_path, n, "%s/tokenizer.json", out);
        st = model_tokenizer_load(tok_path, &tok, &err);
    }
    free(tok_path);
    if (st != MT_OK) {
        model_weights_close(w);
        cli_error("make-tiny-model", "the written tokenizer does not load: %s", err.msg);
        return CLI_FAIL;
    }
    printf("wrote %s (seed %" PRIu64 "): %d tokens in tokenizer.json\n", out, seed,
           (int)model_tokenizer_vocab_size(tok));
    model_weights_print_summary(w, stdout);
    model_tokenizer_destroy(tok);
    model_weights_close(w);
    return CLI_OK;
}
