/* cmd_db.c: `moetune db show|best|export|import|merge|misses|check|gc`
 * (and `verify`, in cmd_db_verify.c):
 * inspect, ship, join and clean a tuning database. Thin: one option table
 * for all of them (each reads what it needs), calls db/, prints text or
 * (--json) JSON. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/files.h"
#include "db/db.h"
#include "kernels/core/family.h"
#include "cli.h"

#define MAX_ITEMS 64

typedef struct opts {
    const char *db_path, *out;
    bool json, dry_run, current;
    db_filter filter;
    const char *items[MAX_ITEMS]; /* positional arguments */
    int nitems;
    db_keep_hash keep[MAX_ITEMS];
    int nkeep;
    char keep_buf[MAX_ITEMS][512];
} opts;

/* --keep-hash FAMILY=HASH, repeatable: dst is the opts. */
static bool set_keep_hash(void *dst, const char *v, char *err, size_t cap)
{
    opts *o = dst;
    const char *eq = strchr(v, '=');
    if (!eq || eq == v || !eq[1] || o->nkeep >= MAX_ITEMS ||
        strlen(v) >= sizeof o->keep_buf[0]) {
        snprintf(err, cap, "needs FAMILY=HASH (at most %d of them)", MAX_ITEMS);
        return false;
    }
    char *b = o->keep_buf[o->nkeep];
    snprintf(b, sizeof o->keep_buf[0], "%s", v);
    b[eq - v] = 0;
    o->keep[o->nkeep++] = (db_keep_hash){b, b + (eq - v) + 1};
    return true;
}

static void print_commands(FILE *f);

/* The options every db command but verify reads (each uses those it needs);
 * argv[first] onwards. */
static int parse(int argc, char **argv, int first, opts *o)
{
    memset(o, 0, sizeof *o);
    o->db_path = cli_db_default();
    const cli_opt table[] = {
        {.name = "--db", .type = CLI_OPT_STRING, .dst = &o->db_path, .arg = "FILE",
         .def_text = CLI_DB_DEFAULT_TEXT, .help = "the database"},
        {.name = "--json", .type = CLI_OPT_FLAG, .dst = &o->json,
         .help = "machine-readable output"},
        {.name = "--family", .type = CLI_OPT_STRING, .dst = &o->filter.family, .arg = "F",
         .help = "best, misses, check: this kernel family only"},
        {.name = "--shape", .type = CLI_OPT_STRING, .dst = &o->filter.shape_key, .arg = "KEY",
         .help = "best, misses, check: this shape only"},
        {.name = "--m", .type = CLI_OPT_INT64, .dst = &o->filter.m, .arg = "M", .min = 1,
         .max = HUGE_VAL, .help = "best, misses, check: this M only"},
        {.name = "--device", .type = CLI_OPT_STRING, .dst = &o->filter.device,
         .arg = "FINGERPRINT|NAME", .help = "best, misses, check: this device only"},
        {.name = "--out", .type = CLI_OPT_STRING, .dst = &o->out, .arg = "FILE",
         .def_text = "stdout", .help = "export: write here (atomically)"},
        {.name = "--current", .type = CLI_OPT_FLAG, .dst = &o->current,
         .help = "gc: keep the sources built into this moetune (GPU and CPU) for every "
                 "built-in family"},
        {.name = "--keep-hash", .type = CLI_OPT_CUSTOM, .dst = o, .set = set_keep_hash,
         .arg = "FAMILY=HASH", .help = "gc: keep this source hash of the family; repeat for "
                                       "each family and source"},
        {.name = "--dry-run", .type = CLI_OPT_FLAG, .dst = &o->dry_run,
         .help = "gc: count what would be dropped, drop nothing"},
        {0},
    };
    const cli_cmd cmd = {
        .name = "db", .opts = table, .usage = "db <command> [--db FILE] [--json] [options]",
        .about = "Inspects, ships, joins and cleans a tuning database. Lookup order at run "
                 "time: exact M, nearest tuned M (log2, ties to the larger), another device "
                 "of the same arch (used, with a warning), stale source hash (never used), "
                 "miss (default config). See docs/DB.md.",
        .more = print_commands, .pos_arg = "[FILE...]", .pos = o->items,
        .pos_cap = MAX_ITEMS, .n_pos = &o->nitems};
    return cli_opts_parse(&cmd, argc, argv, first);
}

