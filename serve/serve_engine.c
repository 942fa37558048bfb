/* serve_engine.c: the engine thread (see serve_engine.h): admission with the
 * prefix cache, continuous batching steps, sampling, publishing, eviction
 * and preemption.
 *
 * Locks: e->mu guards the submit queue, the state and the cancel hint;
 * g->mu guards what a request publishes (tokens count, finish, error,
 * cancel flag, references). A thread that holds g->mu may take e->mu (the
 * cancel path); the engine never holds e->mu while taking a g->mu. */
#include "serve_engine.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "model/format/chat.h"
#include "model/kset_swap.h"
#include "model/spec.h"
#include "serve_logits.h"
#include "serve_prefix.h"
#include "serve_sched.h"

enum { CANCEL_NONE = 0, CANCEL_KEEP = 1, CANCEL_FREE = 2 };

struct serve_gen {
    serve_engine *e; /* only touched while the request is unfinished */
    /* Immutable after submit. */
    int32_t *tokens; /* prompt, then generated tokens; room for all */
    int64_t n_prompt, max_tokens;
    model_sampler sampler;
    bool ignore_eos, chat;
    int spec_k;      /* drafts per step for this request (0: off) */
    uint64_t t_arrival;
    bool want_lp;
    int n_top;
    float *lp;       /* [max_tokens] */
    int32_t *top_id; /* [max_tokens][n_top] */
    float *top_lp;
    serve_gen *follow; /* a reference */
    model_logit_bias *bias;     /* the sampler's logit bias (owned) */
    serve_logits *constraints;  /* may be NULL */
    /* Engine thread only. */
    model_token_counts counts;  /* with penalties: prompt and generated tokens */
    bool counted;
    mt_rng rng;
    int seq;
    int64_t n_tokens;   /* prompt + generated */
    int64_t n_computed; /* tokens with KV in seq */
    float *logits;
    uint64_t t_last;
    bool ever_admitted;
    int followers_due;    /* choices still to be queued behind this one (n > 1) */
    model_spec_seq *sp;   /* speculative decoding state; NULL when off */
    int32_t verify[MODEL_SPEC_MAX_STEPS + 1]; /* the verify step's tokens */
    /* Under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int64_t pub_generated;
    int64_t cached;
    bool admitted;
    double ttft_s;
    int64_t spec_rounds, spec_drafted, spec_accepted;
    serve_finish finish;
    serve_error error;
    int cancel;
    int refs;
    serve_gen *next; /* submit queue (under e->mu) */
};

struct serve_engine {
    char *model_dir, *db_path, *device;
    model_runtime_opts rt_opts;
    int max_batch_opt, max_cached;
    serve_metrics *metrics;
    bool live_swaps;
    serve_sample_hook hook;
    void *hook_ctx;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t wake;     /* the engine thread waits here */
    pthread_cond_t state_cv; /* serve_engine_wait_ready waits here */
    serve_engine_state state;
    mt_err load_err;
    bool stop;
    bool cancel_hint;
    serve_gen *sub_head, *sub_tail;

    /* Engine thread only (info is immutable once READY). */
    model_runtime *rt;
    serve_model_info info;
    serve_sched_cfg cfg;
    serve_prefix *cache;
    serve_gen **waiting;
    int n_waiting, cap_waiting;
    serve_gen **running;
    int n_running;
    model_step_item *items;
    serve_gen **item_gen;
    serve_sched_req *sreq;
    int *chunk;
    int *idx;                  /* a rank's running requests (plan_step) */
    int n_ranks;               /* data-parallel attention: ranks sequences live on */
    int64_t *rank_free;        /* per rank: pages free after the planned step (plan_step) */
    int *rank_tokens;          /* per rank: the planned step's tokens */
    int spec_k;                /* drafts per round (0: speculative decoding off) */
    model_spec_catchup *catchup;
    int64_t prefill_positions; /* model_runtime_prefill_positions (path_exact) */
};

static double secs(uint64_t ns) { return (double)ns * 1e-9; }

/* ---- requests ------------------------------------------------------------------ */

static void gen_free(serve_gen *g)
{
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cond);
    free(g->tokens);
    free(g->logits);
    free(g->lp);
    free(g->top_id);
    free(g->top_lp);
    if (g->sp)
        model_spec_seq_release(g->sp);
    free(g->sp);
    free(g->bias);
    serve_logits_destroy(g->constraints);
    model_token_counts_release(&g->counts);
    serve_gen *f = g->follow;
    free(g);
    serve_gen_release(f);
}

void serve_gen_release(serve_gen *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last)
        gen_free(g);
}

static void fill_view(serve_gen *g, serve_gen_view *v)
{
    v->tokens = g->tokens + g->n_prompt;
    v->n_generated = g->pub_generated;
    v->n_prompt = g->n_prompt;
    v->n_cached = g->cached;
    v->admitted = g->admitted;
    v->finish = g->finish;
    v->error = g->error;
    v->ttft_s = g->ttft_s;
    v->logprobs = g->lp;
    v->top_ids = g->n_top ? g->top_id : NULL;
    v->top_logprobs = g->n_top ? g->top_lp : NULL;
    v->n_top = g->n_top;
    v->spec_rounds = g->spec_rounds;
    v->spec_drafted = g->spec_drafted;
    v->spec_accepted = g->spec_accepted;
}

void serve_gen_wait(serve_gen *g, int64_t seen, double timeout_s, serve_gen_view *v)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    double t = timeout_s < 0 ? 0 : timeout_s;
    dl.tv_sec += (time_t)t;
    dl.tv_nsec += (long)((t - (double)(time_t)t) * 1e9);
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g->mu);
    while (g->pub_generated <= seen && g->finish == SERVE_FINISH_NONE)
        if (pthread_cond_timedwait(&g->cond, &g->mu, &dl) == ETIMEDOUT)
            break;
    fill_view(g, v);
    pthread_mutex_unlock(&g->mu);
}

