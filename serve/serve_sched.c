/* serve_sched.c: continuous batching policy (see serve_sched.h). */
#include "serve_sched.h"

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t serve_sched_pages(int page_size, int64_t len, int64_t n)
{
    return ceil_div(len + n, page_size) - ceil_div(len, page_size);
}

serve_sched_plan serve_sched_step(const serve_sched_cfg *c, const serve_sched_req *reqs, int n,
                                  int64_t free_pages, int *chunk)
{
    serve_sched_plan p = {0, 0, 0, 0};
    int64_t budget = c->token_budget, free_left = free_pages;
    for (int i = 0; i < n; i++)
        chunk[i] = 0;
    /* Decodes first: they hold a user waiting on every token. */
    for (int i = 0; i < n && budget > 0; i++) {
        if (reqs[i].todo != 1)
            continue;
        int64_t need = serve_sched_pages(c->page_size, reqs[i].len, 1);
        if (need > free_left) {
            p.short_pages += need - free_left;
            free_left = 0;
            continue;
        }
        free_left -= need;
        p.pages += need;
        chunk[i] = 1;
        p.items++;
        p.tokens++;
        budget--;
    }
    if (p.short_pages)
        return p;
    /* Prefill chunks with what is left. */
    for (int i = 0; i < n && budget > 0; i++) {
        if (reqs[i].todo <= 1)
            continue;
        int64_t len = reqs[i].len, want = reqs[i].todo < budget ? reqs[i].todo : budget;
        /* Tokens that fit: the rest of the last page plus the free pages. */
        int64_t fit = ceil_div(len, c->page_size) * c->page_size - len + free_left * c->page_size;
        if (want > fit)
            want = fit;
        if (want <= 0)
            continue;
        int64_t need = serve_sched_pages(c->page_size, len, want);
        free_left -= need;
        p.pages += need;
        chunk[i] = (int)want;
        p.items++;
        p.tokens += (int)want;
        budget -= want;
    }
    return p;
}

int64_t serve_sched_reserved(const serve_sched_cfg *c, const serve_sched_req *reqs, int n)
{
    int64_t r = 0;
    for (int i = 0; i < n; i++)
        r += serve_sched_pages(c->page_size, reqs[i].len, reqs[i].todo) + 1;
    return r;
}

bool serve_sched_can_admit(const serve_sched_cfg *c, int n_running, int64_t free_pages,
                           int64_t reserved, int64_t need_pages)
{
    if (n_running >= c->max_batch)
        return false;
    /* An idle server takes any request that fits at all, watermark or not. */
    if (n_running == 0)
        return need_pages <= free_pages;
    return need_pages + reserved + c->watermark <= free_pages;
}

int serve_sched_victim(int n) { return n > 1 ? n - 1 : -1; }