static void print_json(cJSON *j)
{
    char *s = cJSON_Print(j);
    if (s)
        puts(s);
    free(s);
    cJSON_Delete(j);
}

static const char *when(int64_t ms, char *buf, size_t cap)
{
    if (ms <= 0)
        return "-";
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%d %H:%M:%SZ", &tm);
    return buf;
}

static int fail(const char *what, const mt_err *e)
{
    cli_error("db", "%s: %s", what, e->msg);
    return CLI_FAIL;
}

static db_t *open_db(const opts *o, db_open_flags flags, mt_err *e)
{
    db_t *db = NULL;
    if (db_open(o->db_path, flags, &db, e) != MT_OK)
        return NULL;
    return db;
}

/* ---- show ---------------------------------------------------------------- */

static cJSON *device_json(const db_device_row *d)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "backend", db_backend_name(d->backend));
    cJSON_AddStringToObject(o, "arch", d->arch);
    cJSON_AddStringToObject(o, "name", d->name);
    cJSON_AddNumberToObject(o, "compute_units", d->compute_units);
    cJSON_AddStringToObject(o, "runtime_version", d->runtime_version);
    cJSON_AddStringToObject(o, "driver_version", d->driver_version);
    cJSON_AddStringToObject(o, "fingerprint", d->fingerprint);
    return o;
}

static int show_device(void *ctx, const db_device_row *d)
{
    if (ctx) {
        cJSON_AddItemToArray(ctx, device_json(d));
        return 0;
    }
    printf("  %-4s %-10s %-36s %4d CUs  %-20s %.16s\n", db_backend_name(d->backend), d->arch,
           d->name, d->compute_units, d->runtime_version, d->fingerprint);
    return 0;
}

static void print_show(const opts *o, const db_stats *s)
{
    printf("database %s (schema %d)\n", o->db_path, s->schema_version);
    printf("devices %" PRId64 ", kernels %" PRId64 ", sessions %" PRId64 ", winners %" PRId64
           " (%" PRId64 " re-verified), misses %" PRId64 ", code objects %" PRId64 "\n",
           s->devices, s->kernels, s->sessions, s->winners, s->winners_verified, s->misses,
           s->code_objects);
    printf("trials %" PRId64 ":", s->trials);
    for (int i = 0; i < DB_TRIAL_STATUS_COUNT; i++)
        printf(" %s %" PRId64, db_trial_status_str((db_trial_status)i), s->trials_by_status[i]);
    printf("\ndevices:\n");
}

static cJSON *show_json(const opts *o, const db_stats *s, cJSON *devs)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "path", o->db_path);
    cJSON_AddNumberToObject(j, "schema_version", s->schema_version);
    cJSON_AddNumberToObject(j, "devices", (double)s->devices);
    cJSON_AddNumberToObject(j, "kernels", (double)s->kernels);
    cJSON_AddNumberToObject(j, "sessions", (double)s->sessions);
    cJSON_AddNumberToObject(j, "trials", (double)s->trials);
    cJSON *by = cJSON_AddObjectToObject(j, "trials_by_status");
    for (int i = 0; i < DB_TRIAL_STATUS_COUNT; i++)
        cJSON_AddNumberToObject(by, db_trial_status_str((db_trial_status)i),
                                (double)s->trials_by_status[i]);
    cJSON_AddNumberToObject(j, "winners", (double)s->winners);
    cJSON_AddNumberToObject(j, "winners_verified", (double)s->winners_verified);
    cJSON_AddNumberToObject(j, "misses", (double)s->misses);
    cJSON_AddNumberToObject(j, "code_objects", (double)s->code_objects);
    cJSON_AddItemToObject(j, "device_list", devs);
    return j;
}