void serve_gen_cancel(serve_gen *g, bool free_kv)
{
    pthread_mutex_lock(&g->mu);
    if (g->finish == SERVE_FINISH_NONE && g->cancel == CANCEL_NONE) {
        g->cancel = free_kv ? CANCEL_FREE : CANCEL_KEEP;
        /* The engine is alive: it finishes g only after taking g->mu. */
        serve_engine *e = g->e;
        pthread_mutex_lock(&e->mu);
        e->cancel_hint = true;
        pthread_cond_signal(&e->wake);
        pthread_mutex_unlock(&e->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

/* ---- engine thread helpers ---------------------------------------------------- */

static void publish_finish(serve_engine *e, serve_gen *g, serve_finish f, const serve_error *err)
{
    pthread_mutex_lock(&g->mu);
    g->pub_generated = g->n_tokens - g->n_prompt;
    g->finish = f;
    if (err)
        g->error = *err;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->mu);
    if (e->metrics && f != SERVE_FINISH_ERROR)
        serve_metrics_e2e(e->metrics, secs(mt_now_ns() - g->t_arrival));
    serve_gen_release(g); /* the engine's reference */
}

/* Evicts the least recently used retained sequence; false when none. */
typedef struct rank_of {
    model_runtime *rt;
    int rank;
} rank_of;

static bool on_rank(void *ctx, int seq)
{
    const rank_of *r = ctx;
    return model_seq_rank(r->rt, seq) == r->rank;
}

/* Frees the least recently used cached sequence; rank >= 0: of that rank
 * (data-parallel attention: pages are a rank's own). */
static bool evict_on(serve_engine *e, int rank)
{
    int seq;
    rank_of ro = {e->rt, rank};
    if (!e->cache || !serve_prefix_evict_if(e->cache, rank >= 0 ? on_rank : NULL, &ro, &seq))
        return false;
    model_seq_free(e->rt, seq);
    return true;
}

static bool evict_one(serve_engine *e) { return evict_on(e, -1); }

/* Of g's first n tokens, how many the prefix cache may share, either way:
 * all of them, unless g's prompt ends below the positions where prompt and
 * generated rows take different attention paths (runtime.h); then only its
 * prompt, so that KV computed for a generated token there never serves as
 * a prompt's, nor the reverse, and a token's logits do not depend on what
 * the cache held (a chat's next turn recomputes the reply of a short first
 * turn). */
static int64_t path_exact(const serve_engine *e, const serve_gen *g, int64_t n)
{
    return g->n_prompt < e->prefill_positions && n > g->n_prompt ? g->n_prompt : n;
}

/* Gives up g's sequence: retained in the prefix cache when keep and worth
 * it, else freed. */
static void drop_seq(serve_engine *e, serve_gen *g, bool keep)
{
    if (g->seq < 0)
        return;
    if (e->cache)
        serve_prefix_remove(e->cache, g->seq);
    bool kept = false;
    int64_t valid = path_exact(e, g, g->n_computed);
    if (keep && e->cache && e->max_cached > 0 && valid >= e->info.page_size)
        kept = serve_prefix_add(e->cache, g->seq, g->tokens, g->n_tokens, valid, false,
                                mt_now_ns(), NULL) == MT_OK;
    if (!kept)
        model_seq_free(e->rt, g->seq);
    g->seq = -1;
    while (e->cache && serve_prefix_retained(e->cache) > e->max_cached && evict_one(e))
        ;
}

static void remove_at(serve_gen **arr, int *n, int i)
{
    memmove(arr + i, arr + i + 1, (size_t)(*n - i - 1) * sizeof *arr);
    (*n)--;
}

static void update_gauges(serve_engine *e);

/* The gauges are updated before the request's thread learns it finished,
 * so that /metrics read after a response never shows it running. */
static void finish_running(serve_engine *e, int i, serve_finish f, bool keep,
                           const serve_error *err)
{
    serve_gen *g = e->running[i];
    drop_seq(e, g, keep);
    remove_at(e->running, &e->n_running, i);
    update_gauges(e);
    publish_finish(e, g, f, err);
}

static void fail_waiting(serve_engine *e, int i, const serve_error *err)
{
    serve_gen *g = e->waiting[i];
    remove_at(e->waiting, &e->n_waiting, i);
    publish_finish(e, g, err ? SERVE_FINISH_ERROR : SERVE_FINISH_CANCELLED, err);
}

static bool push_waiting(serve_engine *e, serve_gen *g, bool front)
{
    if (e->n_waiting == e->cap_waiting) {
        int cap = e->cap_waiting ? e->cap_waiting * 2 : 64;
        serve_gen **w = realloc(e->waiting, (size_t)cap * sizeof *w);
        if (!w)
            return false;
        e->waiting = w;
        e->cap_waiting = cap;
    }
    if (front) {
        memmove(e->waiting + 1, e->waiting, (size_t)e->n_waiting * sizeof *e->waiting);
        e->waiting[0] = g;
    } else {
        e->waiting[e->n_waiting] = g;
    }
    e->n_waiting++;
    return true;
}

static int gen_cancel_flag(serve_gen *g)
{
    pthread_mutex_lock(&g->mu);
    int c = g->cancel;
    pthread_mutex_unlock(&g->mu);
    return c;
}

static void handle_cancels(serve_engine *e)
{
    for (int i = e->n_waiting - 1; i >= 0; i--) {
        int c = gen_cancel_flag(e->waiting[i]);
        if (c == CANCEL_FREE && e->metrics)
            serve_metrics_cancelled(e->metrics);
        if (c)
            fail_waiting(e, i, NULL);
    }
    for (int i = e->n_running - 1; i >= 0; i--) {
        int c = gen_cancel_flag(e->running[i]);
        if (c == CANCEL_FREE && e->metrics)
            serve_metrics_cancelled(e->metrics);
        if (c)
            finish_running(e, i, c == CANCEL_KEEP ? SERVE_FINISH_STOP : SERVE_FINISH_CANCELLED,
                           c == CANCEL_KEEP, NULL);
    }
}

static void preempt(serve_engine *e, int i)
{
    serve_gen *g = e->running[i];
    if (e->cache)
        serve_prefix_remove(e->cache, g->seq);
    model_seq_free(e->rt, g->seq);
    g->seq = -1;
    g->n_computed = 0;
    remove_at(e->running, &e->n_running, i);
    if (!push_waiting(e, g, true)) {
        serve_error err = SERVE_ERROR_INIT;
        serve_reject(&err, 500, NULL, NULL, "out of memory requeueing a preempted request");
        publish_finish(e, g, SERVE_FINISH_ERROR, &err);
        return;
    }
    if (e->metrics)
        serve_metrics_preempted(e->metrics);
}

/* The policy's view of the running requests on rank rk (all of them on
 * one rank), in admission order; e->idx maps them back. Returns how many. */
static int fill_sreq_on(serve_engine *e, int rk)
{
    int n = 0;
    for (int i = 0; i < e->n_running; i++) {
        serve_gen *g = e->running[i];
        if (e->n_ranks > 1 && model_seq_rank(e->rt, g->seq) != rk)
            continue;
        e->idx[n] = i;
        e->sreq[n++] = (serve_sched_req){g->n_computed, g->n_tokens - g->n_computed};
    }
    return n;
}

/* The next step's chunks (e->chunk), planned rank by rank: each rank's
 * requests share its token budget and its free pages. False when a rank's
 * decodes lack pages (*short_rank) or nothing can run. */
static bool plan_step(serve_engine *e, serve_sched_plan *plan, int *short_rank)
{
    memset(plan, 0, sizeof *plan);
    *short_rank = -1;
    for (int rk = 0; rk < e->n_ranks; rk++) {
        e->rank_free[rk] = model_kv_free_pages_on(e->rt, rk);
        e->rank_tokens[rk] = 0;
        int n = fill_sreq_on(e, rk);
        if (!n)
            continue;
        int *chunk = e->chunk + e->n_running; /* scratch past the running requests' */
        serve_sched_plan p = serve_sched_step(&e->cfg, e->sreq, n,
                                              model_kv_free_pages_on(e->rt, rk), chunk);
        for (int j = 0; j < n; j++)
            e->chunk[e->idx[j]] = chunk[j];
        if (p.short_pages) {
            *short_rank = rk;
            return false;
        }
        e->rank_free[rk] = model_kv_free_pages_on(e->rt, rk) - p.pages;
        e->rank_tokens[rk] = p.tokens;
        plan->items += p.items;
        plan->tokens += p.tokens;
        plan->pages += p.pages;
    }
    return plan->items > 0;
}

static mt_status gen_process(void *ctx, const int32_t *gen, int64_t n_gen, const int32_t *extra,
                             int n_extra, float *logits, mt_err *err);

/* The oldest waiting request waits for its other choices to be queued:
 * nothing to admit until the next submission. */
static bool held(const serve_engine *e) { return e->waiting[0]->followers_due > 0; }

/* Admits waiting requests, oldest first, while the policy allows. */
static void admit(serve_engine *e)
{
    while (e->n_waiting > 0 && e->n_running < e->cfg.max_batch) {
        serve_gen *g = e->waiting[0];
        uint64_t now = mt_now_ns();
        int src = -1;
        int64_t match = 0;
        if (held(e))
            return; /* n > 1: the other choices are still being queued */
        serve_gen *l = g->follow;
        if (l && l->seq >= 0 && l->n_computed < g->n_prompt - 1 && !g->ever_admitted)
            return; /* n > 1: the first choice is still reading the shared prompt */
        if (l && l->seq >= 0 && g->n_prompt > 1 && !g->ever_admitted) {
            src = l->seq; /* fork it exactly there: one computed token each */
            match = g->n_prompt - 1;
        } else if (e->cache) {
            match = serve_prefix_match(e->cache, g->tokens, g->n_tokens,
                                       path_exact(e, g, g->n_tokens - 1), now, &src);
        }
        int seq = -1;
        mt_err err = MT_ERR_INIT;
        mt_status st;
        for (;;) {
            st = match ? model_seq_fork(e->rt, src, match, &seq, &err)
                       : model_seq_create(e->rt, &seq, &err);
            if (st != MT_E_BUSY)
                break;
            int victim;
            if (!e->cache || !serve_prefix_evict(e->cache, &victim))
                break;
            model_seq_free(e->rt, victim);
            if (victim == src) { /* the match went with it */
                match = 0;
                src = -1;
            }
        }
        if (st == MT_E_BUSY && e->n_running > 0)
            return; /* no sequence slot until a running request ends */
        if (st != MT_OK) {
            serve_error se = SERVE_ERROR_INIT;
            serve_reject(&se, st == MT_E_BUSY ? 503 : 500, NULL, NULL,
                         "cannot start a sequence: %s", err.msg);
            fail_waiting(e, 0, &se);
            continue;
        }
        int64_t need = model_seq_pages_needed(e->rt, seq, g->n_tokens - match);
        int rk = model_seq_rank(e->rt, seq), n_on = fill_sreq_on(e, rk);
        int64_t reserved = serve_sched_reserved(&e->cfg, e->sreq, n_on);
        while (!serve_sched_can_admit(&e->cfg, e->n_running, model_kv_free_pages_on(e->rt, rk),
                                      reserved, need) &&
               evict_on(e, rk))
            ;
        if (!serve_sched_can_admit(&e->cfg, e->n_running, model_kv_free_pages_on(e->rt, rk),
                                   reserved, need)) {
            model_seq_free(e->rt, seq);
            if (e->n_running > 0)
                return; /* wait for pages */
            serve_error se = SERVE_ERROR_INIT;
            serve_reject(&se, 503, NULL, NULL,
                         "the KV cache cannot hold this request's %lld tokens",
                         (long long)g->n_tokens);
            fail_waiting(e, 0, &se);
            continue;
        }
        if (!g->logits && !(g->logits = malloc((size_t)e->info.vocab * sizeof *g->logits))) {
            model_seq_free(e->rt, seq);
            serve_error se = SERVE_ERROR_INIT;
            serve_reject(&se, 500, NULL, NULL, "out of memory for a request's logits");
            fail_waiting(e, 0, &se);
            continue;
        }
        if (g->spec_k > e->spec_k)
            g->spec_k = e->spec_k;
        if (g->spec_k > 0 && !g->sp && (g->sp = malloc(sizeof *g->sp)) &&
            model_spec_seq_init(g->sp, seq, g->spec_k, e->info.vocab, &g->sampler, &g->rng,
                                &err) != MT_OK) {
            free(g->sp);
            g->sp = NULL; /* out of memory: this request decodes plainly */
        }
        if (g->sp) { /* a new sequence: no drafts yet, its MTP cache as the fork left it */
            g->sp->proc = (model_logits_proc){gen_process, g};
            g->sp->gen = g->tokens + g->n_prompt;
            g->sp->seq = seq;
            g->sp->n_draft = 0;
            g->sp->mtp_behind = false;
        }
        g->seq = seq;
        g->n_computed = match;
        remove_at(e->waiting, &e->n_waiting, 0);
        e->running[e->n_running++] = g;
        if (e->cache)
            serve_prefix_add(e->cache, seq, g->tokens, g->n_tokens, match, true, now, NULL);
        if (!g->ever_admitted) {
            g->ever_admitted = true;
            if (e->metrics)
                serve_metrics_prompt(e->metrics, g->n_prompt, match);
            pthread_mutex_lock(&g->mu);
            g->cached = match;
            g->admitted = true;
            pthread_mutex_unlock(&g->mu);
        }
    }
}

static bool is_stop(const serve_engine *e, const serve_gen *g, int32_t tok)
{
    for (int i = 0; i < e->info.n_eos; i++)
        if (e->info.eos[i] == tok)
            return true;
    if (g->chat)
        for (int i = 0; i < e->info.n_chat_stop; i++)
            if (e->info.chat_stop[i] == tok)
                return true;
    return false;
}

/* Makes room when the plan cannot proceed: evict, else preempt, else fail
 * the one request that cannot fit. */
/* Pages for the next step on rank rk (-1: any): a cached sequence there
 * goes, else its youngest running request is preempted; its only one
 * fails. */
static void make_room(serve_engine *e, int rk)
{
    if (evict_on(e, e->n_ranks > 1 ? rk : -1))
        return;
    int n = e->n_ranks > 1 && rk >= 0 ? fill_sreq_on(e, rk) : e->n_running;
    int v = serve_sched_victim(n);
    if (v >= 0) {
        preempt(e, e->n_ranks > 1 && rk >= 0 ? e->idx[v] : v);
        return;
    }
    if (n > 0) {
        serve_error se = SERVE_ERROR_INIT;
        serve_reject(&se, 503, NULL, NULL, "the KV cache ran out of pages for this request");
        finish_running(e, e->n_ranks > 1 && rk >= 0 ? e->idx[0] : 0, SERVE_FINISH_ERROR, false,
                       &se);
    }
}

/* The request's logit processing before a pick (model_logits_proc): the
 * sampler's bias and penalties (drafts counted while they apply), then its
 * constraints. */
static mt_status gen_process(void *ctx, const int32_t *gen, int64_t n_gen, const int32_t *extra,
                             int n_extra, float *logits, mt_err *err)
{
    serve_gen *g = ctx;
    int32_t vocab = g->e->info.vocab;
    if (g->counted) {
        int added = 0;
        for (; added < n_extra; added++)
            if (model_token_counts_add(&g->counts, extra[added], 1) != MT_OK)
                break;
        model_sampler_process(&g->sampler, &g->counts, logits, vocab);
        for (int i = 0; i < added; i++)
            model_token_counts_add(&g->counts, extra[i], -1);
    } else if (g->sampler.n_bias) {
        model_sampler_process(&g->sampler, NULL, logits, vocab);
    }
    if (g->constraints)
        return serve_logits_apply(g->constraints, gen, n_gen, extra, n_extra, logits, vocab, err);
    return MT_OK;
}

/* Publishes one generated token chosen from logits (vocab floats);
 * share: this token's part of the time since the last publication. */
static void emit(serve_engine *e, serve_gen *g, int32_t tok, const float *logits, uint64_t now,
                 int share)
{
    if (g->want_lp) {
        int64_t at = g->n_tokens - g->n_prompt;
        model_logprobs(logits, e->info.vocab, g->sampler.temperature, tok, g->n_top, &g->lp[at],
                       g->top_id + at * g->n_top, g->top_lp + at * g->n_top);
    }
    g->tokens[g->n_tokens++] = tok;
    if (g->counted)
        model_token_counts_add(&g->counts, tok, 1); /* out of memory: a penalty missed */
    int64_t gen = g->n_tokens - g->n_prompt;
    double ttft = -1;
    if (gen == 1) {
        ttft = secs(now - g->t_arrival);
        if (e->metrics)
            serve_metrics_ttft(e->metrics, ttft);
    } else if (e->metrics) {
        serve_metrics_itl(e->metrics, secs(now - g->t_last) / share);
    }
    pthread_mutex_lock(&g->mu);
    g->pub_generated = gen;
    if (ttft >= 0)
        g->ttft_s = ttft;
    if (g->sp) {
        g->spec_rounds = g->sp->rounds;
        g->spec_drafted = g->sp->drafted;
        g->spec_accepted = g->sp->accepted;
    }
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->mu);
}

static bool must_stop(const serve_engine *e, const serve_gen *g, int32_t tok)
{
    int64_t gen = g->n_tokens - g->n_prompt;
    return (!g->ignore_eos && is_stop(e, g, tok)) || gen >= g->max_tokens ||
           g->n_tokens >= e->info.max_context;
}

/* Speculative requests that are decoding verify their drafts in this step:
 * chunk i grows from 1 to 1 + drafts while its rank's token budget and
 * free pages allow (fewer drafts otherwise: verifying a prefix is as
 * exact). */
static void add_drafts(serve_engine *e, serve_sched_plan *plan)
{
    for (int i = 0; i < e->n_running; i++) {
        serve_gen *g = e->running[i];
        if (!g->sp || e->chunk[i] != 1 || g->n_computed != g->n_tokens - 1)
            continue;
        int rk = model_seq_rank(e->rt, g->seq);
        int64_t *free_pages = &e->rank_free[rk];
        int nd = g->sp->n_draft;
        int64_t left = g->max_tokens - (g->n_tokens - g->n_prompt) - 1;
        if (nd > left)
            nd = (int)(left > 0 ? left : 0);
        if (g->n_tokens + nd > e->info.max_context)
            nd = (int)(e->info.max_context - g->n_tokens);
        for (; nd > 0; nd--) {
            int64_t extra = model_seq_pages_needed(e->rt, g->seq, 1 + nd) -
                            model_seq_pages_needed(e->rt, g->seq, 1);
            if (e->rank_tokens[rk] + nd <= e->cfg.token_budget && extra <= *free_pages) {
                *free_pages -= extra;
                break;
            }
        }
        g->sp->n_draft = nd < 0 ? 0 : nd;
        e->chunk[i] = 1 + g->sp->n_draft;
        plan->tokens += g->sp->n_draft;
        e->rank_tokens[rk] += g->sp->n_draft;
    }
}

static void run_step(serve_engine *e)
{
    serve_sched_plan plan;
    for (;;) {
        if (e->n_running == 0)
            return;
        int short_rank;
        if (plan_step(e, &plan, &short_rank))
            break;
        make_room(e, short_rank);
    }
    if (e->spec_k > 0)
        add_drafts(e, &plan);
    int n = 0;
    for (int i = 0; i < e->n_running; i++) {
        if (!e->chunk[i])
            continue;
        serve_gen *g = e->running[i];
        bool last = g->n_computed + e->chunk[i] == g->n_tokens;
        /* Prompt tokens lead the chunk (after a preemption it may go on into
         * the tokens already generated, which keep their decode path); a
         * verify step's drafts never are. runtime.h: the path is the row's. */
        int64_t prompt_left = g->n_prompt - g->n_computed;
        if (g->sp && g->n_computed == g->n_tokens - 1) { /* verify [last, drafts] */
            int nt = model_spec_verify_tokens(g->sp, g->tokens[g->n_computed], g->verify);
            e->items[n] = (model_step_item){g->seq, g->verify, nt, NULL, g->sp->logits,
                                            prompt_left > 0 ? 1 : 0};
        } else {
            int np = prompt_left <= 0 ? 0 : prompt_left < e->chunk[i] ? (int)prompt_left
                                                                       : e->chunk[i];
            e->items[n] = (model_step_item){g->seq, g->tokens + g->n_computed, e->chunk[i],
                                            last ? g->logits : NULL, NULL, np};
        }
        e->item_gen[n++] = g;
    }
    mt_err err = MT_ERR_INIT;
    mt_status st = model_step(e->rt, e->items, n, &err);
    if (st == MT_E_NOMEM) {
        make_room(e, -1);
        return;
    }
    if (st != MT_OK) {
        /* The runtime appended nothing; fail the step's requests, keep serving. */
        serve_error se = SERVE_ERROR_INIT;
        serve_reject(&se, 500, NULL, NULL, "forward step failed: %s", err.msg);
        for (int k = 0; k < n; k++)
            for (int i = 0; i < e->n_running; i++)
                if (e->running[i] == e->item_gen[k]) {
                    finish_running(e, i, SERVE_FINISH_ERROR, false, &se);
                    break;
                }
        return;
    }
    uint64_t now = mt_now_ns();
    int64_t new_tokens = 0;
    if (e->metrics)
        serve_metrics_step(e->metrics, n, plan.tokens);
    int n_cu = 0, row = 0;
    for (int k = 0; k < n; k++) {
        serve_gen *g = e->item_gen[k];
        int64_t start = g->n_computed;
        int rows = e->items[k].n_tokens;
        if (e->items[k].tokens == g->verify) {
            /* Verify: the accepted drafts and one more token, up to a stop. */
            model_spec_seq *sp = g->sp;
            sp->n_draft = rows - 1;
            int64_t d0 = sp->drafted, a0 = sp->accepted;
            sp->n_gen = g->n_tokens - g->n_prompt;
            if (model_spec_accept(e->rt, sp, start, &err) != MT_OK) {
                /* out of memory (or a constraint's failure): one plain pick */
                sp->n_out = 1;
                gen_process(g, g->tokens + g->n_prompt, g->n_tokens - g->n_prompt, NULL, 0,
                            sp->logits, NULL);
                sp->out[0] = model_sample(sp->logits, e->info.vocab, &g->sampler, &g->rng);
            }
            if (e->metrics)
                serve_metrics_spec(e->metrics, sp->drafted - d0, sp->accepted - a0);
            int kept = 0;
            while (kept < sp->n_out) {
                int32_t tok = sp->out[kept];
                emit(e, g, tok, sp->logits + (size_t)kept * (size_t)e->info.vocab, now,
                     sp->n_out);
                kept++;
                if (must_stop(e, g, tok))
                    break;
            }
            new_tokens += kept;
            sp->n_gen = g->n_tokens - g->n_prompt; /* the drafts follow the emitted tokens */
            g->n_computed = start + kept;
            if (kept < sp->n_out)
                model_seq_truncate(e->rt, g->seq, g->n_computed, NULL);
            e->catchup[n_cu++] = (model_spec_catchup){sp, g->tokens + start + 1, kept, row, start,
                                                      true};
        } else {
            g->n_computed += rows;
            if (e->items[k].logits) {
                int32_t tok = -1;
                /* A constraint's failure is not expected (it only masks); the
                 * pick then goes on with what was applied. */
                gen_process(g, g->tokens + g->n_prompt, g->n_tokens - g->n_prompt, NULL, 0,
                            g->logits, &err);
                if (e->hook)
                    tok = e->hook(e->hook_ctx, g->tokens, g->n_prompt, g->n_tokens - g->n_prompt);
                if (tok < 0 || tok >= e->info.vocab || isinf(g->logits[tok]) || isnan(g->logits[tok]))
                    tok = model_sample(g->logits, e->info.vocab, &g->sampler, &g->rng);
                emit(e, g, tok, g->logits, now, 1);
                new_tokens++;
                if (g->sp)
                    g->sp->n_gen = g->n_tokens - g->n_prompt;
            }
            /* The MTP layer reads the chunk too (the token after its last
             * position: the next prompt token, or the one just sampled). */
            if (g->sp)
                e->catchup[n_cu++] = (model_spec_catchup){g->sp, g->tokens + start + 1, rows,
                                                          row, start, e->items[k].logits != NULL};
        }
        if (e->cache)
            serve_prefix_grow(e->cache, g->seq, path_exact(e, g, g->n_computed));
        if (g->n_tokens > g->n_prompt && g->n_computed == g->n_tokens - 1)
            g->t_last = now; /* it emitted this step */
        row += rows;
    }
    /* Drafts for the next step, right after this one (they read its hidden
     * states). A failure only costs the drafts. */
    if (n_cu && model_spec_draft(e->rt, e->catchup, n_cu, &err) != MT_OK && e->rt_opts.log)
        fprintf(e->rt_opts.log, "warning: speculative drafts skipped this step: %s\n", err.msg);
    if (e->metrics && new_tokens)
        serve_metrics_generated(e->metrics, new_tokens);
    for (int i = e->n_running - 1; i >= 0; i--) {
        serve_gen *g = e->running[i];
        int64_t gen = g->n_tokens - g->n_prompt;
        if (gen == 0 || g->n_computed != g->n_tokens - 1)
            continue; /* still reading its prompt */
        int32_t last = g->tokens[g->n_tokens - 1];
        if (!g->ignore_eos && is_stop(e, g, last))
            finish_running(e, i, SERVE_FINISH_STOP, true, NULL);
        else if (gen >= g->max_tokens || g->n_tokens >= e->info.max_context)
            finish_running(e, i, SERVE_FINISH_LENGTH, true, NULL);
    }
}

static void update_gauges(serve_engine *e)
{
    if (!e->metrics)
        return;
    pthread_mutex_lock(&e->mu);
    int64_t queued = 0;
    for (serve_gen *g = e->sub_head; g; g = g->next)
        queued++;
    pthread_mutex_unlock(&e->mu);
    serve_metrics_state s = {
        .running = e->n_running,
        .waiting = e->n_waiting + queued,
        .kv_pages_total = e->info.kv_pages_total * e->n_ranks,
        .cached_sequences = e->cache ? serve_prefix_retained(e->cache) : 0,
        .n_ranks = e->n_ranks,
    };
    for (int r = 0; r < e->n_ranks; r++) {
        int64_t used = e->info.kv_pages_total - model_kv_free_pages_on(e->rt, r);
        s.kv_pages_used += used;
        if (r < SERVE_METRICS_MAX_RANKS) {
            s.rank_seqs[r] = model_seqs_on(e->rt, r);
            s.rank_pages_used[r] = used;
            s.rank_tokens[r] = model_rank_tokens(e->rt, r);
        }
    }
    serve_metrics_state_set(e->metrics, &s);
}

/* ---- thread ---------------------------------------------------------------------- */

static mt_status load(serve_engine *e, mt_err *err)
{
    mt_status st = model_runtime_open(&e->rt_opts, &e->rt, err);
    if (st)
        return st;
    model_runtime_report(e->rt, e->rt_opts.log ? e->rt_opts.log : stderr);
    serve_model_info *in = &e->info;
    in->vocab = model_runtime_vocab(e->rt);
    in->max_context = model_runtime_max_context(e->rt);
    in->tok = model_runtime_tokenizer(e->rt);
    in->n_eos = model_runtime_eos(e->rt, in->eos, MODEL_MAX_EOS);
    in->n_chat_stop = in->tok ? (int)model_chat_stop_ids(in->tok, in->chat_stop) : 0;
    in->page_size = model_kv_page_size(e->rt);
    in->kv_pages_total = model_kv_free_pages(e->rt);
    in->token_budget = e->rt_opts.max_batch_tokens > 0 ? e->rt_opts.max_batch_tokens : 512;
    in->max_batch = e->max_batch_opt > 0 ? e->max_batch_opt : 64;
    if (in->max_batch > in->token_budget)
        in->max_batch = in->token_budget;
    e->cfg = (serve_sched_cfg){in->token_budget, in->max_batch, in->page_size,
                               in->kv_pages_total / 100};
    int mb = in->max_batch;
    e->running = calloc((size_t)mb, sizeof *e->running);
    e->items = calloc((size_t)mb, sizeof *e->items);
    e->item_gen = calloc((size_t)mb, sizeof *e->item_gen);
    e->sreq = calloc((size_t)mb, sizeof *e->sreq);
    e->chunk = calloc(2 * (size_t)mb, sizeof *e->chunk); /* and plan_step's scratch */
    e->idx = calloc((size_t)mb, sizeof *e->idx);
    e->n_ranks = model_runtime_dp_ranks(e->rt);
    e->rank_free = calloc((size_t)e->n_ranks, sizeof *e->rank_free);
    e->rank_tokens = calloc((size_t)e->n_ranks, sizeof *e->rank_tokens);
    e->catchup = calloc((size_t)mb, sizeof *e->catchup);
    /* Speculative decoding needs the MTP layer; a scripted sampler (tests'
     * hook) picks tokens one at a time, so it turns speculation off. */
    e->spec_k = model_runtime_has_mtp(e->rt) && !e->hook ? e->rt_opts.speculative_steps : 0;
    e->prefill_positions = model_runtime_prefill_positions(e->rt);
    if (!e->running || !e->items || !e->item_gen || !e->sreq || !e->chunk || !e->catchup ||
        !e->idx || !e->rank_free || !e->rank_tokens)
        return mt_fail(err, MT_E_NOMEM, "serve engine: out of memory");
    if (e->max_cached > 0 && (st = serve_prefix_create(in->page_size, &e->cache, err)))
        return st;
    if (e->live_swaps) {
        FILE *log = e->rt_opts.log ? e->rt_opts.log : stderr;
        if ((st = model_kset_live_enable(model_runtime_kernels(e->rt), log, err)))
            return st;
        if (e->rt_opts.batch_invariant)
            fprintf(log, "live swaps: refused on this batch-invariant server (a swap would "
                    "change its output): tuned winners go to the database only\n");
    }
    if (e->metrics) {
        model_selection_counts c;
        model_runtime_selection(e->rt, &c);
        serve_metrics_selection(e->metrics, &c);
    }
    return MT_OK;
}

/* Between steps: the swaps other threads posted, and the judgement of
 * earlier ones (kset_swap.h); the selection gauges follow. */
static void live_step(serve_engine *e)
{
    if (model_kset_swap_apply(model_runtime_kernels(e->rt)) && e->metrics) {
        model_selection_counts c;
        model_runtime_selection(e->rt, &c);
        serve_metrics_selection(e->metrics, &c);
    }
}

static void fail_all(serve_engine *e, const serve_error *se)
{
    while (e->n_running)
        finish_running(e, e->n_running - 1, SERVE_FINISH_ERROR, false, se);
    while (e->n_waiting)
        fail_waiting(e, e->n_waiting - 1, se);
    pthread_mutex_lock(&e->mu);
    serve_gen *g = e->sub_head;
    e->sub_head = e->sub_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    while (g) {
        serve_gen *next = g->next;
        publish_finish(e, g, SERVE_FINISH_ERROR, se);
        g = next;
    }
}

static void *engine_main(void *arg)
{
    serve_engine *e = arg;
    mt_err err = MT_ERR_INIT;
    mt_status st = load(e, &err);
    pthread_mutex_lock(&e->mu);
    e->state = st == MT_OK ? SERVE_ENGINE_READY : SERVE_ENGINE_FAILED;
    if (st)
        e->load_err = err;
    pthread_cond_broadcast(&e->state_cv);
    pthread_mutex_unlock(&e->mu);
    if (st == MT_OK && e->metrics) {
        serve_metrics_ready(e->metrics, true);
        update_gauges(e);
    }
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && !e->sub_head && !e->cancel_hint &&
               (st != MT_OK || (e->n_running == 0 && (e->n_waiting == 0 || held(e)))))
            pthread_cond_wait(&e->wake, &e->mu);
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        serve_gen *sub = e->sub_head;
        e->sub_head = e->sub_tail = NULL;
        bool scan = e->cancel_hint;
        e->cancel_hint = false;
        pthread_mutex_unlock(&e->mu);
        if (st != MT_OK)
            continue; /* failed load: submit refuses; wait for stop */
        while (sub) {
            serve_gen *next = sub->next;
            if (sub->follow)
                sub->follow->followers_due--;
            if (!push_waiting(e, sub, false)) {
                serve_error se = SERVE_ERROR_INIT;
                serve_reject(&se, 503, NULL, NULL, "out of memory queueing the request");
                publish_finish(e, sub, SERVE_FINISH_ERROR, &se);
            }
            sub = next;
        }
        if (scan)
            handle_cancels(e);
        admit(e);
        run_step(e);
        if (e->live_swaps)
            live_step(e);
        update_gauges(e);
    }
    serve_error se = SERVE_ERROR_INIT;
    serve_reject(&se, 503, NULL, NULL, "the server is shutting down");
    if (st == MT_OK) {
        fail_all(e, &se);
        while (evict_one(e))
            ;
        update_gauges(e);
        if (e->live_swaps) /* what the swaps changed */
            model_runtime_report(e->rt, e->rt_opts.log ? e->rt_opts.log : stderr);
    } else {
        fail_all(e, &se);
    }
    return NULL;
}

