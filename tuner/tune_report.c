/* tune_report.c: the table `moetune tune` prints at the end: per job and
 * M the winner, its time, GFLOP/s and GB/s (from the family's cost model),
 * the speedup over the default config, determinism and trial counts.
 * There is no roofline column: devices report no peak compute or bandwidth
 * (dev_props has no such limits), and a made-up peak would mislead. */
#include <math.h>
#include <string.h>

#include "tune_impl.h"

static int failed_count(const tune_m_report *m)
{
    int n = 0;
    for (int i = 0; i < DB_TRIAL_STATUS_COUNT; i++)
        if (i != DB_TRIAL_OK && i != DB_TRIAL_SKIPPED && i != DB_TRIAL_COMPILED)
            n += m->counts[i];
    return n;
}

static void print_compile_only(const tune_job_report *j, FILE *out)
{
    fprintf(out, "  %6s  %8s  %8s  %8s  %8s\n", "M", "compiled", "invalid", "failed", "known");
    for (int i = 0; i < j->n_m; i++) {
        const tune_m_report *m = &j->m[i];
        fprintf(out, "  %6lld  %8d  %8d  %8d  %8d\n", (long long)m->m,
                m->counts[DB_TRIAL_COMPILED], m->counts[DB_TRIAL_INVALID],
                m->counts[DB_TRIAL_COMPILE_ERROR], m->resumed);
    }
}

void tune_report_print(const tune_report *r, FILE *out)
{
    fprintf(out, "\nmoetune tune on %s (%s)%s%s: %.1f s, %d worker restart%s\n", r->device_spec,
            r->device_name, r->compile_only ? ", compile-only" : "",
            r->interrupted ? ", INTERRUPTED (run again to resume)" : "", r->elapsed_s,
            r->worker_restarts, r->worker_restarts == 1 ? "" : "s");
    for (int ji = 0; ji < r->n_jobs; ji++) {
        const tune_job_report *j = &r->jobs[ji];
        fprintf(out, "\n%s %s\n", j->fam ? j->fam->name : "?", j->shape_key);
        if (j->note[0]) {
            fprintf(out, "  %s\n", j->note);
            continue;
        }
        if (r->compile_only) {
            print_compile_only(j, out);
            continue;
        }
        fprintf(out, "  %6s  %-32s %10s %9s %8s %8s %-12s %5s %6s %6s %6s\n", "M",
                "best config", "time ms", "GFLOP/s", "GB/s", "vs dflt", "decided", "det", "new",
                "failed", "known");
        for (int i = 0; i < j->n_m; i++) {
            const tune_m_report *m = &j->m[i];
            char speed[16] = "-";
            if (m->has_winner && m->has_default && m->best_ms > 0)
                snprintf(speed, sizeof speed, "%.2fx", m->default_ms / m->best_ms);
            const char *det = m->deterministic < 0 ? "-" : m->deterministic ? "yes" : "NO";
            if (m->has_winner)
                fprintf(out, "  %6lld  %-32s %10.4g %9.3g %8.3g %8s %-12s %5s %6d %6d %6d\n",
                        (long long)m->m, m->best_key, m->best_ms, m->gflops, m->gbps, speed,
                        db_decision_str(m->decision), det, m->measured, failed_count(m),
                        m->resumed);
            else
                fprintf(out, "  %6lld  %-32s %10s %9s %8s %8s %-12s %5s %6d %6d %6d\n",
                        (long long)m->m, "(no winner)", "-", "-", "-", "-", "-", det,
                        m->measured, failed_count(m), m->resumed);
        }
    }
    if (r->compile_only) {
        fprintf(out, "\ncompiled = stored with resources and no time; known = already in the "
                     "database\n");
        return;
    }
    fprintf(out, "\ncolumns: time = median of the winner; vs dflt = default config's median "
                 "over the winner's; decided = confirmed (faster than the default with "
                 "confidence), default_kept (the search's best rejected as noise), "
                 "default_best, or median (not confirmed); det = winner re-run "
                 "bit-identical; new = trials "
                 "measured now; known = already in the database (not re-measured)\n");
}