static int cmd_show(const opts *o)
{
    mt_err e = MT_ERR_INIT;
    db_t *db = open_db(o, DB_OPEN_READONLY, &e);
    if (!db)
        return fail("show", &e);
    db_stats s;
    if (db_stats_get(db, &s, &e) != MT_OK) {
        db_close(db);
        return fail("show", &e);
    }
    cJSON *devs = o->json ? cJSON_CreateArray() : NULL;
    if (!o->json)
        print_show(o, &s);
    mt_status st = db_devices_each(db, show_device, devs, &e);
    db_close(db);
    if (st != MT_OK) {
        cJSON_Delete(devs);
        return fail("show", &e);
    }
    if (o->json)
        print_json(show_json(o, &s, devs));
    return CLI_OK;
}

/* ---- best / check -------------------------------------------------------- */

typedef struct list_ctx {
    cJSON *arr;
    int64_t n;
} list_ctx;

/* "confirmed 0.81x [0.78, 0.84] 10 rounds", "default_kept (BM=64 1.01x
 * [0.97, 1.05] 10 rounds)", "median". */
static void decision_text(const db_confirm *d, char *out, size_t cap)
{
    if (d->rounds <= 0) {
        snprintf(out, cap, "%s", db_decision_str(d->decision));
        return;
    }
    char iv[96];
    snprintf(iv, sizeof iv, "%.3fx [%.3f, %.3f] %d rounds", d->ratio, d->ratio_lo, d->ratio_hi,
             d->rounds);
    if (d->decision == DB_DECIDED_CONFIRMED || !d->challenger_key)
        snprintf(out, cap, "%s %s", db_decision_str(d->decision), iv);
    else
        snprintf(out, cap, "%s (%.200s %s)", db_decision_str(d->decision), d->challenger_key, iv);
}

static cJSON *winner_json(const db_winner_row *w)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "device", device_json(&w->device));
    cJSON_AddStringToObject(o, "family", w->family);
    cJSON_AddNumberToObject(o, "version", w->version);
    cJSON_AddStringToObject(o, "source_hash", w->source_hash);
    cJSON_AddStringToObject(o, "shape", w->shape_key);
    cJSON_AddNumberToObject(o, "m", (double)w->m);
    cJSON_AddStringToObject(o, "config_key", w->config_key);
    cJSON *cfg = cJSON_Parse(w->config_json);
    cJSON_AddItemToObject(o, "config", cfg ? cfg : cJSON_CreateString(w->config_json));
    cJSON_AddNumberToObject(o, "time_ms", w->time_ms);
    cJSON *ru = cJSON_Parse(w->runner_ups_json);
    cJSON_AddItemToObject(o, "runner_ups", ru ? ru : cJSON_CreateArray());
    if (w->verified_ms > 0) {
        cJSON_AddNumberToObject(o, "verified_ms", (double)w->verified_ms);
        cJSON_AddNumberToObject(o, "verified_time_ms", w->verified_time_ms);
    }
    cJSON_AddBoolToObject(o, "stale", w->stale);
    if (w->origin)
        cJSON_AddStringToObject(o, "origin", w->origin);
    const db_confirm *d = &w->confirm;
    cJSON_AddStringToObject(o, "decision", db_decision_str(d->decision));
    if (d->challenger_key)
        cJSON_AddStringToObject(o, "challenger", d->challenger_key);
    if (d->rounds > 0) {
        cJSON_AddNumberToObject(o, "ratio", d->ratio);
        cJSON_AddNumberToObject(o, "ratio_lo", d->ratio_lo);
        cJSON_AddNumberToObject(o, "ratio_hi", d->ratio_hi);
        cJSON_AddNumberToObject(o, "confidence", d->confidence);
        cJSON_AddNumberToObject(o, "rounds", d->rounds);
    }
    return o;
}

