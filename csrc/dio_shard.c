/*
 * dio_shard.c - checkpoint shards: a rank's bytes streamed to or from a file through one
 * reused aligned buffer, in large calls, optionally with O_DIRECT and a final fsync.
 *
 * Block k of the shard of `seed` (chunk bytes from shard offset k * chunk) is the first chunk
 * bytes of the payload stream of seed with its first 16 bytes replaced by the stamp
 * (seed, k) in little-endian: every block differs from the others, the buffer is filled
 * once, and a restore can tell a block's bytes from any other's without keeping the shard.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <emmintrin.h>
#endif

#include "dio_internal.h"

#define STAMP_BYTES 16
#define DEFAULT_CHUNK ((size_t)64 << 20)
#define HUGE_ALIGN ((size_t)2 << 20)

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void stamp(unsigned char *block, size_t n, uint64_t seed, uint64_t k)
{
    unsigned char s[STAMP_BYTES];
    put_le64(s, seed);
    put_le64(s + 8, k);
    memcpy(block, s, n < STAMP_BYTES ? n : STAMP_BYTES);
}

void dio_shard_block(void *buf, size_t n, uint64_t seed, uint64_t block)
{
    dio_fill_random(buf, n, seed);
    stamp(buf, n, seed, block);
}

/* chunk bytes, 2 MiB-aligned, advised to huge pages (fewer pages to pin for O_DIRECT). */
static void *shard_buffer(size_t chunk)
{
    void *p = NULL;
    size_t size = (chunk + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN;
    if (posix_memalign(&p, HUGE_ALIGN, size) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}

size_t dio_shard_chunk(size_t chunk, int64_t nbytes)
{
    if (chunk == 0)
        chunk = DEFAULT_CHUNK;
    chunk = (chunk + 4095) / 4096 * 4096; /* whole pages: every block stays aligned */
    if ((uint64_t)nbytes < chunk)
        chunk = ((size_t)nbytes + 4095) / 4096 * 4096;
    return chunk ? chunk : 4096;
}

/* Move n bytes between buf and fd at `at` with pwrite (writing) or pread, asking for `ask`
 * bytes (>= n: O_DIRECT reads whole pages); retried on EINTR and partial transfers.  0, or
 * -errno, -EIO (a write that wrote nothing), -ENODATA (the file ended first). */
static int move_all(int fd, unsigned char *buf, size_t n, size_t ask, off_t at, int writing,
                    int64_t *calls)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = writing ? pwrite(fd, buf + done, ask - done, at + (off_t)done)
                            : pread(fd, buf + done, ask - done, at + (off_t)done);
        (*calls)++;
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? -errno : (writing ? -EIO : -ENODATA);
        done += (size_t)r;
    }
    return 0;
}

/* Turn O_DIRECT on or off on fd (for the unaligned tail of an O_DIRECT write). */
static int set_direct(int fd, int on)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0)
        return -errno;
    flags = on ? (flags | O_DIRECT) : (flags & ~O_DIRECT);
    return fcntl(fd, F_SETFL, flags) == 0 ? 0 : -errno;
}

/* The end of a write of nbytes at offset begun at t0 (rc: its outcome so far, done bytes
 * written): its times in st, the fsync when asked (timed apart), and the error naming the
 * call that failed.  0 or -errno. */
static int end_write(int fd, int do_fsync, int rc, int64_t t0, int64_t done, int64_t nbytes,
                     int64_t offset, dio_shard_stats *st, const char *path, dio_error *err)
{
    st->io_ns = dio_now_ns() - t0;
    st->bytes = done;
    if (rc == 0 && do_fsync) {
        t0 = dio_now_ns();
        if (fsync(fd) != 0)
            rc = -errno;
        st->sync_ns = dio_now_ns() - t0;
        st->syncs = 1;
    }
    if (rc == -ECANCELED) /* stopped (dio_stopped filled *err) */
        return rc;
    if (rc < 0)
        return dio_fail(err, -rc, path, "%s %s at offset %lld: %s",
                        done < nbytes ? "pwrite" : "fsync", path,
                        (long long)(offset + done), strerror(-rc));
    return 0;
}

