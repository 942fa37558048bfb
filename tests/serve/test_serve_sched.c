/* test_serve_sched.c: the batching policy on random scheduler states:
 * every decode that fits is in the step before any prefill, the token
 * budget and the free pages are never exceeded, prefill goes oldest first
 * (a younger request gets tokens only when every older one got all it
 * wanted or hit the budget or pages), the page shortfall is exact, and the
 * admission and preemption rules. */
#include <criterion/criterion.h>

#include "common/rng.h"
#include "serve/serve_sched.h"

static int64_t ref_pages(int page, int64_t len, int64_t n)
{
    /* Pages held before and after, counted one token at a time. */
    int64_t before = 0, after = 0;
    for (int64_t t = 0; t < len; t++)
        before = t / page + 1;
    for (int64_t t = 0; t < len + n; t++)
        after = t / page + 1;
    return after - before;
}

Test(serve_sched, pages_count_whole_pages)
{
    for (int page = 1; page <= 17; page += 4)
        for (int64_t len = 0; len < 70; len += 3)
            for (int64_t n = 0; n < 40; n += 5)
                cr_assert_eq(serve_sched_pages(page, len, n), ref_pages(page, len, n));
}

Test(serve_sched, random_states_respect_budget_pages_and_order)
{
    uint64_t seed = mt_seed_fresh();
    mt_rng rng;
    mt_rng_seed(&rng, seed);
    for (int it = 0; it < 5000; it++) {
        serve_sched_cfg c = {1 + (int)mt_rng_below(&rng, 64), 64, 1 + (int)mt_rng_below(&rng, 16),
                             0};
        int n = (int)mt_rng_below(&rng, 12);
        serve_sched_req r[12];
        for (int i = 0; i < n; i++) {
            r[i].len = (int64_t)mt_rng_below(&rng, 100);
            r[i].todo = mt_rng_below(&rng, 2) ? 1 : 1 + (int64_t)mt_rng_below(&rng, 80);
        }
        int64_t free_pages = (int64_t)mt_rng_below(&rng, 20);
        int chunk[12];
        serve_sched_plan p = serve_sched_step(&c, r, n, free_pages, chunk);
        /* Decodes: the oldest within the budget, shortfall exact. */
        int64_t need_dec = 0, budget_dec = c.token_budget;
        int decodes_in_budget = 0;
        for (int i = 0; i < n; i++)
            if (r[i].todo == 1 && budget_dec > 0) {
                need_dec += ref_pages(c.page_size, r[i].len, 1);
                decodes_in_budget++;
                budget_dec--;
            }
        if (need_dec > free_pages) {
            cr_assert_gt(p.short_pages, 0, "seed %llu it %d", (unsigned long long)seed, it);
            for (int i = 0; i < n; i++)
                if (r[i].todo > 1)
                    cr_assert_eq(chunk[i], 0, "no prefill while decodes are short");
            continue;
        }
        cr_assert_eq(p.short_pages, 0);
        int tokens = 0, items = 0, seen_dec = 0;
        int64_t pages = 0;
        for (int i = 0; i < n; i++) {
            cr_assert(chunk[i] >= 0 && chunk[i] <= r[i].todo);
            if (r[i].todo == 1) {
                bool in_budget = seen_dec++ < decodes_in_budget;
                cr_assert_eq(chunk[i], in_budget ? 1 : 0, "seed %llu it %d decode %d",
                             (unsigned long long)seed, it, i);
            }
            tokens += chunk[i];
            items += chunk[i] > 0;
            pages += ref_pages(c.page_size, r[i].len, chunk[i]);
        }
        cr_assert_eq(p.tokens, tokens);
        cr_assert_eq(p.items, items);
        cr_assert_eq(p.pages, pages);
        cr_assert_leq(tokens, c.token_budget);
        cr_assert_leq(pages, free_pages, "seed %llu it %d", (unsigned long long)seed, it);
        /* Prefill order: once an older prefill is cut short, the budget or
         * the pages are used up for every younger one. */
        int64_t budget_left = c.token_budget - tokens;
        int64_t pages_left = free_pages - pages;
        bool cut = false;
        for (int i = 0; i < n; i++) {
            if (r[i].todo <= 1)
                continue;
            if (cut) {
                /* A younger request could only get tokens that fit in its
                 * own last page (no new page). */
                cr_assert(chunk[i] == 0 || serve_sched_pages(c.page_size, r[i].len, chunk[i]) == 0 ||
                              pages_left == 0 || budget_left == 0,
                          "seed %llu it %d", (unsigned long long)seed, it);
            }
            if (chunk[i] < r[i].todo) {
                /* Cut short: by the budget, or because one more token needs
                 * a page that is not there. */
                bool by_budget = budget_left == 0;
                bool by_pages = serve_sched_pages(c.page_size, r[i].len, chunk[i] + 1) >
                                serve_sched_pages(c.page_size, r[i].len, chunk[i]) + pages_left;
                cr_assert(by_budget || by_pages, "seed %llu it %d: request %d cut for no reason",
                          (unsigned long long)seed, it, i);
                cut = true;
            }
        }
    }
}

Test(serve_sched, admission_and_victims)
{
    serve_sched_cfg c = {512, 2, 16, 3};
    cr_assert(serve_sched_can_admit(&c, 0, 10, 0, 10), "an idle server ignores the watermark");
    cr_assert(!serve_sched_can_admit(&c, 0, 10, 0, 11));
    cr_assert(serve_sched_can_admit(&c, 1, 20, 5, 12));
    cr_assert(!serve_sched_can_admit(&c, 1, 20, 5, 13), "watermark");
    cr_assert(!serve_sched_can_admit(&c, 2, 1000, 0, 1), "max_batch");
    serve_sched_req r[2] = {{16, 1}, {0, 40}};
    cr_assert_eq(serve_sched_reserved(&c, r, 2), (1 + 1) + (3 + 1));
    cr_assert_eq(serve_sched_victim(0), -1);
    cr_assert_eq(serve_sched_victim(1), -1);
    cr_assert_eq(serve_sched_victim(5), 4);
}
