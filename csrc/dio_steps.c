/*
 * dio_steps.c - the step loop of an emulated training epoch, in C: take the batch, wait the
 * compute time (the pacer), synchronise with the other ranks, stamp each phase.  No Python
 * runs between a compute deadline and the next compute: at sub-millisecond steps the
 * interpreter's and mpi4py's cold paths after a sleep cost several points of AU.
 *
 * The synchronisation is the MPI library's own (a persistent barrier started and tested
 * through function pointers the caller looked up), so this file needs no MPI headers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <string.h>

#include "dio_internal.h"

#define POLL_FIRST_NS 20000 /* poll flat out this long first: peers that computed in step
                            * arrive within microseconds, and a yield can hand the core to a
                            * reader for a whole chunk */

#define NAP_FIRST_NS 10000 /* the first nap; each next one doubles, up to the caller's nap_ns */

/* Poll the started barrier: flat out for POLL_FIRST_NS, yielding the core between polls up to
 * spin_ns, then napping between polls, each nap twice the last up to nap_ns: a rank whose peers
 * are stalled on storage soon wakes rarely, leaving the cores to the readers that lag, while
 * one whose peers arrive within a nap or two wakes promptly. */
static int sync_steps(const dio_step_sync *s, int failed, dio_error *err)
{
    char status[256]; /* room for any MPI_Status */
    int flag = 0, rc;
    int64_t spin_until, poll_until, nap = NAP_FIRST_NS < s->nap_ns ? NAP_FIRST_NS : s->nap_ns;
    if (s->stop_out)
        *s->stop_out = failed ? DIO_STEP_FAILED : dio_stop_signal();
    if ((rc = s->start(s->request)) != 0)
        return dio_fail(err, EIO, "", "step barrier: MPI_Start failed (%d)", rc);
    if ((rc = s->test(s->request, &flag, status)) != 0)
        return dio_fail(err, EIO, "", "step barrier: MPI_Test failed (%d)", rc);
    poll_until = dio_now_ns() + (s->spin_ns < POLL_FIRST_NS ? s->spin_ns : POLL_FIRST_NS);
    spin_until = poll_until - POLL_FIRST_NS + s->spin_ns;
    while (!flag) {
        int64_t now = dio_now_ns();
        if (now < poll_until)
            ;
        else if (now < spin_until)
            sched_yield();
        else {
            dio_sleep_until_ns(now + nap, 0);
            nap = 2 * nap < s->nap_ns ? 2 * nap : s->nap_ns;
        }
        if ((rc = s->test(s->request, &flag, status)) != 0)
            return dio_fail(err, EIO, "", "step barrier: MPI_Test failed (%d)", rc);
    }
    return 0;
}

int dio_step_sync_once(const dio_step_sync *sync, dio_error *err)
{
    dio_clear_error(err);
    if (!sync || !sync->request)
        return dio_fail(err, EINVAL, "", "step sync: no request");
    return sync_steps(sync, 0, err);
}

/* A step's batch failed on this rank with `err` (rc < 0): where the steps are agreed by an
 * allreduce, the rank takes part in the step's one with DIO_STEP_FAILED, so that the others, on
 * their way to it, learn of the failure there rather than wait for this rank for ever.  Not a
 * read that timed out (the watchdog's abort): one still stuck would hold the process's end
 * back (its reader thread is joined), so the job is aborted instead. */
static int64_t fail_step(const dio_step_sync *sync, int64_t rc, dio_error *err)
{
    dio_error own = *err;
    if (!(sync && sync->request && sync->stop_out && sync->stop_in) || own.code == ETIMEDOUT)
        return rc;
    if (sync_steps(sync, 1, err) < 0)
        return -1; /* the allreduce failed: no agreement, its own error */
    *err = own;
    return rc;
}

int64_t dio_engine_run_steps(dio_engine *e, dio_pacer *pacer, const dio_step_sync *sync,
                             const dio_step_plan *steps, dio_step_record *out, dio_error *err)
{
    int64_t start;
    dio_clear_error(err);
    if (!e || !pacer || !steps || steps->nsteps < 0 ||
        (steps->nsteps > 0 && (!steps->compute_ns || !out)))
        return dio_fail(err, EINVAL, "", "run_steps: invalid arguments");
    start = steps->start_ns;
    for (int64_t i = 0; i < steps->nsteps; i++) {
        dio_step_record *r = &out[i];
        int64_t compute = steps->compute_ns[i], began;
        dio_batch b;
        int rc = dio_engine_next_polling(e, &b, DIO_NEXT_DEFER_WAKE, pacer->batch_poll_ns,
                                         &pacer->batch_polled_ns, err);
        if (rc <= 0)
            return fail_step(sync, rc < 0 ? rc : dio_fail(err, EIO, "", "run_steps: the "
                                                            "engine has %lld batches, the plan "
                                                            "%lld", (long long)i,
                                                            (long long)steps->nsteps), err);
        r->got = began = dio_now_ns();
        dio_engine_wake(e); /* inside the step's compute time */
        if (steps->host_cpu_ns && steps->host_cpu_ns[i] > 0) /* taking the batch: not compute */
            began = dio_burn_cpu_ns(steps->host_cpu_ns[i]);
        if (steps->host_wait_ns && steps->host_wait_ns[i] > 0)
            began = dio_sleep_until_ns(began + steps->host_wait_ns[i], 0);
        r->deadline = began + compute;
        r->computed = compute > 0 ? dio_pacer_wait(pacer, r->deadline) : began;
        if (sync && sync->request && (rc = sync_steps(sync, 0, err)) < 0)
            return rc;
        r->synced = dio_now_ns();
        r->start = start;
        r->ready = b.ready_ns;
        r->bytes = b.bytes_read;
        r->ops = b.read_ops;
        start = r->synced; /* the next wait starts where this step ended */
        if (sync && sync->stop_in && *sync->stop_in >= DIO_STEP_FAILED)
            return dio_fail(err, ECONNABORTED, "", "step %lld: another rank's batch failed",
                            (long long)i + 1);
        if (sync && sync->stop_in && *sync->stop_in)
            return i + 1; /* every rank learnt the same stop request in this step */
        if (!(sync && sync->request) && dio_stop_signal())
            return i + 1; /* no synchronisation (evaluation): the caller agrees afterwards */
    }
    return steps->nsteps;
}
