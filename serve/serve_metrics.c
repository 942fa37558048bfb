/* serve_metrics.c: counters, gauges and histograms behind one mutex, and
 * their Prometheus text rendering (see serve_metrics.h). */
#include "serve_metrics.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BOUNDS 24

typedef struct hist {
    const char *name, *help;
    const double *bounds; /* upper bounds, increasing; +Inf implied */
    int nb;
    uint64_t counts[MAX_BOUNDS + 1]; /* per bucket, not cumulative */
    double sum;
    uint64_t count;
} hist;

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                     20.0,  40.0,  80.0};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                    0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0,   2.5};
static const double e2e_bounds[] = {0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                                    10.0, 20.0, 40.0, 80.0, 160.0, 320.0};
static const double batch_bounds[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
static const double tokens_bounds[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};

#define NB(a) ((int)(sizeof a / sizeof a[0]))

enum { H_TTFT, H_ITL, H_E2E, H_BATCH, H_TOKENS, H_COUNT };

struct serve_metrics {
    pthread_mutex_t mu;
    uint64_t requests[SERVE_API_COUNT][SERVE_OUTCOME_COUNT];
    uint64_t prompt_tokens, generation_tokens, cache_queries, cache_hits, preemptions,
        cancelled;
    uint64_t spec_rounds, spec_drafted, spec_accepted;
    hist h[H_COUNT];
    serve_metrics_state state;
    model_selection_counts sel;
    bool ready;
    bool tune_on; /* a live tuner pushed its state */
    serve_metrics_tune_state tune;
};

static const char *const outcome_names[SERVE_OUTCOME_COUNT] = {
    [SERVE_OUTCOME_OK] = "ok",
    [SERVE_OUTCOME_ERROR] = "error",
    [SERVE_OUTCOME_CANCELLED] = "cancelled",
};

mt_status serve_metrics_create(serve_metrics **out, mt_err *err)
{
    serve_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return mt_fail(err, MT_E_NOMEM, "serve_metrics_create: out of memory");
    pthread_mutex_init(&m->mu, NULL);
    m->h[H_TTFT] = (hist){"moetune_time_to_first_token_seconds",
                          "Time from request arrival to its first generated token.",
                          ttft_bounds, NB(ttft_bounds), {0}, 0, 0};
    m->h[H_ITL] = (hist){"moetune_inter_token_latency_seconds",
                         "Time between consecutive generated tokens of a request.", itl_bounds,
                         NB(itl_bounds), {0}, 0, 0};
    m->h[H_E2E] = (hist){"moetune_e2e_request_latency_seconds",
                         "Time from request arrival to its last token.", e2e_bounds,
                         NB(e2e_bounds), {0}, 0, 0};
    m->h[H_BATCH] = (hist){"moetune_batch_size", "Sequences in one forward step.", batch_bounds,
                           NB(batch_bounds), {0}, 0, 0};
    m->h[H_TOKENS] = (hist){"moetune_step_tokens", "Tokens in one forward step.", tokens_bounds,
                            NB(tokens_bounds), {0}, 0, 0};
    *out = m;
    return MT_OK;
}

void serve_metrics_destroy(serve_metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static void observe(serve_metrics *m, int which, double v)
{
    hist *h = &m->h[which];
    pthread_mutex_lock(&m->mu);
    int b = 0;
    while (b < h->nb && v > h->bounds[b])
        b++;
    h->counts[b]++;
    h->sum += v;
    h->count++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_request(serve_metrics *m, serve_api api, serve_outcome oc)
{
    if ((unsigned)api >= SERVE_API_COUNT || (unsigned)oc >= SERVE_OUTCOME_COUNT)
        return;
    pthread_mutex_lock(&m->mu);
    m->requests[api][oc]++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_prompt(serve_metrics *m, int64_t prompt, int64_t cached)
{
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)prompt;
    m->cache_queries += (uint64_t)prompt;
    m->cache_hits += (uint64_t)cached;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_generated(serve_metrics *m, int64_t tokens)
{
    pthread_mutex_lock(&m->mu);
    m->generation_tokens += (uint64_t)tokens;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_spec(serve_metrics *m, int64_t drafted, int64_t accepted)
{
    pthread_mutex_lock(&m->mu);
    m->spec_rounds++;
    m->spec_drafted += (uint64_t)drafted;
    m->spec_accepted += (uint64_t)accepted;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_preempted(serve_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->preemptions++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_cancelled(serve_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->cancelled++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_ttft(serve_metrics *m, double s) { observe(m, H_TTFT, s); }
void serve_metrics_itl(serve_metrics *m, double s) { observe(m, H_ITL, s); }
void serve_metrics_e2e(serve_metrics *m, double s) { observe(m, H_E2E, s); }

void serve_metrics_step(serve_metrics *m, int sequences, int tokens)
{
    observe(m, H_BATCH, sequences);
    observe(m, H_TOKENS, tokens);
}

void serve_metrics_state_set(serve_metrics *m, const serve_metrics_state *s)
{
    pthread_mutex_lock(&m->mu);
    m->state = *s;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_state_get(serve_metrics *m, serve_metrics_state *out)
{
    pthread_mutex_lock(&m->mu);
    *out = m->state;
    out->activity = (int64_t)(m->prompt_tokens + m->generation_tokens);
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_selection(serve_metrics *m, const model_selection_counts *c)
{
    pthread_mutex_lock(&m->mu);
    m->sel = *c;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_tune(serve_metrics *m, const serve_metrics_tune_state *t)
{
    pthread_mutex_lock(&m->mu);
    m->tune = *t;
    m->tune_on = true;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_ready(serve_metrics *m, bool ready)
{
    pthread_mutex_lock(&m->mu);
    m->ready = ready;
    pthread_mutex_unlock(&m->mu);
}

static mt_status head(serve_buf *o, const char *name, const char *type, const char *help)
{
    return serve_buf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static mt_status scalar(serve_buf *o, const char *name, const char *type, const char *help,
                        double v)
{
    if (head(o, name, type, help))
        return MT_E_NOMEM;
    return serve_buf_printf(o, "%s %.17g\n", name, v);
}

static mt_status render_hist(serve_buf *o, const hist *h)
{
    if (head(o, h->name, "histogram", h->help))
        return MT_E_NOMEM;
    uint64_t cum = 0;
    for (int b = 0; b < h->nb; b++) {
        cum += h->counts[b];
        if (serve_buf_printf(o, "%s_bucket{le=\"%g\"} %llu\n", h->name, h->bounds[b],
                             (unsigned long long)cum))
            return MT_E_NOMEM;
    }
    return serve_buf_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n",
                            h->name, (unsigned long long)h->count, h->name, h->sum, h->name,
                            (unsigned long long)h->count);
}

/* Per-rank load under data-parallel attention (nothing on one rank). */
static bool rank_load(serve_buf *o, const serve_metrics_state *s)
{
    static const struct {
        const char *name, *type, *help;
    } g[3] = {
        {"moetune_rank_sequences", "gauge", "Sequences (running and cached) a rank holds."},
        {"moetune_rank_kv_pages_used", "gauge", "KV cache pages in use on a rank."},
        {"moetune_rank_tokens_total", "counter", "Token rows a rank's attention ran."},
    };
    int n = s->n_ranks < SERVE_METRICS_MAX_RANKS ? s->n_ranks : SERVE_METRICS_MAX_RANKS;
    if (n < 2)
        return false;
    for (int k = 0; k < 3; k++) {
        const int64_t *v = k == 0 ? s->rank_seqs : k == 1 ? s->rank_pages_used : s->rank_tokens;
        if (head(o, g[k].name, g[k].type, g[k].help))
            return true;
        for (int r = 0; r < n; r++)
            if (serve_buf_printf(o, "%s{rank=\"%d\"} %lld\n", g[k].name, r, (long long)v[r]))
                return true;
    }
    return false;
}

/* The live tuner's metrics, when there is one. */
static bool render_tune(serve_buf *o, const serve_metrics *m)
{
    const serve_metrics_tune_state *t = &m->tune;
    if (!m->tune_on)
        return false;
    return scalar(o, "moetune_tune_tuned_total", "counter",
                  "Kernel and M bucket pairs the live tuner decided a winner for.",
                  (double)t->tuned) ||
           scalar(o, "moetune_tune_deepened_total", "counter",
                  "Of them, searched again to the whole budget.", (double)t->deepened) ||
           scalar(o, "moetune_tune_confirmed_total", "counter",
                  "Live tunes that confirmed a config faster than the default.",
                  (double)t->confirmed) ||
           scalar(o, "moetune_tune_failed_total", "counter", "Live tunes that ended in an error.",
                  (double)t->failed) ||
           scalar(o, "moetune_tune_pending", "gauge",
                  "Kernel and M bucket pairs still to tune at the last plan.",
                  (double)t->pending) ||
           scalar(o, "moetune_tune_pending_first", "gauge",
                  "Of them, still without a first pass.", (double)t->pending_first) ||
           scalar(o, "moetune_tune_covered", "gauge",
                  "1 when every kernel and M bucket the load called had its first pass.",
                  t->covered ? 1 : 0) ||
           scalar(o, "moetune_tune_paused", "gauge", "1 while the live tuner is paused.",
                  t->paused ? 1 : 0) ||
           scalar(o, "moetune_tune_busy_seconds_total", "counter",
                  "Time the live tuner spent in tune runs.", t->busy_s) ||
           scalar(o, "moetune_tune_compilers_held_seconds_total", "counter",
                  "Time its compilers were held stopped while serving.", t->held_s) ||
           scalar(o, "moetune_tune_measuring_seconds_total", "counter",
                  "Wall time of its measurements, from the gate to the worker's reply.",
                  t->measured_s) ||
           scalar(o, "moetune_tune_measure_cost_seconds_total", "counter",
                  "What its measurements took of the device (on cpu, CPU time over the cores).",
                  t->measure_cost_s) ||
           scalar(o, "moetune_tune_measure_wait_seconds_total", "counter",
                  "Time its measurements waited at the gate (queue, share of a busy server).",
                  t->gated_s);
}

static mt_status render_locked(const serve_metrics *m, serve_buf *o)
{
    if (head(o, "moetune_requests_total", "counter", "Requests answered, by endpoint and outcome."))
        return MT_E_NOMEM;
    for (int a = 0; a < SERVE_API_COUNT; a++)
        for (int c = 0; c < SERVE_OUTCOME_COUNT; c++)
            if (serve_buf_printf(o, "moetune_requests_total{endpoint=\"%s\",outcome=\"%s\"} %llu\n",
                                 serve_api_name((serve_api)a), outcome_names[c],
                                 (unsigned long long)m->requests[a][c]))
                return MT_E_NOMEM;
    double rate = m->cache_queries ? (double)m->cache_hits / (double)m->cache_queries : 0.0;
    const serve_metrics_state *s = &m->state;
    const model_selection_counts *c = &m->sel;
    if (scalar(o, "moetune_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
               (double)m->prompt_tokens) ||
        scalar(o, "moetune_generation_tokens_total", "counter", "Tokens generated.",
               (double)m->generation_tokens) ||
        scalar(o, "moetune_prefix_cache_queries_total", "counter",
               "Prompt tokens looked up in the prefix cache.", (double)m->cache_queries) ||
        scalar(o, "moetune_prefix_cache_hits_total", "counter",
               "Prompt tokens whose KV the prefix cache supplied.", (double)m->cache_hits) ||
        scalar(o, "moetune_prefix_cache_hit_rate", "gauge",
               "Prefix cache hits over queries, in tokens, since start.", rate) ||
        scalar(o, "moetune_preemptions_total", "counter",
               "Running requests sent back to wait for KV pages.", (double)m->preemptions) ||
        scalar(o, "moetune_requests_cancelled_total", "counter",
               "Requests whose client went away, their sequence freed by the engine.",
               (double)m->cancelled))
        return MT_E_NOMEM;
    double acc = m->spec_drafted ? (double)m->spec_accepted / (double)m->spec_drafted : 0.0;
    double len = m->spec_rounds ? 1.0 + (double)m->spec_accepted / (double)m->spec_rounds : 0.0;
    if (scalar(o, "moetune_spec_verify_rounds_total", "counter",
               "Speculative verify steps of requests (one per request and step).",
               (double)m->spec_rounds) ||
        scalar(o, "moetune_spec_draft_tokens_total", "counter",
               "Draft tokens the MTP layer proposed and the main model verified.",
               (double)m->spec_drafted) ||
        scalar(o, "moetune_spec_accepted_tokens_total", "counter", "Draft tokens accepted.",
               (double)m->spec_accepted) ||
        scalar(o, "moetune_spec_acceptance_rate", "gauge",
               "Accepted over verified draft tokens since start.", acc) ||
        scalar(o, "moetune_spec_mean_accepted_length", "gauge",
               "Tokens emitted per verify round since start (accepted drafts plus one).", len))
        return MT_E_NOMEM;
    for (int i = 0; i < H_COUNT; i++)
        if (render_hist(o, &m->h[i]))
            return MT_E_NOMEM;
    if (scalar(o, "moetune_requests_running", "gauge", "Requests holding a sequence.",
               (double)s->running) ||
        scalar(o, "moetune_requests_waiting", "gauge", "Requests waiting for admission.",
               (double)s->waiting) ||
        scalar(o, "moetune_kv_pages_used", "gauge", "KV cache pages in use.",
               (double)s->kv_pages_used) ||
        scalar(o, "moetune_kv_pages_total", "gauge", "KV cache pages in the pool.",
               (double)s->kv_pages_total) ||
        scalar(o, "moetune_prefix_cache_sequences", "gauge",
               "Finished sequences the prefix cache retains.", (double)s->cached_sequences) ||
        rank_load(o, s) ||
        head(o, "moetune_kernel_selections", "gauge",
             "Kernels the runtime selected at load, by where the config came from.") ||
        serve_buf_printf(o,
                         "moetune_kernel_selections{provenance=\"tuned\"} %d\n"
                         "moetune_kernel_selections{provenance=\"nearest\"} %d\n"
                         "moetune_kernel_selections{provenance=\"other_device\"} %d\n"
                         "moetune_kernel_selections{provenance=\"stale\"} %d\n"
                         "moetune_kernel_selections{provenance=\"default\"} %d\n",
                         c->tuned, c->nearest, c->other_device, c->stale, c->defaults) ||
        scalar(o, "moetune_kernel_misses", "gauge",
               "Kernels running the default config because the database had no entry.",
               (double)c->defaults) ||
        scalar(o, "moetune_kernel_swaps_total", "counter",
               "Tuned configs swapped into the kernel set while serving.", (double)c->swaps) ||
        scalar(o, "moetune_kernel_swaps_undone_total", "counter",
               "Live swaps undone because the new config ran slower while serving.",
               (double)c->swapped_back) ||
        scalar(o, "moetune_kernel_selections_swapped", "gauge",
               "Selections now running a config swapped in while serving.",
               (double)c->swapped) ||
        render_tune(o, m) ||
        scalar(o, "moetune_ready", "gauge", "1 once the model is loaded.", m->ready ? 1 : 0))
        return MT_E_NOMEM;
    return MT_OK;
}

mt_status serve_metrics_render(serve_metrics *m, serve_buf *out)
{
    pthread_mutex_lock(&m->mu);
    mt_status st = render_locked(m, out);
    pthread_mutex_unlock(&m->mu);
    return st;
}
