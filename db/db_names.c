/* db_names.c: the stable names of the persisted enums (backends, trial
 * statuses, session statuses, lookup provenance, winner decisions). Names appear in exports
 * and CLI output; values are persisted; both are append only. */
#include <string.h>

#include "db.h"

static const char *const backend_names[DB_BACKEND_COUNT] = {
    [DB_BACKEND_CPU] = "cpu",
    [DB_BACKEND_EMU] = "emu",
    [DB_BACKEND_HIP] = "hip",
    [DB_BACKEND_CUDA] = "cuda",
};
_Static_assert(sizeof backend_names / sizeof backend_names[0] == DB_BACKEND_COUNT,
               "one name per backend");

static const char *const trial_names[DB_TRIAL_STATUS_COUNT] = {
    [DB_TRIAL_OK] = "ok",
    [DB_TRIAL_COMPILE_ERROR] = "compile_error",
    [DB_TRIAL_INVALID] = "invalid",
    [DB_TRIAL_WRONG_RESULT] = "wrong_result",
    [DB_TRIAL_CRASH] = "crash",
    [DB_TRIAL_TIMEOUT] = "timeout",
    [DB_TRIAL_SKIPPED] = "skipped",
    [DB_TRIAL_COMPILED] = "compiled",
};
_Static_assert(sizeof trial_names / sizeof trial_names[0] == DB_TRIAL_STATUS_COUNT,
               "one name per trial status");

static const char *const session_names[DB_SESSION_STATUS_COUNT] = {
    [DB_SESSION_RUNNING] = "running",
    [DB_SESSION_DONE] = "done",
    [DB_SESSION_INTERRUPTED] = "interrupted",
    [DB_SESSION_FAILED] = "failed",
};
_Static_assert(sizeof session_names / sizeof session_names[0] == DB_SESSION_STATUS_COUNT,
               "one name per session status");

static const char *const provenance_names[DB_PROVENANCE_COUNT] = {
    [DB_HIT_EXACT] = "exact",
    [DB_HIT_NEAREST] = "nearest",
    [DB_OTHER_DEVICE] = "other_device",
    [DB_STALE] = "stale",
    [DB_MISS] = "miss",
};
_Static_assert(sizeof provenance_names / sizeof provenance_names[0] == DB_PROVENANCE_COUNT,
               "one name per provenance");

static const char *const decision_names[DB_DECISION_COUNT] = {
    [DB_DECIDED_MEDIAN] = "median",
    [DB_DECIDED_CONFIRMED] = "confirmed",
    [DB_DECIDED_DEFAULT_KEPT] = "default_kept",
    [DB_DECIDED_DEFAULT_BEST] = "default_best",
};
_Static_assert(sizeof decision_names / sizeof decision_names[0] == DB_DECISION_COUNT,
               "one name per winner decision");

static int find_name(const char *const *names, int n, const char *s)
{
    if (!s)
        return -1;
    for (int i = 0; i < n; i++)
        if (names[i] && !strcmp(names[i], s))
            return i;
    return -1;
}

const char *db_backend_name(int backend)
{
    return backend >= 0 && backend < DB_BACKEND_COUNT ? backend_names[backend] : "unknown";
}

int db_backend_parse(const char *name) { return find_name(backend_names, DB_BACKEND_COUNT, name); }

const char *db_trial_status_str(db_trial_status s)
{
    return (unsigned)s < DB_TRIAL_STATUS_COUNT ? trial_names[s] : "unknown";
}

bool db_trial_status_parse(const char *s, db_trial_status *out)
{
    int i = find_name(trial_names, DB_TRIAL_STATUS_COUNT, s);
    if (i < 0)
        return false;
    *out = (db_trial_status)i;
    return true;
}

const char *db_session_status_str(db_session_status s)
{
    return (unsigned)s < DB_SESSION_STATUS_COUNT ? session_names[s] : "unknown";
}

const char *db_provenance_str(db_provenance p)
{
    return (unsigned)p < DB_PROVENANCE_COUNT ? provenance_names[p] : "unknown";
}

bool db_session_status_parse(const char *s, db_session_status *out)
{
    int i = find_name(session_names, DB_SESSION_STATUS_COUNT, s);
    if (i < 0)
        return false;
    *out = (db_session_status)i;
    return true;
}

bool db_provenance_parse(const char *s, db_provenance *out)
{
    int i = find_name(provenance_names, DB_PROVENANCE_COUNT, s);
    if (i < 0)
        return false;
    *out = (db_provenance)i;
    return true;
}

const char *db_decision_str(db_decision d)
{
    return (unsigned)d < DB_DECISION_COUNT ? decision_names[d] : "unknown";
}

bool db_decision_parse(const char *s, db_decision *out)
{
    int i = find_name(decision_names, DB_DECISION_COUNT, s);
    if (i < 0)
        return false;
    *out = (db_decision)i;
    return true;
}