static int show_winner(void *ctx, const db_winner_row *w)
{
    list_ctx *c = ctx;
    c->n++;
    if (c->arr) {
        cJSON_AddItemToArray(c->arr, winner_json(w));
        return 0;
    }
    char vbuf[48] = "-";
    if (w->verified_ms > 0)
        snprintf(vbuf, sizeof vbuf, "%.4f ms%s", w->verified_time_ms,
                 w->stale ? " STALE (no longer wins)" : "");
    char dbuf[320];
    decision_text(&w->confirm, dbuf, sizeof dbuf);
    printf("%-24.24s %-12s %-36s %6" PRId64 "  %-28s %10.4f ms  %s  verified %s%s%s\n",
           w->device.name, w->family, w->shape_key, w->m, w->config_key, w->time_ms, dbuf, vbuf,
           w->origin ? "  from " : "", w->origin ? w->origin : "");
    return 0;
}

static int cmd_best(const opts *o)
{
    mt_err e = MT_ERR_INIT;
    db_t *db = open_db(o, DB_OPEN_READONLY, &e);
    if (!db)
        return fail("best", &e);
    list_ctx c = {o->json ? cJSON_CreateArray() : NULL, 0};
    if (!o->json)
        printf("%-24s %-12s %-36s %6s  %-28s %13s  %s\n", "device", "family", "shape", "M",
               "config", "median", "decision");
    mt_status st = db_winners_each(db, &o->filter, show_winner, &c, &e);
    db_close(db);
    if (st != MT_OK) {
        cJSON_Delete(c.arr);
        return fail("best", &e);
    }
    if (o->json)
        print_json(c.arr);
    else if (c.n == 0)
        printf("(no winners%s)\n", o->filter.family || o->filter.shape_key || o->filter.m ||
                                           o->filter.device
                                       ? " match the filter"
                                       : "");
    return CLI_OK;
}

static int cmd_db_check(const opts *o)
{
    mt_err e = MT_ERR_INIT;
    db_t *db = open_db(o, DB_OPEN_READONLY, &e);
    if (!db)
        return fail("check", &e);
    bool ok = false;
    char msg[512];
    if (db_integrity_check(db, &ok, msg, sizeof msg, &e) != MT_OK) {
        db_close(db);
        return fail("check", &e);
    }
    list_ctx c = {o->json ? cJSON_CreateArray() : NULL, 0};
    if (!o->json) {
        printf("integrity: %s\n", ok ? "ok" : msg);
        printf("re-timing stored winners needs the tuner and the device they were tuned on; "
               "`moetune db check` does not time kernels. These winners would be re-timed:\n");
    }
    mt_status st = db_winners_each(db, &o->filter, show_winner, &c, &e);
    db_close(db);
    if (st != MT_OK) {
        cJSON_Delete(c.arr);
        return fail("check", &e);
    }
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddBoolToObject(j, "integrity_ok", ok);
        cJSON_AddStringToObject(j, "integrity", ok ? "ok" : msg);
        cJSON_AddBoolToObject(j, "retimed", false);
        cJSON_AddItemToObject(j, "would_retime", c.arr);
        print_json(j);
    } else {
        printf("%" PRId64 " winners listed; none re-timed\n", c.n);
    }
    return ok ? CLI_OK : CLI_FAIL;
}

/* ---- misses -------------------------------------------------------------- */

static int show_miss(void *ctx, const db_miss_row *m)
{
    list_ctx *c = ctx;
    c->n++;
    char a[32], b[32];
    if (c->arr) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "device", device_json(&m->device));
        cJSON_AddStringToObject(o, "family", m->family);
        cJSON_AddStringToObject(o, "shape", m->shape_key);
        if (m->shape_run)
            cJSON_AddStringToObject(o, "shape_run", m->shape_run);
        else
            cJSON_AddNullToObject(o, "shape_run");
        cJSON_AddNumberToObject(o, "m", (double)m->m);
        cJSON_AddNumberToObject(o, "count", (double)m->count);
        cJSON_AddNumberToObject(o, "first_seen_ms", (double)m->first_seen_ms);
        cJSON_AddNumberToObject(o, "last_seen_ms", (double)m->last_seen_ms);
        cJSON_AddStringToObject(o, "last_reason", db_provenance_str(m->last_reason));
        cJSON_AddItemToArray(c->arr, o);
        return 0;
    }
    printf("%8" PRId64 "  %-12s %-24.24s %-12s %-36s %6" PRId64 "  %s .. %s\n", m->count,
           db_provenance_str(m->last_reason), m->device.name, m->family, m->shape_key, m->m,
           when(m->first_seen_ms, a, sizeof a), when(m->last_seen_ms, b, sizeof b));
    return 0;
}