/* ---- public ------------------------------------------------------------------------ */

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

mt_status serve_engine_start(const serve_engine_opts *o, serve_engine **out, mt_err *err)
{
    *out = NULL;
    if (!o->rt.model_dir)
        return mt_fail(err, MT_E_INVALID, "serve engine: no model directory");
    serve_engine *e = calloc(1, sizeof *e);
    if (!e)
        return mt_fail(err, MT_E_NOMEM, "serve engine: out of memory");
    e->rt_opts = o->rt;
    e->model_dir = dup_or_null(o->rt.model_dir);
    e->db_path = dup_or_null(o->rt.db_path);
    e->device = dup_or_null(o->rt.device);
    e->rt_opts.model_dir = e->model_dir;
    e->rt_opts.db_path = e->db_path;
    e->rt_opts.device = e->device;
    e->max_batch_opt = o->max_batch;
    e->max_cached = o->max_cached == 0 ? 64 : o->max_cached < 0 ? 0 : o->max_cached;
    e->metrics = o->metrics;
    e->live_swaps = o->live_swaps;
    e->hook = o->sample_hook;
    e->hook_ctx = o->sample_hook_ctx;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->state_cv, NULL);
    e->state = SERVE_ENGINE_LOADING;
    if (!e->model_dir || (o->rt.db_path && !e->db_path) || (o->rt.device && !e->device)) {
        serve_engine_destroy(e);
        return mt_fail(err, MT_E_NOMEM, "serve engine: out of memory");
    }
    int rc = pthread_create(&e->thread, NULL, engine_main, e);
    if (rc) {
        serve_engine_destroy(e);
        return mt_fail(err, MT_E_IO, "serve engine: pthread_create: %s", strerror(rc));
    }
    e->thread_started = true;
    *out = e;
    return MT_OK;
}

