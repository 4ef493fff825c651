/*
 * dio_random.c - deterministic payloads: xoshiro256** seeded through splitmix64.
 * The byte stream of a seed is made of blocks of DIO_PAYLOAD_BLOCK bytes; block k is the
 * sequence of 64-bit outputs, stored little-endian, of the generator seeded with
 * block_seed(seed, k) (block 0: seed itself). So any part of the stream can be made without
 * the parts before it (ranks writing one shared file collectively each make their own blocks),
 * dio_fill_random(buf, n, seed) is always a prefix of dio_fill_random(buf, n + k, seed), and
 * dio_write_random writes exactly that stream whatever its chunk size.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dio_internal.h"

typedef dio_rng rng;

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void rng_seed(rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    r->nleft = 0;
}

static inline uint64_t block_seed(uint64_t seed, uint64_t block)
{
    return block == 0 ? seed : seed ^ (block * 0xD1B54A32D192ED03ull);
}

static inline uint64_t le64(uint64_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return __builtin_bswap64(v);
#else
    return v;
#endif
}

static void rng_fill(rng *r, unsigned char *p, size_t n)
{
    uint64_t s0 = r->s[0], s1 = r->s[1], s2 = r->s[2], s3 = r->s[3];
    if (r->nleft) {
        size_t k = (size_t)r->nleft < n ? (size_t)r->nleft : n;
        memcpy(p, r->left + (8 - r->nleft), k);
        r->nleft -= (int)k;
        p += k;
        n -= k;
    }
    while (n > 0) {
        uint64_t out = le64(rotl(s1 * 5, 7) * 9);
        uint64_t t = s1 << 17;
        s2 ^= s0;
        s3 ^= s1;
        s1 ^= s2;
        s0 ^= s3;
        s2 ^= t;
        s3 = rotl(s3, 45);
        if (DIO_LIKELY(n >= 8)) {
            memcpy(p, &out, 8);
            p += 8;
            n -= 8;
        } else {
            memcpy(r->left, &out, 8);
            memcpy(p, r->left, n);
            r->nleft = (int)(8 - n);
            n = 0;
        }
    }
    r->s[0] = s0;
    r->s[1] = s1;
    r->s[2] = s2;
    r->s[3] = s3;
}

typedef dio_stream stream;

void dio_stream_seek(dio_stream *st, uint64_t seed, uint64_t pos)
{
    unsigned char skip[256];
    uint64_t into = pos % DIO_PAYLOAD_BLOCK;
    st->seed = seed;
    st->pos = pos;
    rng_seed(&st->r, block_seed(seed, pos / DIO_PAYLOAD_BLOCK));
    while (into > 0) { /* within a block: generate and drop (at most one block) */
        size_t k = into < sizeof skip ? (size_t)into : sizeof skip;
        rng_fill(&st->r, skip, k);
        into -= k;
    }
}

void dio_stream_fill(dio_stream *st, void *buf, size_t n)
{
    unsigned char *p = (unsigned char *)buf;
    while (n > 0) {
        uint64_t room = DIO_PAYLOAD_BLOCK - st->pos % DIO_PAYLOAD_BLOCK;
        size_t k = room < n ? (size_t)room : n;
        rng_fill(&st->r, p, k);
        p += k;
        n -= k;
        st->pos += k;
        if (st->pos % DIO_PAYLOAD_BLOCK == 0)
            rng_seed(&st->r, block_seed(st->seed, st->pos / DIO_PAYLOAD_BLOCK));
    }
}

void dio_fill_random_at(void *buf, size_t n, uint64_t seed, uint64_t start)
{
    stream st;
    dio_stream_seek(&st, seed, start);
    dio_stream_fill(&st, buf, n);
}

void dio_fill_random(void *buf, size_t n, uint64_t seed)
{
    dio_fill_random_at(buf, n, seed, 0);
}

#define DEFAULT_CHUNK ((size_t)8 << 20)

int dio_write_random(int fd, int64_t offset, int64_t nbytes, uint64_t seed, size_t chunk,
                     uint32_t *crc, const char *path, dio_error *err)
{
    stream st;
    void *buf = NULL;
    uint32_t sum = crc ? *crc : 0;
    int64_t done = 0;
    if (!path)
        path = "";
    dio_clear_error(err);
    if (offset < 0 || nbytes < 0 || nbytes > INT64_MAX - offset)
        return dio_fail(err, EINVAL, path,
                        "write_random %s: invalid extent (offset %lld, %lld bytes)", path,
                        (long long)offset, (long long)nbytes);
    if (chunk == 0)
        chunk = DEFAULT_CHUNK;
    if ((uint64_t)nbytes < chunk)
        chunk = (size_t)nbytes;
    if (nbytes == 0)
        return 0;
    if (posix_memalign(&buf, 4096, chunk) != 0)
        return dio_fail(err, ENOMEM, path, "write_random %s: cannot allocate %zu bytes", path,
                        chunk);
    dio_stream_seek(&st, seed, 0);
    while (done < nbytes) {
        size_t n = (uint64_t)(nbytes - done) < chunk ? (size_t)(nbytes - done) : chunk;
        dio_stream_fill(&st, buf, n);
        if (crc)
            sum = dio_crc32(sum, buf, n);
        int rc = dio_pwrite_all(fd, buf, n, offset + done, path, err);
        if (rc < 0) {
            free(buf);
            return rc;
        }
        done += (int64_t)n;
    }
    free(buf);
    if (crc)
        *crc = sum;
    return 0;
}

/* ns this process spent in dio_pwrite_all's pwrite calls (data generation's writes, copies):
 * the storage's part of a phase, read by dio_write_ns. */
static int64_t write_ns;

int64_t dio_write_ns(void)
{
    return __atomic_load_n(&write_ns, __ATOMIC_RELAXED);
}

int dio_pwrite_all(int fd, const void *buf, size_t n, int64_t offset, const char *path,
                   dio_error *err)
{
    size_t put = 0;
    while (put < n) {
        int64_t t0 = dio_now_ns();
        ssize_t w = pwrite(fd, (const char *)buf + put, n - put, (off_t)(offset + (int64_t)put));
        __atomic_add_fetch(&write_ns, dio_now_ns() - t0, __ATOMIC_RELAXED);
        if (w < 0) {
            int e = errno;
            if (e == EINTR)
                continue;
            return dio_fail(err, e, path, "pwrite %s at offset %lld (%zu bytes): %s", path,
                            (long long)(offset + (int64_t)put), n - put, strerror(e));
        }
        if (w == 0)
            return dio_fail(err, EIO, path, "pwrite %s at offset %lld wrote nothing", path,
                            (long long)(offset + (int64_t)put));
        put += (size_t)w;
    }
    return 0;
}

int dio_syncfs(int fd)
{
    return syncfs(fd) == 0 ? 0 : -errno;
}