int dio_shard_write(int fd, int64_t offset, int64_t nbytes, uint64_t seed, size_t chunk,
                    int odirect, int do_fsync, dio_shard_stats *st, const char *path,
                    dio_error *err)
{
    unsigned char *buf;
    int64_t done = 0, t0;
    uint64_t k = 0;
    int rc = 0;
    if (!path)
        path = "";
    dio_clear_error(err);
    memset(st, 0, sizeof *st);
    if (offset < 0 || nbytes < 0 || (odirect && offset % 4096))
        return dio_fail(err, EINVAL, path, "shard write %s: invalid extent (offset %lld, "
                        "%lld bytes%s)", path, (long long)offset, (long long)nbytes,
                        odirect ? ", O_DIRECT needs a 4096-aligned offset" : "");
    chunk = dio_shard_chunk(chunk, nbytes);
    if (!(buf = shard_buffer(chunk)))
        return dio_fail(err, ENOMEM, path, "shard write %s: cannot allocate %zu bytes", path,
                        chunk);
    dio_fill_random(buf, chunk, seed);
    if (odirect && (rc = set_direct(fd, 1)) < 0) {
        free(buf);
        return dio_fail(err, -rc, path, "shard write %s: O_DIRECT refused: %s", path,
                        strerror(-rc));
    }
    t0 = dio_now_ns();
    while (done < nbytes) {
        size_t n = (uint64_t)(nbytes - done) < chunk ? (size_t)(nbytes - done) : chunk;
        if ((rc = dio_stopped(err, path)) < 0)
            break;
        stamp(buf, n, seed, k);
        if (odirect && n % 4096 && (rc = set_direct(fd, 0)) < 0) /* the unaligned tail */
            break;
        if ((rc = move_all(fd, buf, n, n, (off_t)(offset + done), 1, &st->calls)) < 0)
            break;
        done += (int64_t)n;
        k++;
    }
    free(buf);
    return end_write(fd, do_fsync, rc, t0, done, nbytes, offset, st, path, err);
}

#define STREAM_MIN ((size_t)1 << 20) /* blocks at least this large bypass the CPU's caches */

#if defined(__x86_64__) && defined(__GNUC__)
/* One 64-byte line from src to dst (64-byte aligned) with non-temporal stores. */
static inline void stream_line(unsigned char *dst, const unsigned char *src)
{
    __m128i a = _mm_loadu_si128((const __m128i *)src);
    __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
    _mm_stream_si128((__m128i *)dst, a);
    _mm_stream_si128((__m128i *)(dst + 16), b);
    _mm_stream_si128((__m128i *)(dst + 32), c);
    _mm_stream_si128((__m128i *)(dst + 48), d);
}
#endif

/* memcpy with non-temporal stores (SSE2, which every x86-64 has) for blocks of STREAM_MIN
 * bytes or more, four pages at a time, a line of each in turn (as glibc's largest copies):
 * a snapshot's bytes are not read back by the CPU before the write takes them, and glibc's
 * memcpy keeps regular stores up to a threshold derived from the last-level cache's reported
 * size (3/4 of it: 114 MiB on a VM that reports 300 MiB of L3), so that a 64 MiB block was
 * copied with a read for ownership of every destination line, at 0.5-0.6x the rate of one
 * large memcpy. Elsewhere, and for smaller blocks, memcpy. */
static void copy_block(unsigned char *dst, const unsigned char *src, size_t n)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (n >= STREAM_MIN) {
        size_t head = (size_t)(-(uintptr_t)dst & 63), at = 0;
        memcpy(dst, src, head);
        dst += head, src += head, n -= head;
        for (; at + 4 * 4096 <= n; at += 4 * 4096)
            for (size_t line = 0; line < 4096; line += 64)
                for (size_t page = 0; page < 4 * 4096; page += 4096) {
                    __builtin_prefetch(src + at + page + line + 128);
                    stream_line(dst + at + page + line, src + at + page + line);
                }
        for (; at + 64 <= n; at += 64)
            stream_line(dst + at, src + at);
        _mm_sfence(); /* the streamed lines ordered before the stamp and the writer's reads */
        memcpy(dst + at, src + at, n - at);
        return;
    }
#endif
    memcpy(dst, src, n);
}

int dio_shard_snapshot(void *dst, int64_t nbytes, uint64_t seed, size_t chunk,
                       const void *pattern, size_t pattern_len, double bytes_per_second)
{
    unsigned char *out = dst;
    int64_t done = 0, t0 = dio_now_ns();
    uint64_t k = 0;
    chunk = dio_shard_chunk(chunk, nbytes);
    if (nbytes < 0 || pattern_len < chunk)
        return -EINVAL;
    while (done < nbytes) {
        size_t n = (uint64_t)(nbytes - done) < chunk ? (size_t)(nbytes - done) : chunk;
        if (dio_stop_signal())
            return -ECANCELED;
        copy_block(out + done, pattern, n);
        stamp(out + done, n, seed, k);
        done += (int64_t)n;
        k++;
        if (bytes_per_second > 0 && /* the copy's share of time so far */
            dio_nap_until_ns(t0 + (int64_t)((double)done / bytes_per_second * 1e9)) < 0)
            return -ECANCELED;
    }
    return 0;
}