void serve_engine_stop(serve_engine *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_broadcast(&e->wake);
    bool join = e->thread_started;
    e->thread_started = false;
    pthread_mutex_unlock(&e->mu);
    if (!join)
        return;
    pthread_join(e->thread, NULL);
    model_runtime_close(e->rt);
    e->rt = NULL;
    serve_prefix_destroy(e->cache);
    e->cache = NULL;
    pthread_mutex_lock(&e->mu);
    if (e->state == SERVE_ENGINE_READY)
        e->state = SERVE_ENGINE_STOPPED;
    pthread_cond_broadcast(&e->state_cv);
    pthread_mutex_unlock(&e->mu);
    if (e->metrics)
        serve_metrics_ready(e->metrics, false);
}

void serve_engine_destroy(serve_engine *e)
{
    if (!e)
        return;
    serve_engine_stop(e);
    free(e->waiting);
    free(e->running);
    free(e->items);
    free(e->item_gen);
    free(e->sreq);
    free(e->chunk);
    free(e->idx);
    free(e->rank_free);
    free(e->rank_tokens);
    free(e->catchup);
    free(e->model_dir);
    free(e->db_path);
    free(e->device);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->wake);
    pthread_cond_destroy(&e->state_cv);
    free(e);
}

serve_engine_state serve_engine_state_get(serve_engine *e, mt_err *err)
{
    pthread_mutex_lock(&e->mu);
    serve_engine_state s = e->state;
    if (s == SERVE_ENGINE_FAILED && err)
        *err = e->load_err;
    pthread_mutex_unlock(&e->mu);
    return s;
}

