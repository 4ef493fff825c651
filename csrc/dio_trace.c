/*
 * dio_trace.c - read-request events of output.trace as Chrome trace-event JSON.
 *
 * A traced epoch holds one event per read request; formatted in Python they cost ~1.2 us
 * each, more than the page-cache read they describe, so the text is made here: plain digit
 * loops, no printf, straight into the caller's buffer.
 */
#include <string.h>

#include "dio.h"

static char *put(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

#define PUT(p, lit) put((p), (lit), sizeof(lit) - 1)

static char *put_int(char *p, int64_t v)
{
    char digits[24];
    int n = 0;
    uint64_t u;

    if (v < 0) {
        *p++ = '-';
        u = (uint64_t)0 - (uint64_t)v;
    } else {
        u = (uint64_t)v;
    }
    do {
        digits[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    while (n)
        *p++ = digits[--n];
    return p;
}

/* ns as microseconds with three decimals (exact: Chrome's unit is the us). */
static char *put_us(char *p, int64_t ns)
{
    uint64_t u;

    if (ns < 0) {
        *p++ = '-';
        u = (uint64_t)0 - (uint64_t)ns;
    } else {
        u = (uint64_t)ns;
    }
    p = put_int(p, (int64_t)(u / 1000));
    *p++ = '.';
    *p++ = (char)('0' + u / 100 % 10);
    *p++ = (char)('0' + u / 10 % 10);
    *p++ = (char)('0' + u % 10);
    return p;
}

size_t dio_trace_reads(char *buf, size_t cap, const dio_trace_reads_in *in, size_t first,
                       size_t *next)
{
    char *p = buf;
    size_t i;

    for (i = first; i < in->n; i++) {
        int64_t f = in->file[i];
        size_t path_len = (size_t)(in->path_off[f + 1] - in->path_off[f]);

        /* 7 integers and 2 times of at most 21 characters, plus the fixed text */
        if ((size_t)(p - buf) + in->head_len + path_len + 9 * 22 + 128 > cap)
            break;
        p = put(p, in->head, in->head_len);
        p = put_int(p, in->tid[i]);
        p = PUT(p, ",\"ts\":");
        p = put_us(p, in->start_ns[i]);
        p = PUT(p, ",\"dur\":");
        p = put_us(p, in->lat_ns[i] > 0 ? in->lat_ns[i] : 0);
        p = PUT(p, ",\"args\":{\"file\":");
        p = put(p, in->paths + in->path_off[f], path_len);
        p = PUT(p, ",\"offset\":");
        p = put_int(p, in->offset[i]);
        p = PUT(p, ",\"length\":");
        p = put_int(p, in->length[i]);
        p = PUT(p, ",\"bytes\":");
        p = put_int(p, in->nread[i]);
        p = PUT(p, ",\"latency_ns\":");
        p = put_int(p, in->lat_ns[i]);
        p = PUT(p, ",\"epoch\":");
        p = put_int(p, in->epoch);
        p = PUT(p, ",\"step\":");
        p = put_int(p, in->step[i]);
        p = PUT(p, "}}");
    }
    *next = i;
    return (size_t)(p - buf);
}
