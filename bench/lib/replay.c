/* replay.c: reading replay tables and replaying search strategies against
 * them (replay.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"
#include "tuner/tune_impl.h"

void replay_table_free(replay_table *t)
{
    free(t->rows);
    t->rows = NULL;
    t->n = 0;
}

static void header(replay_table *t, const char *line)
{
    const char *colon = strchr(line, ':');
    if (!colon)
        return;
    const char *v = colon + 1;
    while (*v == ' ')
        v++;
    int klen = (int)(colon - line);
    if (klen == 6 && !strncmp(line, "family", 6))
        snprintf(t->family, sizeof t->family, "%s", v);
    else if (klen == 5 && !strncmp(line, "shape", 5))
        snprintf(t->shape, sizeof t->shape, "%s", v);
    else if (klen == 5 && !strncmp(line, "shard", 5) &&
             sscanf(v, "%d/%d", &t->shard_index, &t->shard_count) == 2)
        ;
    else if (klen == 6 && !strncmp(line, "device", 6))
        snprintf(t->device, sizeof t->device, "%s", v);
    else {
        if (klen == 5 && !strncmp(line, "cores", 5))
            t->cores = atoi(v); /* kept in machine too: it describes the table */
        size_t used = strlen(t->machine);
        snprintf(t->machine + used, sizeof t->machine - used, "%s%s", used ? "; " : "", line);
    }
}

mt_status replay_table_read(const char *path, replay_table *t, mt_err *err)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    if (!f)
        return mt_fail(err, MT_E_IO, "%s: cannot open", path);
    char line[2048];
    int lineno = 0, cap = 0;
    bool columns = false;
    int version = 1, fields = 5; /* numeric fields between status and config */
    mt_status st = MT_OK;
    while (st == MT_OK && fgets(line, sizeof line, f)) {
        lineno++;
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0])
            continue;
        if (line[0] == '#') {
            if (lineno == 1 && !strcmp(line, "# moetune replay table 3"))
                version = 3, fields = 4;
            else if (lineno == 1 && !strcmp(line, "# moetune replay table 2"))
                version = 2, fields = 3;
            else if (lineno == 1 && strcmp(line, "# moetune replay table 1"))
                st = mt_fail(err, MT_E_FORMAT, "%s:1: not a replay table (version 1 to 3)",
                             path);
            header(t, line + 1 + (line[1] == ' '));
            continue;
        }
        if (!columns) {
            const char *want = version == 1   ? "m,status,median_ms,min_ms,p10_ms,p90_ms,reps,config"
                               : version == 2 ? "m,status,time_ms,max_ms,passes,config"
                                              : "m,status,time_ms,min_ms,max_ms,passes,config";
            if (strcmp(line, want))
                st = mt_fail(err, MT_E_FORMAT, "%s:%d: expected the column line \"%s\"", path,
                             lineno, want);
            columns = true;
            continue;
        }
        if (t->n == cap) {
            cap = cap ? cap * 2 : 256;
            replay_row *g = realloc(t->rows, sizeof *g * (size_t)cap);
            if (!g) {
                st = mt_fail(err, MT_E_NOMEM, "%s", path);
                break;
            }
            t->rows = g;
        }
        replay_row *r = &t->rows[t->n];
        char status[32];
        long long m;
        int used = 0;
        if (sscanf(line, "%lld,%31[^,],%n", &m, status, &used) != 2 || m < 1 ||
            !db_trial_status_parse(status, &r->status)) {
            st = mt_fail(err, MT_E_FORMAT, "%s:%d: bad m or status", path, lineno);
            break;
        }
        r->m = m;
        const char *p = line + used;
        /* version 1: median,min,p10,p90,reps; version 2: time,max,passes;
         * version 3: time,min,max,passes; the first is the table's time;
         * empty fields are NAN */
        for (int k = 0; k < fields; k++) {
            const char *comma = strchr(p, ',');
            if (!comma) {
                st = mt_fail(err, MT_E_FORMAT, "%s:%d: too few fields", path, lineno);
                break;
            }
            if (k == 0)
                r->median_ms = comma == p ? NAN : strtod(p, NULL);
            p = comma + 1;
        }
        if (st != MT_OK)
            break;
        if (!*p || strlen(p) > DB_CONFIG_KEY_MAX) {
            st = mt_fail(err, MT_E_FORMAT, "%s:%d: bad config key", path, lineno);
            break;
        }
        snprintf(r->config, sizeof r->config, "%s", p);
        t->n++;
    }
    fclose(f);
    if (st == MT_OK && (!t->family[0] || !t->shape[0] || !t->device[0]))
        st = mt_fail(err, MT_E_FORMAT, "%s: family, shape or device header missing", path);
    if (st == MT_OK && t->n == 0)
        st = mt_fail(err, MT_E_FORMAT, "%s: no rows", path);
    return st;
}

int replay_table_ms(const replay_table *t, int64_t *ms, int cap)
{
    int n = 0;
    for (int i = 0; i < t->n; i++) {
        int j = 0;
        while (j < n && ms[j] != t->rows[i].m)
            j++;
        if (j < n || n == cap)
            continue;
        /* insert in order */
        int k = n++;
        while (k > 0 && ms[k - 1] > t->rows[i].m) {
            ms[k] = ms[k - 1];
            k--;
        }
        ms[k] = t->rows[i].m;
    }
    return n;
}

double replay_table_time(const replay_table *t, int64_t m, const char *config)
{
    for (int i = 0; i < t->n; i++) {
        const replay_row *r = &t->rows[i];
        if (r->m == m && !strcmp(r->config, config))
            return (r->status == DB_TRIAL_OK || r->status == DB_TRIAL_SKIPPED) &&
                           r->median_ms > 0
                       ? r->median_ms
                       : INFINITY;
    }
    return INFINITY;
}