mt_status serve_engine_wait_ready(serve_engine *e, double timeout_s, mt_err *err)
{
    uint64_t end = mt_now_ns() + (uint64_t)(timeout_s * 1e9);
    pthread_mutex_lock(&e->mu);
    while (e->state == SERVE_ENGINE_LOADING && mt_now_ns() < end) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 50 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&e->state_cv, &e->mu, &dl);
    }
    serve_engine_state s = e->state;
    mt_err le = e->load_err;
    pthread_mutex_unlock(&e->mu);
    if (s == SERVE_ENGINE_READY)
        return MT_OK;
    if (s == SERVE_ENGINE_FAILED) {
        if (err)
            *err = le;
        return le.status ? le.status : MT_E_IO;
    }
    if (s == SERVE_ENGINE_STOPPED)
        return mt_fail(err, MT_E_INTERRUPTED, "serve engine: stopped");
    return mt_fail(err, MT_E_TIMEOUT, "serve engine: the model did not load within %.0f s",
                   timeout_s);
}

const serve_model_info *serve_engine_info(const serve_engine *e) { return &e->info; }

model_kset *serve_engine_kernels(serve_engine *e)
{
    return serve_engine_state_get(e, NULL) == SERVE_ENGINE_READY ? model_runtime_kernels(e->rt)
                                                                 : NULL;
}