static int cmd_misses(const opts *o)
{
    mt_err e = MT_ERR_INIT;
    db_t *db = open_db(o, DB_OPEN_READONLY, &e);
    if (!db)
        return fail("misses", &e);
    list_ctx c = {o->json ? cJSON_CreateArray() : NULL, 0};
    if (!o->json)
        printf("%8s  %-12s %-24s %-12s %-36s %6s  %s\n", "count", "reason", "device", "family",
               "shape", "M", "first .. last seen");
    mt_status st = db_misses_each(db, &o->filter, show_miss, &c, &e);
    db_close(db);
    if (st != MT_OK) {
        cJSON_Delete(c.arr);
        return fail("misses", &e);
    }
    if (o->json)
        print_json(c.arr);
    else if (c.n == 0)
        printf("(no misses recorded)\n");
    return CLI_OK;
}

/* ---- export / import / merge --------------------------------------------- */

static int cmd_export(const opts *o)
{
    mt_err e = MT_ERR_INIT;
    db_t *db = open_db(o, DB_OPEN_READONLY, &e);
    if (!db)
        return fail("export", &e);
    char *buf = NULL;
    size_t n = 0;
    FILE *f = o->out ? open_memstream(&buf, &n) : stdout;
    mt_status st = f ? db_export(db, f, &e) : mt_fail(&e, MT_E_NOMEM, "export buffer");
    db_close(db);
    if (o->out && f)
        fclose(f);
    if (st == MT_OK && o->out)
        st = mt_file_write_atomic(o->out, buf, n, &e);
    free(buf);
    if (st != MT_OK)
        return fail("export", &e);
    if (o->out)
        fprintf(stderr, "exported %s to %s (%zu bytes)\n", o->db_path, o->out, n);
    return CLI_OK;
}

static cJSON *stats_json(const char *src, const db_merge_stats *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "source", src);
    cJSON_AddNumberToObject(o, "devices_added", (double)s->devices_added);
    cJSON_AddNumberToObject(o, "kernels_added", (double)s->kernels_added);
    cJSON_AddNumberToObject(o, "sessions_added", (double)s->sessions_added);
    cJSON_AddNumberToObject(o, "trials_added", (double)s->trials_added);
    cJSON_AddNumberToObject(o, "trials_replaced", (double)s->trials_replaced);
    cJSON_AddNumberToObject(o, "trials_kept", (double)s->trials_kept);
    cJSON_AddNumberToObject(o, "winners_added", (double)s->winners_added);
    cJSON_AddNumberToObject(o, "winners_replaced", (double)s->winners_replaced);
    cJSON_AddNumberToObject(o, "winners_kept", (double)s->winners_kept);
    cJSON_AddNumberToObject(o, "misses_merged", (double)s->misses_merged);
    cJSON_AddNumberToObject(o, "code_objects_added", (double)s->code_added);
    return o;
}

static void print_stats(const char *src, const db_merge_stats *s)
{
    printf("%s: trials +%" PRId64 " added, %" PRId64 " replaced, %" PRId64 " kept; winners +%" PRId64
           " added, %" PRId64 " replaced, %" PRId64 " kept; devices +%" PRId64 ", kernels +%" PRId64
           ", sessions +%" PRId64 ", misses %" PRId64 ", code objects +%" PRId64 "\n",
           src, s->trials_added, s->trials_replaced, s->trials_kept, s->winners_added,
           s->winners_replaced, s->winners_kept, s->devices_added, s->kernels_added,
           s->sessions_added, s->misses_merged, s->code_added);
}