double replay_table_optimum(const replay_table *t, int64_t m, int *rows)
{
    double best = INFINITY;
    int n = 0;
    for (int i = 0; i < t->n; i++)
        if (t->rows[i].m == m) {
            n++;
            if (t->rows[i].status == DB_TRIAL_OK && t->rows[i].median_ms < best)
                best = t->rows[i].median_ms;
        }
    if (rows)
        *rows = n;
    return best;
}

double replay_search(const kern_family *f, const kern_impl *im, const kern_shape *s, int64_t m,
                     const dev_props *p, tune_strategy st, uint64_t seed, int budget,
                     const replay_table *t, int *space)
{
    return replay_search_ex(f, im, s, m, p, st, seed, budget, t, space, NULL, 0, NULL, NULL);
}

double replay_search_ex(const kern_family *f, const kern_impl *im, const kern_shape *s, int64_t m,
                        const dev_props *p, tune_strategy st, uint64_t seed, int budget,
                        const replay_table *t, int *space, const kern_config *seeds, int n_seeds,
                        kern_config *top, int *n_top)
{
    tune_search_args a = {f, im, s, m, p, st, seed, t->shard_index, t->shard_count, 8, budget};
    tune_search *srch = NULL;
    int top_cap = n_top ? (*n_top < 16 ? *n_top : 16) : 0;
    if (n_top)
        *n_top = 0;
    if (tune_search_create(&a, &srch, NULL) != MT_OK)
        return INFINITY;
    if (space)
        *space = tune_search_space(srch);
    for (int i = 0; i < n_seeds && i < REPLAY_TRANSFER_SEEDS; i++)
        tune_search_seed(srch, &seeds[i]);
    double best = INFINITY;
    double top_ms[16];
    int used = 0;
    kern_config c[64];
    while (used < budget) {
        int want = budget - used < 64 ? budget - used : 64;
        int n = tune_search_next(srch, c, want);
        if (!n)
            break;
        for (int i = 0; i < n && used < budget; i++, used++) {
            char key[DB_CONFIG_KEY_MAX + 1];
            kern_config_key(im, &c[i], key, sizeof key);
            double ms = replay_table_time(t, m, key);
            tune_search_result(srch, &c[i], isfinite(ms), ms);
            if (ms < best)
                best = ms;
            /* the fastest few, in order: what transfer seeds the next M with */
            if (top && top_cap > 0 && isfinite(ms) &&
                (*n_top < top_cap || ms < top_ms[top_cap - 1])) {
                int k = *n_top < top_cap ? (*n_top)++ : top_cap - 1;
                while (k > 0 && top_ms[k - 1] > ms) {
                    top[k] = top[k - 1];
                    top_ms[k] = top_ms[k - 1];
                    k--;
                }
                top[k] = c[i];
                top_ms[k] = ms;
            }
        }
    }
    tune_search_destroy(srch);
    return best;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void replay_score_strategy(const kern_family *f, const kern_impl *im, const kern_shape *s,
                           int64_t m, const dev_props *p, tune_strategy st, uint64_t seed0,
                           int seeds, int budget, const replay_table *t, replay_score *out)
{
    replay_score_transfer(f, im, s, m, 0, p, st, seed0, seeds, budget, t, out);
}

void replay_score_transfer(const kern_family *f, const kern_impl *im, const kern_shape *s,
                           int64_t m, int64_t from_m, const dev_props *p, tune_strategy st,
                           uint64_t seed0, int seeds, int budget, const replay_table *t,
                           replay_score *out)
{
    memset(out, 0, sizeof *out);
    out->budget = budget;
    out->seeds = seeds;
    double opt = replay_table_optimum(t, m, NULL);
    double *q = malloc(sizeof *q * (size_t)(seeds > 0 ? seeds : 1));
    if (!q || seeds < 1 || !isfinite(opt)) {
        free(q);
        out->median = out->mean = out->p10 = NAN;
        return;
    }
    for (int i = 0; i < seeds; i++) {
        uint64_t seed = seed0 + (uint64_t)i * 0x9e3779b97f4a7c15ull;
        kern_config top[REPLAY_TRANSFER_SEEDS];
        int n_top = from_m > 0 ? REPLAY_TRANSFER_SEEDS : 0;
        if (from_m > 0) /* the tuner's transfer: from_m was tuned first */
            replay_search_ex(f, im, s, from_m, p, st, seed ^ 0xf00d, budget, t, NULL, NULL, 0,
                             top, &n_top);
        double b = replay_search_ex(f, im, s, m, p, st, seed, budget, t, NULL, top, n_top, NULL,
                                    NULL);
        q[i] = isfinite(b) ? opt / b : 0;
        out->mean += q[i] / seeds;
        out->hit += (b <= opt) / (double)seeds;
    }
    qsort(q, (size_t)seeds, sizeof *q, cmp_double);
    out->median = seeds % 2 ? q[seeds / 2] : (q[seeds / 2 - 1] + q[seeds / 2]) / 2;
    out->p10 = q[seeds / 10];
    free(q);
}

mt_status replay_table_props(const replay_table *t, dev_props *out, mt_err *err)
{
    char spec[64];
    if (!strcmp(t->device, "cpu") && t->cores > 0)
        snprintf(spec, sizeof spec, "cpu:%d", t->cores);
    else
        snprintf(spec, sizeof spec, "%s", t->device);
    dev_device *d = NULL;
    mt_status st = dev_open(spec, &(dev_open_opts){0}, &d, err);
    if (st != MT_OK)
        return st;
    *out = *dev_get_props(d);
    dev_close(d);
    return MT_OK;
}
