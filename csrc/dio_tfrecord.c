/*
 * dio_tfrecord.c - TFRecord files of equal records, written natively.
 *
 * A TFRecord file is a sequence of records, each framed as
 *     uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes |
 *     length bytes of data          | uint32 masked CRC-32C of the data
 * with mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2^32), both CRCs stored
 * little-endian.  Here every record of a file has the same framing: the caller gives the
 * constant bytes before the payload (`head`: the 12 bytes of length and its CRC, then the
 * data up to the payload) and after it (`tail`: the rest of the data), and the core fills the
 * payload of record r with the bytes [start + r*payload_len, start + (r+1)*payload_len) of the
 * seed's payload stream (dio_fill_random's), then appends the data's masked CRC.
 * Records go through one reused buffer of `chunk` bytes, written with pwrite when full, so a
 * record may be larger than the buffer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dio_internal.h"

#define TFRECORD_HEADER 12 /* uint64 length + uint32 masked CRC of it */
#define DEFAULT_CHUNK ((size_t)8 << 20)

uint32_t dio_crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* Bytes of a file written through one buffer: filled in place, flushed when full. */
typedef struct writer {
    unsigned char *buf;
    size_t cap, used;
    int fd;
    int64_t at; /* file offset of buf[0] */
    const char *path;
    dio_error *err;
} writer;

static int flush(writer *w)
{
    int rc = w->used ? dio_pwrite_all(w->fd, w->buf, w->used, w->at, w->path, w->err) : 0;
    w->at += (int64_t)w->used;
    w->used = 0;
    return rc;
}

/* Room for at least one byte (flushing a full buffer first): how much, at buf + used. */
static int room(writer *w, size_t *n)
{
    if (w->used == w->cap) {
        int rc = flush(w);
        if (rc < 0)
            return rc;
    }
    *n = w->cap - w->used;
    return 0;
}

/* Copy n bytes into the file; their CRC-32C continues *crc when crc is not NULL. */
static int put(writer *w, const void *src, size_t n, uint32_t *crc)
{
    const unsigned char *p = (const unsigned char *)src;
    while (n > 0) {
        size_t k;
        int rc = room(w, &k);
        if (rc < 0)
            return rc;
        if (k > n)
            k = n;
        memcpy(w->buf + w->used, p, k);
        if (crc)
            *crc = dio_crc32c(*crc, p, k);
        w->used += k;
        p += k;
        n -= k;
    }
    return 0;
}

/* The next n bytes of the payload stream into the file, their CRC-32C continuing *crc (summed
 * right after being made, while they are in the cache). */
static int put_payload(writer *w, dio_stream *st, uint64_t n, uint32_t *crc)
{
    while (n > 0) {
        size_t k;
        int rc = room(w, &k);
        if (rc < 0)
            return rc;
        if (k > n)
            k = (size_t)n;
        dio_stream_fill(st, w->buf + w->used, k);
        *crc = dio_crc32c(*crc, w->buf + w->used, k);
        w->used += k;
        n -= k;
    }
    return 0;
}

static uint64_t load_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int dio_write_tfrecords(int fd, int64_t offset, const void *head, size_t head_len,
                        const void *tail, size_t tail_len, uint64_t payload_len, int64_t count,
                        uint64_t seed, uint64_t start, size_t chunk, const char *path,
                        dio_error *err)
{
    const unsigned char *h = (const unsigned char *)head;
    writer w = {0};
    dio_stream st;
    uint32_t head_crc;
    uint64_t record;
    int rc = 0;
    if (!path)
        path = "";
    dio_clear_error(err);
    if (head_len < TFRECORD_HEADER || payload_len > (uint64_t)INT64_MAX / 2 ||
        head_len + tail_len > (size_t)INT32_MAX)
        return dio_fail(err, EINVAL, path, "write_tfrecords %s: invalid record (head %zu, "
                        "payload %llu, tail %zu bytes)", path, head_len,
                        (unsigned long long)payload_len, tail_len);
    record = head_len + payload_len + tail_len + 4;
    if (load_le64(h) != record - TFRECORD_HEADER - 4)
        return dio_fail(err, EINVAL, path, "write_tfrecords %s: the head's length field says "
                        "%llu data bytes where head, payload and tail make %llu", path,
                        (unsigned long long)load_le64(h),
                        (unsigned long long)(record - TFRECORD_HEADER - 4));
    if (offset < 0 || count < 0 ||
        (count > 0 && record > (uint64_t)(INT64_MAX - offset) / (uint64_t)count))
        return dio_fail(err, EINVAL, path, "write_tfrecords %s: invalid extent (offset %lld, "
                        "%lld records of %llu bytes)", path, (long long)offset,
                        (long long)count, (unsigned long long)record);
    if (count == 0)
        return 0;
    if (chunk == 0)
        chunk = DEFAULT_CHUNK;
    if (record * (uint64_t)count < chunk)
        chunk = (size_t)(record * (uint64_t)count);
    if (posix_memalign((void **)&w.buf, 4096, chunk) != 0)
        return dio_fail(err, ENOMEM, path, "write_tfrecords %s: cannot allocate %zu bytes",
                        path, chunk);
    w.cap = chunk;
    w.fd = fd;
    w.at = offset;
    w.path = path;
    w.err = err;
    head_crc = dio_crc32c(0, h + TFRECORD_HEADER, head_len - TFRECORD_HEADER);
    dio_stream_seek(&st, seed, start);
    for (int64_t r = 0; r < count && rc == 0; r++) {
        uint32_t crc = head_crc;
        unsigned char trailer[4];
        rc = put(&w, h, head_len, NULL);
        if (rc == 0)
            rc = put_payload(&w, &st, payload_len, &crc);
        if (rc == 0)
            rc = put(&w, tail, tail_len, &crc);
        if (rc == 0) {
            uint32_t masked = dio_crc32c_mask(crc);
            for (int i = 0; i < 4; i++)
                trailer[i] = (unsigned char)(masked >> (8 * i));
            rc = put(&w, trailer, 4, NULL);
        }
    }
    if (rc == 0)
        rc = flush(&w);
    free(w.buf);
    return rc;
}
