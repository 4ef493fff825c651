/* dio_time.c - the monotonic clock and absolute-deadline sleeps precise to a few microseconds. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "dio.h"

int64_t dio_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

int64_t dio_sleep_until_ns(int64_t deadline_ns, int64_t spin_ns)
{
    int64_t now = dio_now_ns(), wake = deadline_ns - (spin_ns > 0 ? spin_ns : 0);
    /* Sleep through the part the timer can be trusted with ... */
    while (now < wake) {
        struct timespec ts = {(time_t)(wake / 1000000000), (long)(wake % 1000000000)};
        int rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        now = dio_now_ns();
        if (rc != 0 && rc != EINTR)  /* cannot happen with valid arguments */
            break;
    }
    /* ... and poll the clock for the rest: a wake-up from the timer can come late by its
     * slack and the scheduler's (and a VM's) latency, tens to hundreds of microseconds. */
    while (now < deadline_ns) {
        cpu_relax();
        now = dio_now_ns();
    }
    return now;
}

#define DIO_STOP_POLL_NS 100000000LL /* a long wait looks for a stop every 0.1 s */

int dio_nap_until_ns(int64_t deadline_ns)
{
    int64_t now = dio_now_ns();
    while (now < deadline_ns) {
        int64_t until = deadline_ns - now > DIO_STOP_POLL_NS ? now + DIO_STOP_POLL_NS
                                                             : deadline_ns;
        struct timespec ts = {(time_t)(until / 1000000000), (long)(until % 1000000000)};
        int rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        now = dio_now_ns();
        if (rc != 0 && rc != EINTR)  /* cannot happen with valid arguments */
            break;
        if (dio_stop_signal())
            return -ECANCELED;
    }
    return 0;
}

#define BURN_TABLE 512   /* uint64 entries the burn's arithmetic writes to (4 KiB) */
#define BURN_ROUND 2048  /* iterations between two reads of the thread's CPU clock (~µs) */

static int64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t dio_burn_cpu_ns(int64_t cpu_ns)
{
    static __thread uint64_t table[BURN_TABLE]; /* its stores keep the work from vanishing */
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)&x;
    int64_t until;
    if (cpu_ns <= 0)
        return dio_now_ns();
    until = thread_cpu_ns() + cpu_ns;
    do {
        for (int i = 0; i < BURN_ROUND; i++) { /* xorshift64 */
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            table[x % BURN_TABLE] += x;
        }
    } while (thread_cpu_ns() < until);
    return dio_now_ns();
}

int dio_set_timer_slack_ns(uint64_t slack_ns)
{
    if (prctl(PR_SET_TIMERSLACK, (unsigned long)(slack_ns > 0 ? slack_ns : 1), 0, 0, 0) != 0)
        return -errno;
    return 0;
}

void dio_pacer_init(dio_pacer *p, int64_t fixed_spin_ns)
{
    memset(p, 0, sizeof *p);
    p->fixed_spin_ns = fixed_spin_ns;
    p->spin_ns = fixed_spin_ns >= 0 ? fixed_spin_ns : DIO_PACER_FIRST_SPIN;
}

/* 1.25 x the second largest recent lateness + 5 us: ignores one outlier (a vCPU descheduled
 * for milliseconds) in the window, covers the rest. */
static int64_t adapted_spin(const dio_pacer *p)
{
    int64_t first = 0, second = 0, spin;
    for (int i = 0; i < p->nlate; i++) {
        int64_t v = p->late_ns[i];
        if (v > first) {
            second = first;
            first = v;
        } else if (v > second) {
            second = v;
        }
    }
    spin = second + second / 4 + 5000;
    return spin < DIO_PACER_MIN_SPIN ? DIO_PACER_MIN_SPIN
           : spin > DIO_PACER_MAX_SPIN ? DIO_PACER_MAX_SPIN : spin;
}


int64_t dio_pacer_wait(dio_pacer *p, int64_t deadline_ns)
{
    int64_t now = dio_now_ns(), wake = deadline_ns - p->spin_ns, polled_from;
    p->waits++;
    if (now < wake) {
        while (now < wake) {
            /* in naps of at most DIO_STOP_POLL_NS: a SIGINT/SIGTERM (handled on whichever
             * thread) ends the compute there, so that the step's synchronisation carries the
             * stop to every rank within a nap, not after a compute step of hours */
            int64_t until = wake - now > DIO_STOP_POLL_NS ? now + DIO_STOP_POLL_NS : wake;
            struct timespec ts = {(time_t)(until / 1000000000), (long)(until % 1000000000)};
            int rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            now = dio_now_ns();
            if (rc != 0 && rc != EINTR)
                break;
            if (until < wake && dio_stop_signal())
                return now;
        }
        if (p->fixed_spin_ns < 0) {
            p->late_ns[p->next] = now - wake;
            p->next = (p->next + 1) % DIO_PACER_WINDOW;
            if (p->nlate < DIO_PACER_WINDOW)
                p->nlate++;
            p->spin_ns = adapted_spin(p);
        }
    }
    polled_from = now;
    while (now < deadline_ns) {
        cpu_relax();
        now = dio_now_ns();
    }
    p->spun_ns += now - polled_from;
    return now;
}
