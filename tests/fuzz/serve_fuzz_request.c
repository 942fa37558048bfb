/* serve_fuzz_request.c: libFuzzer target for the server's request parsing:
 * the first byte picks the endpoint, the rest is the body. Accepted
 * requests must satisfy the documented ranges and turn into prompt ids (with
 * the tiny model's tokenizer when MT_FUZZ_TOKENIZER names a tokenizer.json)
 * and a max_tokens within the context; rejected ones must carry a 4xx and a
 * message, and their error body must be JSON of OpenAI's shape. The new
 * fields too: sampling values in their ranges, logit_bias ids in the
 * vocabulary, and a request's constraints (response_format, tool_choice
 * required or named) compile into a grammar or a 4xx naming the field, and
 * the grammar, walked 256 bytes along a path the input picks, never reaches
 * a dead end. Each input is parsed and compiled on a thread with a civetweb
 * worker's stack (100 KiB, as Debian builds civetweb), where the server does
 * it. Built and run by serve_fuzz.sh. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_grammar.h"
#include "serve/serve_logits.h"
#include "serve/serve_request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static model_tokenizer *tok;
static bool tok_tried;

static void check_error_body(const serve_error *e)
{
    char *j = serve_error_json(e);
    cJSON *o = j ? cJSON_Parse(j) : NULL;
    cJSON *er = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(er, "message")) ||
        !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(er, "type")) ||
        !cJSON_GetObjectItemCaseSensitive(er, "param") ||
        !cJSON_GetObjectItemCaseSensitive(er, "code"))
        abort();
    cJSON_Delete(o);
    free(j);
}

typedef struct input {
    const uint8_t *data;
    size_t size;
} input;

/* A request's grammar: compiled, or a 4xx naming a field; then a walk of
 * up to 256 bytes, each the first the grammar takes in an order the input
 * picks, with no dead end. */
static void check_grammar(const serve_request *r, bool chat, const uint8_t *data, size_t size)
{
    int32_t stop = 0;
    serve_logits_spec spec;
    serve_error e = SERVE_ERROR_INIT;
    if (serve_logits_spec_make(r, chat, tok, &stop, 1, &spec, &e) != MT_OK)
        abort(); /* only out of memory fails */
    if (spec.lo.grammar) {
        serve_grammar *g = NULL;
        if (serve_grammar_compile(&spec.go, &g, &e) != MT_OK) {
            if (e.http < 400 || e.http > 499 || !e.param[0] || g)
                abort();
            check_error_body(&e);
        } else {
            serve_gstate s, t;
            serve_grammar_start(g, &s);
            for (int step = 0; step < 256; step++) {
                uint8_t start = size ? data[(size_t)step % size] : 0;
                bool moved = false;
                for (int k = 0; k < 256 && !moved; k++) {
                    t = s;
                    if (serve_grammar_step(g, &t, (uint8_t)(start + k))) {
                        s = t;
                        moved = true;
                    }
                }
                if (!moved) {
                    if (!serve_grammar_accepting(g, &s))
                        abort(); /* a dead end */
                    break;
                }
            }
            serve_grammar_release(g);
        }
    }
    serve_logits_spec_release(&spec);
}

static int one_input(const uint8_t *data, size_t size)
{
    if (!tok_tried) {
        tok_tried = true;
        const char *p = getenv("MT_FUZZ_TOKENIZER");
        if (p && model_tokenizer_load(p, &tok, NULL) != MT_OK)
            abort();
    }
    if (size < 1)
        return 0;
    serve_api api = (serve_api)(data[0] % SERVE_API_COUNT);
    serve_limits lim = {256, tok ? model_tokenizer_vocab_size(tok) : 512};
    serve_request r;
    serve_error e = SERVE_ERROR_INIT;
    if (serve_request_parse(api, (const char *)data + 1, size - 1, &lim, &r, &e) != MT_OK) {
        if (e.http < 400 || e.http > 499 || !e.err.msg[0])
            abort();
        check_error_body(&e);
        return 0;
    }
    if (r.max_tokens != -1 && (r.max_tokens < 1 || r.max_tokens > lim.max_context))
        abort();
    if (r.temperature < 0 || r.temperature > 2 || r.top_p <= 0 || r.top_p > 1 || r.top_k < 0 ||
        r.n_stop < 0 || r.n_stop > SERVE_MAX_STOP)
        abort();
    for (int i = 0; i < r.n_stop; i++)
        if (!r.stop[i][0] || strlen(r.stop[i]) > SERVE_MAX_STOP_LEN)
            abort();
    for (size_t i = 0; i < r.n_ids; i++)
        if (r.ids[i] < 0 || r.ids[i] >= lim.vocab)
            abort();
    if (r.min_p < 0 || r.min_p > 1 || r.presence_penalty < -2 || r.presence_penalty > 2 ||
        r.frequency_penalty < -2 || r.frequency_penalty > 2 || !(r.repetition_penalty > 0) ||
        r.repetition_penalty > 10 || r.n_logit_bias < 0 || r.n_logit_bias > SERVE_MAX_LOGIT_BIAS)
        abort();
    for (int i = 0; i < r.n_logit_bias; i++)
        if (r.logit_bias[i].id < 0 || r.logit_bias[i].id >= lim.vocab ||
            r.logit_bias[i].bias < -100 || r.logit_bias[i].bias > 100)
            abort();
    if (api == SERVE_API_COMPLETIONS || api == SERVE_API_CHAT)
        check_grammar(&r, api == SERVE_API_CHAT, data, size);
    int32_t *ids = NULL;
    size_t n = 0;
    if (serve_request_prompt(&r, tok, &lim, &ids, &n, &e) == MT_OK) {
        int64_t mt;
        bool gen = api == SERVE_API_COMPLETIONS || api == SERVE_API_CHAT;
        if (gen && (n == 0 || (int64_t)n >= lim.max_context))
            abort();
        if (gen && serve_request_max_tokens(&r, n, &lim, &mt, &e) == MT_OK &&
            ((int64_t)n + mt > lim.max_context || mt < 1))
            abort();
        free(ids);
    } else {
        if (ids || e.http < 400 || e.http > 499)
            abort();
        check_error_body(&e);
    }
    serve_request_release(&r);
    return 0;
}

static void *input_main(void *arg)
{
    input *in = arg;
    one_input(in->data, in->size);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input in = {data, size};
    pthread_attr_t a;
    pthread_t th;
    if (pthread_attr_init(&a) || pthread_attr_setstacksize(&a, 100u << 10) ||
        pthread_create(&th, &a, input_main, &in))
        abort();
    pthread_join(th, NULL);
    pthread_attr_destroy(&a);
    return 0;
}
