/* dio_time.c - the monotonic clock and absolute-deadline sleeps. */
#define _GNU_SOURCE
#include <errno.h>
#include <time.h>

#include "dio.h"

int64_t dio_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t dio_sleep_until_ns(int64_t deadline_ns)
{
    struct timespec ts;
    int64_t now;
    if (deadline_ns < 0)
        deadline_ns = 0;
    ts.tv_sec = (time_t)(deadline_ns / 1000000000);
    ts.tv_nsec = (long)(deadline_ns % 1000000000);
    for (;;) {
        int rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        now = dio_now_ns();
        if (now >= deadline_ns)
            return now;
        if (rc != 0 && rc != EINTR)  /* cannot happen with valid arguments; do not spin */
            return now;
    }
}
