/* tune_pool.c: the tuner's compile pool: a few threads that run compile
 * tasks in submission order while the tuner's thread feeds the measurement
 * worker (see tune_impl.h). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tune_impl.h"

typedef struct task {
    tune_task_fn fn;
    void *arg;
    bool *done;
    struct task *next;
} task;

struct tune_pool {
    pthread_mutex_t mu;
    pthread_cond_t work;   /* tasks queued or shutting down */
    pthread_cond_t done;   /* a task finished */
    task *head, *tail;
    int running;
    bool quit;
    int n_threads;
    pthread_t *threads;
};

static void *thread_main(void *arg)
{
    tune_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->quit)
            pthread_cond_wait(&p->work, &p->mu);
        if (!p->head)
            break;
        task *t = p->head;
        p->head = t->next;
        if (!p->head)
            p->tail = NULL;
        p->running++;
        pthread_mutex_unlock(&p->mu);
        t->fn(t->arg);
        pthread_mutex_lock(&p->mu);
        p->running--;
        *t->done = true;
        free(t);
        pthread_cond_broadcast(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

mt_status tune_pool_create(int threads, tune_pool **out, mt_err *err)
{
    *out = NULL;
    if (threads < 1)
        threads = 1;
    tune_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->threads = calloc((size_t)threads, sizeof *p->threads))) {
        free(p);
        return mt_fail(err, MT_E_NOMEM, "compile pool of %d threads", threads);
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 0; i < threads; i++) {
        int rc = pthread_create(&p->threads[i], NULL, thread_main, p);
        if (rc) {
            tune_pool_destroy(p);
            return mt_fail(err, MT_E_NOMEM, "compile pool: pthread_create: %s",
                           strerror(rc));
        }
        p->n_threads++;
    }
    *out = p;
    return MT_OK;
}

static void drop_queued(tune_pool *p)
{
    while (p->head) {
        task *t = p->head;
        p->head = t->next;
        free(t);
    }
    p->tail = NULL;
}

void tune_pool_destroy(tune_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    drop_queued(p);
    p->quit = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

mt_status tune_pool_submit(tune_pool *p, tune_task_fn fn, void *arg, bool *done, mt_err *err)
{
    task *t = malloc(sizeof *t);
    if (!t)
        return mt_fail(err, MT_E_NOMEM, "compile task");
    *t = (task){fn, arg, done, NULL};
    *done = false;
    pthread_mutex_lock(&p->mu);
    if (p->tail)
        p->tail->next = t;
    else
        p->head = t;
    p->tail = t;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
    return MT_OK;
}

/* Waits on the done condition in slices, so a stop request (set by a
 * signal handler, which cannot signal a condition) is seen within 100 ms. */
static void wait_slice(tune_pool *p)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&p->done, &p->mu, &ts);
}

bool tune_pool_wait(tune_pool *p, const bool *done, volatile sig_atomic_t *stop)
{
    pthread_mutex_lock(&p->mu);
    while (!*done && !tune_stopped(stop))
        wait_slice(p);
    bool ok = *done;
    pthread_mutex_unlock(&p->mu);
    return ok;
}

bool tune_pool_wait_idle(tune_pool *p, volatile sig_atomic_t *stop)
{
    pthread_mutex_lock(&p->mu);
    while ((p->head || p->running) && !tune_stopped(stop))
        wait_slice(p);
    bool ok = !p->head && !p->running;
    pthread_mutex_unlock(&p->mu);
    return ok;
}

void tune_pool_cancel(tune_pool *p)
{
    pthread_mutex_lock(&p->mu);
    drop_queued(p);
    while (p->running)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
