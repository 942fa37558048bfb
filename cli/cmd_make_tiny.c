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

typedef struct tiny_opts {
    const char *out;
    uint64_t seed;
    bool mtp_map;
} tiny_opts;

static int parse(int argc, char **argv, tiny_opts *o)
{
    const cli_opt opts[] = {
        {.name = "--out", .type = CLI_OPT_STRING, .dst = &o->out, .arg = "DIR",
         .flags = CLI_OPT_REQUIRED, .help = "the folder to write (created if missing)"},
        {.name = "--seed", .type = CLI_OPT_UINT64, .dst = &o->seed, .arg = "N", .def = "1",
         .help = "seed of the random weights: the same seed writes the same files"},
        {.name = "--mtp-map", .type = CLI_OPT_FLAG, .dst = &o->mtp_map,
         .help = "build it as a next-token map (each token continues with a fixed other "
                 "one) whose MTP layer predicts the main model's next token, so speculative "
                 "decoding accepts nearly every draft"},
        {0},
    };
    const cli_cmd cmd = {
        .name = "make-tiny-model", .usage = "make-tiny-model --out DIR [--seed N] [--mtp-map]",
        .opts = opts,
        .about = "Writes config.json (with a Quark MXFP4 quantization_config), two "
                 "safetensors shards with model.safetensors.index.json, and tokenizer.json "
                 "into DIR: a tiny GLM-5 (hidden 256, 4 layers + 1 MTP layer, 16 experts "
                 "top-4, vocab 512) with seeded random weights, then loads it back to prove "
                 "it is complete and prints what it holds."};
    return cli_opts_parse(&cmd, argc, argv, 1);
}

/* Loads what was written back: the weights and the tokenizer; prints them. */
static int check_written(const tiny_opts *o)
{
    mt_err err = MT_ERR_INIT;
    model_weights *w = NULL;
    if (model_weights_open(o->out, &w, &err) != MT_OK) {
        cli_error("make-tiny-model", "the written checkpoint does not load: %s", err.msg);
        return CLI_FAIL;
    }
    size_t n = strlen(o->out) + 32;
    char *tok_path = malloc(n);
    model_tokenizer *tok = NULL;
    mt_status st = MT_E_NOMEM;
    if (tok_path) {
        snprintf(tok_path, n, "%s/tokenizer.json", o->out);
        st = model_tokenizer_load(tok_path, &tok, &err);
    }
    free(tok_path);
    if (st != MT_OK) {
        model_weights_close(w);
        cli_error("make-tiny-model", "the written tokenizer does not load: %s", err.msg);
        return CLI_FAIL;
    }
    printf("wrote %s (seed %" PRIu64 "): %d tokens in tokenizer.json\n", o->out, o->seed,
           (int)model_tokenizer_vocab_size(tok));
    model_weights_print_summary(w, stdout);
    model_tokenizer_destroy(tok);
    model_weights_close(w);
    return CLI_OK;
}

int cmd_make_tiny_model(int argc, char **argv)
{
    tiny_opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == CLI_HELP ? CLI_OK : rc;
    mt_err err = MT_ERR_INIT;
    mt_status st = o.mtp_map ? model_tiny_write_mtp_map(o.out, o.seed, &err)
                             : model_tiny_write(o.out, o.seed, &err);
    if (st != MT_OK) {
        cli_error("make-tiny-model", "%s", err.msg);
        return CLI_FAIL;
    }
    return check_written(&o);
}