static int cmd_join(const opts *o, bool is_merge)
{
    const char *what = is_merge ? "merge" : "import";
    if (o->nitems == 0) {
        cli_error("db", "%s needs at least one %s", what, is_merge ? "SRC.db" : "FILE.json");
        return CLI_USAGE;
    }
    mt_err e = MT_ERR_INIT;
    db_t *db = open_db(o, DB_OPEN_DEFAULT, &e);
    if (!db)
        return fail(what, &e);
    cJSON *arr = o->json ? cJSON_CreateArray() : NULL;
    if (!o->json)
        printf("%s\n", db_merge_rule());
    int rc = CLI_OK;
    for (int i = 0; i < o->nitems; i++) {
        db_merge_stats s;
        mt_status st = is_merge ? db_merge(db, o->items[i], &s, &e)
                                : db_import(db, o->items[i], &s, &e);
        if (st != MT_OK) {
            rc = fail(what, &e);
            break;
        }
        if (o->json)
            cJSON_AddItemToArray(arr, stats_json(o->items[i], &s));
        else
            print_stats(o->items[i], &s);
    }
    db_close(db);
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "rule", db_merge_rule());
        cJSON_AddItemToObject(j, "sources", arr);
        print_json(j);
    }
    return rc;
}

/* ---- gc ------------------------------------------------------------------ */

/* The keep list of --current: the GPU and CPU source hash of every
 * built-in family, plus any --keep-hash given. The caller frees *keep and
 * *hashes. */
static int current_hashes(const opts *o, db_keep_hash **keep, char (**hashes)[65])
{
    int nf = 0;
    for (const kern_family *const *f = kern_families(); *f; f++)
        nf++;
    int cap = 2 * nf + o->nkeep;
    *keep = calloc((size_t)cap + 1, sizeof **keep);
    *hashes = calloc((size_t)cap + 1, sizeof **hashes);
    if (!*keep || !*hashes)
        return -1;
    int n = 0;
    static const dev_backend kinds[2] = {DEV_BACKEND_HIP, DEV_BACKEND_CPU};
    for (const kern_family *const *f = kern_families(); *f; f++)
        for (int b = 0; b < 2; b++)
            if (kern_family_impl(*f, kinds[b])) {
                kern_source_hash(*f, kinds[b], (*hashes)[n]);
                (*keep)[n] = (db_keep_hash){(*f)->name, (*hashes)[n]};
                n++;
            }
    for (int i = 0; i < o->nkeep; i++)
        (*keep)[n++] = o->keep[i];
    return n;
}

