/*
 * dio_signal.c - a stop asked for by SIGINT or SIGTERM, recorded for the step loop.
 *
 * A batch system's time limit (SIGTERM, then SIGKILL after a grace period) or a user's Ctrl-C
 * (mpiexec forwards SIGINT to every rank) should end the job at the next step with the results
 * so far, not kill it mid-write.  The step loop runs in C for whole epochs, where Python's
 * handlers would not run, so the handler lives here: it records the signal, and the loop's
 * per-step allreduce carries it to every rank (dio_steps.c).  Every other loop that moves
 * bytes or waits (checkpoint writes and reads, copies, a paced snapshot) looks at it between
 * two calls (dio_stopped), so that no wait outlasts one call after the signal.
 *
 * A backstop: a process that has not ended DIO_STOP_GRACE_S seconds after the first signal
 * (a rank stuck in a collective whose peer died, a file system that stopped answering) ends
 * by the signal's default action, so that a single SIGTERM (`timeout`, a batch system
 * without a KILL) always ends the job.  A thread started with the handlers waits for the
 * signal on a semaphore, which a handler may post.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dio_internal.h"

static volatile sig_atomic_t stop_signal;
static sem_t stop_posted;
static int backstop_started;

static void on_stop(int sig)
{
    if (stop_signal) { /* asked twice: stop now */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    stop_signal = sig;
    if (backstop_started)
        sem_post(&stop_posted); /* async-signal-safe */
}

static void *backstop(void *unused)
{
    struct timespec grace = {DIO_STOP_GRACE_S, 0};
    (void)unused;
    while (sem_wait(&stop_posted) != 0 && errno == EINTR)
        ;
    while (nanosleep(&grace, &grace) != 0 && errno == EINTR)
        ;
    signal(stop_signal, SIG_DFL);
    kill(getpid(), stop_signal); /* the process, not this thread alone */
    return NULL;
}

static int start_backstop(void)
{
    pthread_t thread;
    pthread_attr_t attr;
    sigset_t all, old;
    int rc;
    if (backstop_started)
        return 0;
    if (sem_init(&stop_posted, 0, 0) != 0)
        return -errno;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    sigfillset(&all); /* the signals go to the process's other threads, never to this one */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&thread, &attr, backstop, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0)
        return -rc;
    backstop_started = 1;
    return 0;
}

int dio_stop_on_signals(void)
{
    struct sigaction sa;
    int rc = start_backstop();
    if (rc < 0)
        return rc;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESTART; /* reads in flight go on; the loops look at the flag per call */
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0)
        return -errno;
    return 0;
}

int dio_stop_signal(void)
{
    return stop_signal;
}

int dio_stopped(dio_error *err, const char *path)
{
    int sig = stop_signal;
    if (!sig)
        return 0;
    return dio_fail(err, ECANCELED, path, "stopped by signal %d", sig);
}