int dio_buffer_write(int fd, int64_t offset, const void *buf, int64_t nbytes, size_t chunk,
                     int odirect, int do_fsync, dio_shard_stats *st, const char *path,
                     dio_error *err)
{
    unsigned char *from = (unsigned char *)buf;
    int64_t done = 0, t0;
    int rc = 0;
    if (!path)
        path = "";
    dio_clear_error(err);
    memset(st, 0, sizeof *st);
    if (offset < 0 || nbytes < 0 ||
        (odirect && (offset % 4096 || (uintptr_t)buf % 4096)))
        return dio_fail(err, EINVAL, path, "checkpoint write %s: invalid extent (offset %lld, "
                        "%lld bytes%s)", path, (long long)offset, (long long)nbytes,
                        odirect ? ", O_DIRECT needs 4096-aligned offsets and memory" : "");
    chunk = dio_shard_chunk(chunk, nbytes);
    if (odirect && (rc = set_direct(fd, 1)) < 0)
        return dio_fail(err, -rc, path, "checkpoint write %s: O_DIRECT refused: %s", path,
                        strerror(-rc));
    t0 = dio_now_ns();
    while (done < nbytes) {
        size_t n = (uint64_t)(nbytes - done) < chunk ? (size_t)(nbytes - done) : chunk;
        if ((rc = dio_stopped(err, path)) < 0)
            break;
        if (odirect && n % 4096 && (rc = set_direct(fd, 0)) < 0) /* the unaligned tail */
            break;
        if ((rc = move_all(fd, from + done, n, n, (off_t)(offset + done), 1, &st->calls)) < 0)
            break;
        done += (int64_t)n;
    }
    return end_write(fd, do_fsync, rc, t0, done, nbytes, offset, st, path, err);
}

int dio_shard_read(int fd, int64_t offset, int64_t nbytes, uint64_t seed, size_t chunk,
                   int verify, dio_shard_stats *st, const char *path, dio_error *err)
{
    unsigned char *buf, *expected = NULL;
    int64_t done = 0, t0;
    uint64_t k = 0;
    int rc = 0;
    if (!path)
        path = "";
    dio_clear_error(err);
    memset(st, 0, sizeof *st);
    if (offset < 0 || nbytes < 0)
        return dio_fail(err, EINVAL, path, "shard read %s: invalid extent", path);
    chunk = dio_shard_chunk(chunk, nbytes);
    if (!(buf = shard_buffer(chunk)))
        return dio_fail(err, ENOMEM, path, "shard read %s: cannot allocate %zu bytes", path,
                        chunk);
    if (verify && !(expected = malloc(chunk))) {
        free(buf);
        return dio_fail(err, ENOMEM, path, "shard read %s: cannot allocate %zu bytes", path,
                        chunk);
    }
    if (expected)
        dio_fill_random(expected, chunk, seed);
    t0 = dio_now_ns();
    while (done < nbytes) {
        size_t n = (uint64_t)(nbytes - done) < chunk ? (size_t)(nbytes - done) : chunk;
        size_t want = (n + 4095) / 4096 * 4096; /* O_DIRECT reads whole pages */
        if ((rc = dio_stopped(err, path)) < 0)
            break;
        if ((rc = move_all(fd, buf, n, want, (off_t)(offset + done), 0, &st->calls)) < 0)
            break;
        if (expected) { /* the stamp of every block; the whole block when verify > 1 or
                         * for every 64th block */
            stamp(expected, n, seed, k);
            size_t check = (verify > 1 || k % 64 == 0) ? n : (n < STAMP_BYTES ? n : STAMP_BYTES);
            if (memcmp(buf, expected, check) != 0) {
                rc = -EILSEQ;
                break;
            }
            st->verified += (int64_t)check;
        }
        done += (int64_t)n;
        k++;
    }
    st->io_ns = dio_now_ns() - t0;
    st->bytes = done;
    free(buf);
    free(expected);
    if (rc == -ECANCELED) /* stopped (dio_stopped filled *err) */
        return rc;
    if (rc == -EILSEQ)
        return dio_fail(err, EIO, path, "checkpoint %s: block %llu at offset %lld does not hold "
                        "the bytes written", path, (unsigned long long)k,
                        (long long)(offset + done));
    if (rc == -ENODATA)
        return dio_fail(err, EIO, path, "checkpoint %s: ends at offset %lld, before its %lld "
                        "bytes", path, (long long)(offset + done), (long long)nbytes);
    if (rc < 0)
        return dio_fail(err, -rc, path, "pread %s at offset %lld: %s", path,
                        (long long)(offset + done), strerror(-rc));
    return 0;
}
