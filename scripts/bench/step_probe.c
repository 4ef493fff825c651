/*
 * step_probe - the floor of the per-step cost of an emulated training step on this machine: a C
 * loop with no I/O and no Python.  Every rank waits until a deadline COMPUTE_NS after the step
 * started (clock_nanosleep with 1 ns timer slack until SPIN_NS before it, then polling the
 * clock), then enters MPI_Barrier.  Prints AU = compute / wall time and the overhead per step.
 *
 *   mpicc -O2 -o step_probe step_probe.c
 *   mpiexec -n 2 ./step_probe COMPUTE_NS STEPS SPIN_NS    (SPIN_NS >= COMPUTE_NS: busy-wait)
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

static int64_t clock_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int main(int argc, char **argv)
{
    int rank, steps;
    int64_t compute, spin, start, late = 0;
    MPI_Init(&argc, &argv);
    if (argc != 4) {
        fprintf(stderr, "usage: %s COMPUTE_NS STEPS SPIN_NS\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    compute = atoll(argv[1]);
    steps = atoi(argv[2]);
    spin = atoll(argv[3]);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0);
    MPI_Barrier(MPI_COMM_WORLD);
    start = clock_ns();
    for (int s = 0; s < steps; s++) {
        int64_t deadline = clock_ns() + compute, wake = deadline - spin, now;
        if (wake > clock_ns()) {
            struct timespec ts = {(time_t)(wake / 1000000000), (long)(wake % 1000000000)};
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0)
                ;
        }
        while ((now = clock_ns()) < deadline)
            ;
        late += now - deadline;
        MPI_Barrier(MPI_COMM_WORLD);
    }
    int64_t total = clock_ns() - start;
    if (rank == 0)
        printf("compute_us=%.1f spin_us=%.1f au_percentage=%.3f overshoot_us=%.2f "
               "overhead_us=%.2f\n", compute / 1e3, spin / 1e3,
               100.0 * (double)compute * steps / (double)total, late / 1e3 / steps,
               ((double)total - (double)compute * steps) / 1e3 / steps);
    MPI_Finalize();
    return 0;
}