static void print_gc(const opts *o, const db_gc_stats *s)
{
    if (!o->json) {
        printf("%s %" PRId64 " stale kernel versions: %" PRId64 " trials, %" PRId64 " winners\n",
               o->dry_run ? "would drop" : "dropped", s->kernels_removed, s->trials_removed,
               s->winners_removed);
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddBoolToObject(j, "dry_run", o->dry_run);
    cJSON_AddNumberToObject(j, "kernels_removed", (double)s->kernels_removed);
    cJSON_AddNumberToObject(j, "trials_removed", (double)s->trials_removed);
    cJSON_AddNumberToObject(j, "winners_removed", (double)s->winners_removed);
    print_json(j);
}

static int cmd_gc(const opts *o)
{
    if (o->nkeep == 0 && !o->current) {
        cli_error("db", "gc needs the current source hashes: --current, or --keep-hash "
                        "FAMILY=HASH (repeat for each family and source)");
        return CLI_USAGE;
    }
    const db_keep_hash *keep = o->keep;
    db_keep_hash *owned = NULL;
    char(*hashes)[65] = NULL;
    int nkeep = o->nkeep;
    if (o->current) {
        nkeep = current_hashes(o, &owned, &hashes);
        keep = owned;
        if (nkeep < 0) {
            free(owned);
            free(hashes);
            cli_error("db", "gc: out of memory");
            return CLI_FAIL;
        }
    }
    mt_err e = MT_ERR_INIT;
    db_t *db = open_db(o, o->dry_run ? DB_OPEN_READONLY : DB_OPEN_NOCREATE, &e);
    db_gc_stats s;
    mt_status st = db ? db_gc(db, keep, nkeep, o->dry_run, &s, &e) : e.status;
    db_close(db);
    free(owned);
    free(hashes);
    if (st != MT_OK)
        return fail("gc", &e);
    print_gc(o, &s);
    return CLI_OK;
}

static int cmd_import(const opts *o) { return cmd_join(o, false); }
static int cmd_merge(const opts *o) { return cmd_join(o, true); }

/* The db commands: what help lists and what runs. verify reads its own
 * options (cmd_db_verify.c). */
static const struct db_command {
    const char *name, *args, *help;
    int (*fn)(const opts *o);
    cli_cmd_fn own_argv; /* instead of fn: parses argv itself */
    bool items;          /* takes FILE... arguments */
} commands[] = {
    {"show", NULL, "schema version, counts, devices and kernels", cmd_show, NULL, false},
    {"best", NULL, "winners (the config the runtime uses) per device, kernel, shape and M",
     cmd_best, NULL, false},
    {"export", "[--out FILE]", "the whole database as stable JSON (stdout by default)",
     cmd_export, NULL, false},
    {"import", "FILE...", "read exports into --db (merge rule applies)", cmd_import, NULL, true},
    {"merge", "SRC.db...", "merge other databases into --db; prints the rule", cmd_merge, NULL,
     true},
    {"misses", NULL, "lookups that found no tuned config, most frequent first", cmd_misses,
     NULL, false},
    {"check", NULL, "integrity check, and a list of the winners a re-timing would cover (it "
                    "times nothing)", cmd_db_check, NULL, false},
    {"verify", "[--device D]", "re-time winners against their runner-up and the default on "
     "this device; mark those that no longer win stale (`moetune db verify --help`)", NULL,
     cmd_db_verify, false},
    {"gc", "--current | --keep-hash FAMILY=HASH...", "drop trials and winners of named "
     "families whose source hash is not a kept one [--dry-run]", cmd_gc, NULL, false},
    {NULL, NULL, NULL, NULL, NULL, false},
};

static void print_commands(FILE *f)
{
    fprintf(f, "commands:\n");
    for (int i = 0; commands[i].name; i++) {
        char left[128];
        snprintf(left, sizeof left, "%s%s%s", commands[i].name, commands[i].args ? " " : "",
                 commands[i].args ? commands[i].args : "");
        cli_opts_help_row(f, left, commands[i].help);
    }
}

int cmd_db(int argc, char **argv)
{
    opts o;
    bool help = argc >= 2 && !strcmp(argv[1], "help");
    if (argc < 2 || help || argv[1][0] == '-') {
        /* no command first: the help, the option list, or a usage error */
        char *ask[] = {argv[0], "--help"};
        int rc = parse(help ? 2 : argc, help ? ask : argv, 1, &o);
        if (rc == CLI_OK)
            cli_error("db", "give a command first: moetune db <command> [options] "
                            "(moetune db --help lists them)");
        return rc == CLI_HELP ? CLI_OK : CLI_USAGE;
    }
    const struct db_command *c = commands;
    while (c->name && strcmp(c->name, argv[1]))
        c++;
    if (!c->name) {
        cli_error("db", "unknown command '%s' (moetune db --help lists them)", argv[1]);
        return CLI_USAGE;
    }
    if (c->own_argv)
        return c->own_argv(argc, argv);
    int rc = parse(argc, argv, 2, &o);
    if (rc != CLI_OK)
        return rc == CLI_HELP ? CLI_OK : rc;
    if (!c->items && o.nitems > 0) {
        cli_error("db", "%s takes no argument '%s'", c->name, o.items[0]);
        return CLI_USAGE;
    }
    return c->fn(&o);
}