/* A request that failed before its locks were made. */
static void gen_free_partial(serve_gen *g)
{
    free(g->tokens);
    free(g->lp);
    free(g->top_id);
    free(g->top_lp);
    free(g);
}

mt_status serve_engine_submit(serve_engine *e, const serve_gen_params *p, serve_gen **out,
                              serve_error *err)
{
    *out = NULL;
    serve_engine_state s = serve_engine_state_get(e, NULL);
    if (s != SERVE_ENGINE_READY)
        return serve_reject(err, 503, NULL, NULL,
                            s == SERVE_ENGINE_LOADING ? "the model is still loading"
                                                      : "the model is not available");
    const serve_model_info *in = &e->info;
    if (p->n_prompt < 1 || p->max_tokens < 1)
        return serve_reject(err, 400, p->n_prompt < 1 ? "prompt" : "max_tokens", NULL,
                            "the prompt and max_tokens must not be empty");
    int64_t total = p->n_prompt + p->max_tokens;
    if (total > in->max_context)
        return serve_reject(err, 400, "max_tokens", "context_length_exceeded",
                            "This model's maximum context length is %lld tokens. However, you "
                            "requested %lld tokens (%lld in the prompt, %lld for the "
                            "completion).",
                            (long long)in->max_context, (long long)total,
                            (long long)p->n_prompt, (long long)p->max_tokens);
    int64_t pages = (total + in->page_size - 1) / in->page_size;
    if (pages > in->kv_pages_total)
        return serve_reject(err, 400, "max_tokens", "kv_cache_exceeded",
                            "the request needs %lld KV pages for %lld tokens; the server's KV "
                            "cache holds %lld pages (%lld tokens) in all",
                            (long long)pages, (long long)total, (long long)in->kv_pages_total,
                            (long long)in->kv_pages_total * in->page_size);
    serve_gen *g = calloc(1, sizeof *g);
    int n_top = p->logprobs ? (p->top_logprobs < 0 ? 0 : p->top_logprobs > 20 ? 20 : p->top_logprobs) : 0;
    size_t mt = (size_t)p->max_tokens;
    if (!g || !(g->tokens = malloc((size_t)total * sizeof *g->tokens)) ||
        (p->logprobs && (!(g->lp = malloc(mt * sizeof *g->lp)) ||
                         (n_top && (!(g->top_id = malloc(mt * (size_t)n_top * sizeof *g->top_id)) ||
                                    !(g->top_lp = malloc(mt * (size_t)n_top * sizeof *g->top_lp))))))) {
        if (g) {
            free(g->tokens);
            free(g->lp);
            free(g->top_id);
        }
        free(g);
        return serve_reject(err, 500, NULL, NULL, "out of memory for the request");
    }
    if (p->sampler.n_bias > 0 &&
        !(g->bias = malloc((size_t)p->sampler.n_bias * sizeof *g->bias))) {
        gen_free_partial(g);
        return serve_reject(err, 500, NULL, NULL, "out of memory for the request");
    }
    if (model_sampler_penalized(&p->sampler)) {
        mt_err me = MT_ERR_INIT;
        if (model_token_counts_init(&g->counts, in->vocab, p->prompt, p->n_prompt, &me) != MT_OK) {
            free(g->bias);
            gen_free_partial(g);
            return serve_reject(err, 500, NULL, NULL, "token counts: %s", me.msg);
        }
        g->counted = true;
    }
    g->want_lp = p->logprobs;
    g->n_top = n_top;
    memcpy(g->tokens, p->prompt, (size_t)p->n_prompt * sizeof *g->tokens);
    g->e = e;
    g->n_prompt = g->n_tokens = p->n_prompt;
    g->max_tokens = p->max_tokens;
    g->sampler = p->sampler;
    if (g->bias) {
        memcpy(g->bias, p->sampler.bias, (size_t)p->sampler.n_bias * sizeof *g->bias);
        g->sampler.bias = g->bias;
    } else {
        g->sampler.bias = NULL;
        g->sampler.n_bias = 0;
    }
    g->ignore_eos = p->ignore_eos;
    g->spec_k = p->spec_set ? p->spec_steps : MODEL_SPEC_MAX_STEPS; /* capped at admission */
    g->chat = p->chat;
    g->t_arrival = mt_now_ns();
    mt_rng_seed(&g->rng, p->has_seed ? p->seed : mt_seed_fresh());
    g->seq = -1;
    g->ttft_s = -1;
    g->refs = 2; /* the caller's and the engine's */
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cond, NULL);
    g->followers_due = p->n_followers > 0 ? p->n_followers : 0;
    if (p->follow) {
        if (p->follow->n_prompt != p->n_prompt ||
            memcmp(p->follow->tokens, p->prompt, (size_t)p->n_prompt * sizeof *p->prompt)) {
            gen_free(g);
            return serve_reject(err, 500, NULL, NULL,
                                "internal: a follower's prompt differs from its first choice's");
        }
        pthread_mutex_lock(&p->follow->mu);
        p->follow->refs++;
        pthread_mutex_unlock(&p->follow->mu);
        g->follow = p->follow;
    }
    pthread_mutex_lock(&e->mu);
    if (e->stop) {
        pthread_mutex_unlock(&e->mu);
        gen_free(g);
        return serve_reject(err, 503, NULL, NULL, "the server is shutting down");
    }
    g->constraints = p->logits; /* taken over: the request is queued */
    if (e->sub_tail)
        e->sub_tail->next = g;
    else
        e->sub_head = g;
    e->sub_tail = g;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    *out = g;
    return MT_OK;
}
