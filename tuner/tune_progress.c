/* tune_progress.c: what the tuner shows while it runs. On a terminal one
 * status line (bar, counts by status, best so far, ETA) rewritten in place
 * at most ten times a second; otherwise one plain log line per candidate. */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "common/clock.h"
#include "tune_impl.h"

static const char *const short_names[DB_TRIAL_STATUS_COUNT] = {
    [DB_TRIAL_OK] = "ok",        [DB_TRIAL_COMPILE_ERROR] = "cerr",
    [DB_TRIAL_INVALID] = "inv",  [DB_TRIAL_WRONG_RESULT] = "wrong",
    [DB_TRIAL_CRASH] = "crash",  [DB_TRIAL_TIMEOUT] = "tmo",
    [DB_TRIAL_SKIPPED] = "skip", [DB_TRIAL_COMPILED] = "comp",
};
_Static_assert(sizeof short_names / sizeof short_names[0] == DB_TRIAL_STATUS_COUNT,
               "one short name per trial status");

static void fmt_secs(double s, char *out, size_t cap)
{
    if (!isfinite(s) || s < 0)
        snprintf(out, cap, "--:--");
    else if (s >= 3600)
        snprintf(out, cap, "%d:%02d:%02d", (int)s / 3600, ((int)s / 60) % 60, (int)s % 60);
    else
        snprintf(out, cap, "%d:%02d", (int)s / 60, (int)s % 60);
}

static void draw(tune_progress *p, bool force)
{
    if (!p->out || !p->tty)
        return;
    double now = mt_now_ms();
    if (!force && now - p->last_draw_ms < 100)
        return;
    p->last_draw_ms = now;
    const int width = 20;
    int todo = p->planned > 0 ? p->planned : 1;
    int fill = p->done * width / todo;
    if (fill > width)
        fill = width;
    char bar[width + 1];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    char counts[160] = "";
    for (int i = 0; i < DB_TRIAL_STATUS_COUNT; i++)
        if (p->counts[i]) {
            size_t l = strlen(counts);
            snprintf(counts + l, sizeof counts - l, " %s %d", short_names[i], p->counts[i]);
        }
    double el = (now - p->t0_ms) / 1000;
    double eta = p->done > 0 ? el / p->done * (p->planned - p->done) : NAN;
    char e1[16], e2[16];
    fmt_secs(el, e1, sizeof e1);
    fmt_secs(eta, e2, sizeof e2);
    char best[64] = "";
    if (p->best_ms > 0)
        snprintf(best, sizeof best, " best %.4g ms", p->best_ms);
    fprintf(p->out, "\r\033[2K%.60s M=%lld [%s] %d/%d%s%s%s%s %s ETA %s", p->label,
            (long long)p->m, bar, p->done, p->planned, p->phase ? " " : "",
            p->phase ? p->phase : "", counts, best, e1, e2);
    fflush(p->out);
}

void tune_progress_begin(tune_progress *p, const char *label, int64_t m, int planned)
{
    FILE *out = p->out;
    bool tty = p->tty;
    memset(p, 0, sizeof *p);
    p->out = out;
    p->tty = tty;
    snprintf(p->label, sizeof p->label, "%s", label);
    p->m = m;
    p->planned = planned;
    p->t0_ms = mt_now_ms();
    draw(p, true);
}

void tune_progress_plan(tune_progress *p, int planned)
{
    p->planned = planned;
    draw(p, false);
}

void tune_progress_phase(tune_progress *p, const char *phase)
{
    p->phase = phase;
    draw(p, false);
}

void tune_progress_best(tune_progress *p, const char *config_key, double ms)
{
    p->best_ms = ms;
    snprintf(p->best_key, sizeof p->best_key, "%s", config_key);
}

void tune_progress_trial(tune_progress *p, const char *config_key, db_trial_status st,
                         double median_ms, const char *error)
{
    p->done++;
    if ((unsigned)st < DB_TRIAL_STATUS_COUNT)
        p->counts[st]++;
    if (!p->out)
        return;
    if (p->tty) {
        draw(p, false);
        return;
    }
    char t[48] = "";
    if (median_ms > 0 && isfinite(median_ms))
        snprintf(t, sizeof t, " %.4g ms", median_ms);
    char why[160] = "";
    if (error && *error && st != DB_TRIAL_OK) {
        snprintf(why, sizeof why, ": %.150s", error);
        char *nl = strchr(why, '\n');
        if (nl)
            *nl = 0;
    }
    fprintf(p->out, "tune %s M=%lld [%d/%d] %s %s%s%s\n", p->label, (long long)p->m, p->done,
            p->planned, config_key, db_trial_status_str(st), t, why);
    fflush(p->out);
}

void tune_progress_note(tune_progress *p, const char *fmt, ...)
{
    if (!p->out)
        return;
    if (p->tty)
        fprintf(p->out, "\r\033[2K");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->out, fmt, ap);
    va_end(ap);
    fputc('\n', p->out);
    draw(p, true);
}

void tune_progress_end(tune_progress *p)
{
    if (!p->out)
        return;
    double el = (mt_now_ms() - p->t0_ms) / 1000;
    char e[16];
    fmt_secs(el, e, sizeof e);
    char counts[160] = "";
    for (int i = 0; i < DB_TRIAL_STATUS_COUNT; i++)
        if (p->counts[i]) {
            size_t l = strlen(counts);
            snprintf(counts + l, sizeof counts - l, " %s %d", short_names[i], p->counts[i]);
        }
    if (p->tty)
        fprintf(p->out, "\r\033[2K");
    fprintf(p->out, "tune %s M=%lld: %d new trials%s, %d resumed, %s", p->label,
            (long long)p->m, p->done, counts, p->resumed, e);
    if (p->best_ms > 0)
        fprintf(p->out, ", best %.4g ms (%s)", p->best_ms, p->best_key);
    fputc('\n', p->out);
    fflush(p->out);
}
