/*
 * dio_signal.c - a stop asked for by SIGINT or SIGTERM, recorded for the step loop.
 *
 * A batch system's time limit (SIGTERM, then SIGKILL after a grace period) or a user's Ctrl-C
 * (mpiexec forwards SIGINT to every rank) should end the job at the next step with the results
 * so far, not kill it mid-write.  The step loop runs in C for whole epochs, where Python's
 * handlers would not run, so the handler lives here: it records the signal, and the loop's
 * per-step allreduce carries it to every rank (dio_steps.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <string.h>

#include "dio_internal.h"

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig)
{
    if (stop_signal) { /* asked twice: stop now */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    stop_signal = sig;
}

int dio_stop_on_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESTART; /* reads in flight go on; the loop looks at the flag per step */
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0)
        return -errno;
    return 0;
}

int dio_stop_signal(void)
{
    return stop_signal;
}
