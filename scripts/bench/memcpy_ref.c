/*
 * memcpy_ref - the reference for the `burst` benchmark's snapshot: plain memcpy of a buffer into
 * another of the same size, no dlio-mpi code.
 *
 *   memcpy_ref [-j threads] [-b bytes] [-r repeats]
 *
 * Each of `threads` threads (as many as the ranks that snapshot at once) maps a source and a
 * destination of `bytes` (default 512 MiB), advised to huge pages as the snapshot buffer is, and
 * touches both before the clock; then, `repeats` times (default 5), all threads start together
 * and each copies its source into its destination in one memcpy.  Prints one line, the copy's
 * rate per thread (the slowest thread's time) of each repeat and of the best and the median:
 *
 *   threads=J bytes=B GiB_per_s_per_thread=X,Y,... best=X median=Y
 *
 * Build: cc -O2 -pthread -o memcpy_ref memcpy_ref.c
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef struct job {
    pthread_t tid;
    unsigned char *src, *dst;
    double seconds;
} job;

static size_t nbytes = (size_t)512 << 20;
static int repeats = 5;
static pthread_barrier_t start_line, end_line;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static unsigned char *touched(int value)
{
    unsigned char *p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                            -1, 0);
    if (p == MAP_FAILED) {
        perror("memcpy_ref: mmap");
        exit(1);
    }
    madvise(p, nbytes, MADV_HUGEPAGE);
    memset(p, value, nbytes);
    return p;
}

static void *run(void *arg)
{
    job *j = arg;
    j->src = touched(1);
    j->dst = touched(0);
    for (int r = 0; r < repeats; r++) {
        pthread_barrier_wait(&start_line);
        double t0 = now();
        memcpy(j->dst, j->src, nbytes);
        j->seconds = now() - t0;
        pthread_barrier_wait(&end_line);  /* main reads the times, then the next round */
        pthread_barrier_wait(&end_line);
    }
    return NULL;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int threads = 1, opt;
    while ((opt = getopt(argc, argv, "j:b:r:")) != -1) {
        switch (opt) {
        case 'j': threads = atoi(optarg); break;
        case 'b': nbytes = (size_t)atoll(optarg); break;
        case 'r': repeats = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: memcpy_ref [-j threads] [-b bytes] [-r repeats]\n");
            return 2;
        }
    }
    if (threads < 1 || repeats < 1 || nbytes == 0) {
        fprintf(stderr, "usage: memcpy_ref [-j threads] [-b bytes] [-r repeats]\n");
        return 2;
    }
    job *js = calloc((size_t)threads, sizeof *js);
    double *rates = calloc((size_t)repeats, sizeof *rates);
    pthread_barrier_init(&start_line, NULL, (unsigned)threads);
    pthread_barrier_init(&end_line, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++)
        pthread_create(&js[i].tid, NULL, run, &js[i]);
    printf("threads=%d bytes=%zu GiB_per_s_per_thread=", threads, nbytes);
    for (int r = 0; r < repeats; r++) {
        pthread_barrier_wait(&end_line);
        double slowest = 0;
        for (int i = 0; i < threads; i++)
            slowest = js[i].seconds > slowest ? js[i].seconds : slowest;
        rates[r] = (double)nbytes / 1073741824.0 / slowest;
        printf("%s%.3f", r ? "," : "", rates[r]);
        pthread_barrier_wait(&end_line);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(js[i].tid, NULL);
    qsort(rates, (size_t)repeats, sizeof *rates, by_value);
    printf(" best=%.3f median=%.3f\n", rates[repeats - 1], rates[repeats / 2]);
    return 0;
}
