/*
 * dio_engine_watch.c - the watchdog: each reader publishes what it has in flight, a waiting
 * thread reports (or fails with) the oldest one past reader.io_watchdog_seconds; and the
 * test hook (DLIO_MPI_TEST_STALL) that stalls one open or read.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dio_engine_internal.h"

/* What the slot's reader has in flight: 1 with *since, *file, *op; 0 if nothing (or if it
 * changed while we looked: then it was not stuck). */
static int watch_look(watch_slot *s, int64_t *since, int64_t *file, int *op)
{
    *since = __atomic_load_n(&s->since, __ATOMIC_ACQUIRE);
    *file = __atomic_load_n(&s->file, __ATOMIC_RELAXED);
    *op = __atomic_load_n(&s->op, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return *since != 0 && __atomic_load_n(&s->since, __ATOMIC_RELAXED) == *since;
}

/* Report an open or read of `file` that began at `since` and is still in flight at `now`: on
 * stderr (one line, naming who waits and the file), or with watchdog_abort, when the caller
 * may fail, as the failure (-ETIMEDOUT) it returns. */
static int report_stuck(dio_engine *e, int op, int64_t file, int64_t since, int64_t now,
                        int may_fail, dio_error *err)
{
    char buf[PATH_MAX_LEN], what[PATH_MAX_LEN + 64], line[PATH_MAX_LEN + 256];
    const char *path = eng_file_path(&e->files, file, buf);
    double limit = e->cfg.watchdog_ns / 1e9;
    ssize_t said;
    int n;
    snprintf(what, sizeof what, "%s of %s has waited %.1f s",
             op == WATCH_OPEN ? "an open" : "a read", path, (now - since) / 1e9);
    if (e->cfg.watchdog_abort && may_fail)
        return dio_fail(err, ETIMEDOUT, path, "watchdog: %s (reader.io_watchdog_seconds=%g; "
                        "reader.io_watchdog_abort: true ends the job)", what, limit);
    n = snprintf(line, sizeof line,
                 "dlio-mpi: %s%swatchdog: %s (reader.io_watchdog_seconds=%g)\n", e->who,
                 e->who[0] ? ": " : "", what, limit);
    /* one write, so that lines of other threads and ranks do not cut into it (if stderr is
     * gone, there is nowhere to say it) */
    said = write(STDERR_FILENO, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
    (void)said;
    return 0;
}

/* Under the lock: report each open or read in flight for watchdog_ns that was not reported yet
 * (report_stuck); *wake gets when the next unreported one will reach the limit (now + limit
 * if none is in flight). */
static int watch_readers(dio_engine *e, int may_fail, int64_t *wake, dio_error *err)
{
    int64_t now = dio_now_ns(), limit = e->cfg.watchdog_ns;
    *wake = now + limit;
    for (int i = 0; i < e->nworkers; i++) {
        watch_slot *slot = &e->workers[i].watch;
        int64_t since, file;
        int op, rc;
        if (!watch_look(slot, &since, &file, &op) || since == slot->reported)
            continue;
        if (now - since < limit) {
            if (since + limit < *wake)
                *wake = since + limit;
            continue;
        }
        slot->reported = since;
        if ((rc = report_stuck(e, op, file, since, now, may_fail, err)) < 0)
            return rc;
    }
    return 0;
}

/* Under the lock: wait for the readers' progress (done_cv); with the watchdog on, only until
 * the next open or read in flight reaches its limit, which is then reported (or, may_fail and
 * watchdog_abort, returned as -ETIMEDOUT).  Returns 0 after a wake-up, spurious ones included:
 * callers wait in a loop on their condition. */
int eng_wait_readers(dio_engine *e, int may_fail, dio_error *err)
{
    struct timespec ts;
    int64_t wake;
    int rc;
    if (e->cfg.watchdog_ns <= 0 || e->nworkers == 0) {
        pthread_cond_wait(&e->done_cv, &e->mu);
        return 0;
    }
    if ((rc = watch_readers(e, may_fail, &wake, err)) < 0)
        return rc;
    ts.tv_sec = (time_t)(wake / 1000000000);
    ts.tv_nsec = (long)(wake % 1000000000);
    pthread_cond_timedwait(&e->done_cv, &e->mu, &ts);
    return 0;
}

/* The test hook: sleep if this is the armed stall's first open or read of its file. */
void eng_stall_if_chosen(dio_engine *e, worker *w, int op, int64_t file)
{
    const char *path;
    size_t n, k = strlen(e->stall_suffix);
    if (op != e->stall_op || !__atomic_load_n(&e->stall_armed, __ATOMIC_RELAXED))
        return;
    path = eng_file_path(&e->files, file, w->path);
    n = strlen(path);
    if (n >= k && strcmp(path + n - k, e->stall_suffix) == 0 &&
        __atomic_exchange_n(&e->stall_armed, 0, __ATOMIC_ACQ_REL))
        dio_sleep_until_ns(dio_now_ns() + e->stall_ns, 0);
}

/* Arm the test hook from STALL_ENV (<open|read>:<seconds>:<suffix>), if set and well formed. */
void eng_arm_stall(dio_engine *e)
{
    const char *spec = getenv(STALL_ENV);
    char *end;
    double seconds;
    if (!spec)
        return;
    if (strncmp(spec, "open:", 5) == 0)
        e->stall_op = WATCH_OPEN;
    else if (strncmp(spec, "read:", 5) == 0)
        e->stall_op = WATCH_READ;
    else
        return;
    seconds = strtod(spec + 5, &end);
    if (end == spec + 5 || *end != ':' || !(seconds > 0))
        return;
    if (!(e->stall_suffix = strdup(end + 1)))
        return;
    e->stall_ns = (int64_t)(seconds * 1e9);
    e->stall_armed = 1;
}
