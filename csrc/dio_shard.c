/*
 * dio_shard.c - checkpoint shards: a rank's bytes streamed to or from a file in large calls,
 * optionally with O_DIRECT and a final fsync.
 *
 * A shard's bytes are the checkpoint stream of its seed (dio_ckpt_stream.c): fresh bytes in
 * every block, so that no storage can deduplicate or compress them (unless a content asks for
 * it). Writing, a second thread makes block k + 1 while block k is written, into the other of
 * two aligned buffers: the making costs the storage's time nothing where a core is free, and
 * what the writer still waits for it is reported apart (emulator_ns). Reading, a restore
 * compares the first bytes of every 4 KiB granule and every 64th granule whole.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dio_internal.h"

#define DEFAULT_CHUNK ((size_t)64 << 20)
#define HUGE_ALIGN ((size_t)2 << 20)
#define WHOLE_EVERY 64 /* a restore compares every so many granules whole */

/* chunk bytes, 2 MiB-aligned, advised to huge pages (fewer pages to pin for O_DIRECT). */
static size_t rounded(size_t chunk);

static void *shard_buffer(size_t chunk)
{
    void *p = NULL;
    size_t size = rounded(chunk);
    if (posix_memalign(&p, HUGE_ALIGN, size) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}

/* Buffers kept from one save or restore to the next (a checkpoint's files, and the next
 * checkpoint): allocating and faulting in 128 MiB per file cost a save more than making its
 * bytes. At most POOLED are kept, the largest given back; the process holds them until it
 * ends (the plan's memory budget counts them). */
#define POOLED 2
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static void *pool[POOLED];
static size_t pool_bytes[POOLED];

static size_t rounded(size_t chunk) { return (chunk + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN; }

/* A buffer of at least chunk bytes, its size in *bytes: a kept one, else a new one. */
static void *buffer_take(size_t chunk, size_t *bytes)
{
    void *p = NULL;
    pthread_mutex_lock(&pool_lock);
    for (int i = 0; i < POOLED && !p; i++)
        if (pool[i] && pool_bytes[i] >= rounded(chunk))
            p = pool[i], *bytes = pool_bytes[i], pool[i] = NULL;
    pthread_mutex_unlock(&pool_lock);
    if (!p && (p = shard_buffer(chunk)))
        *bytes = rounded(chunk);
    return p;
}

/* Give back a buffer of `bytes` (buffer_take's): kept in a free slot or in place of a smaller
 * one (freed), else freed. */
static void buffer_give(void *p, size_t bytes)
{
    if (!p)
        return;
    pthread_mutex_lock(&pool_lock);
    for (int i = 0; i < POOLED && p; i++)
        if (!pool[i] || pool_bytes[i] < bytes) {
            void *old = pool[i];
            pool[i] = p, pool_bytes[i] = bytes;
            p = old; /* a smaller one given way: freed below */
            break;
        }
    pthread_mutex_unlock(&pool_lock);
    free(p);
}

int dio_shard_prepare(size_t chunk, int count)
{
    void *held[POOLED] = {NULL};
    size_t bytes[POOLED] = {0};
    int rc = 0;
    count = count < POOLED ? count : POOLED;
    for (int i = 0; i < count && rc == 0; i++) {
        if (!(held[i] = buffer_take(chunk, &bytes[i])))
            rc = -ENOMEM;
        else
            memset(held[i], 0, bytes[i]); /* its pages faulted in now */
    }
    for (int i = 0; i < count; i++)
        buffer_give(held[i], bytes[i]);
    return rc;
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
                    dio_shard_stats *st)
{
    size_t done = 0;
    while (done < n) {
        int64_t t0 = dio_now_ns();
        ssize_t r = writing ? pwrite(fd, buf + done, ask - done, at + (off_t)done)
                            : pread(fd, buf + done, ask - done, at + (off_t)done);
        st->io_ns += dio_now_ns() - t0;
        st->calls++;
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

/* The end of a write of nbytes at offset (rc: its outcome so far, done bytes written): the
 * fsync when asked (timed apart), and the error naming the call that failed.  0 or -errno. */
static int end_write(int fd, int do_fsync, int rc, int64_t done, int64_t nbytes,
                     int64_t offset, dio_shard_stats *st, const char *path, dio_error *err)
{
    st->bytes = done;
    if (rc == 0 && do_fsync) {
        int64_t t0 = dio_now_ns();
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

/* ---- the block maker: a thread making block k + 1 of a shard while block k is written */

typedef struct block_maker {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    unsigned char *buf[2];
    size_t bytes[2]; /* each buffer's size (buffer_take's) */
    size_t chunk;
    int64_t nbytes;
    uint64_t seed;
    const dio_content *content;
    int64_t made;     /* blocks made so far (block k lies in buf[k % 2]) */
    int64_t released; /* blocks the writer is done with */
    int quit;
} block_maker;

static size_t block_len(const block_maker *m, int64_t k)
{
    int64_t left = m->nbytes - k * (int64_t)m->chunk;
    return (uint64_t)left < m->chunk ? (size_t)left : m->chunk;
}

static void make_block(block_maker *m, int64_t k)
{
    dio_ckpt_fill(m->buf[k % 2], block_len(m, k), m->seed, (uint64_t)k * m->chunk, m->content);
}

static void *maker_main(void *arg)
{
    block_maker *m = arg;
    int64_t blocks = (m->nbytes + (int64_t)m->chunk - 1) / (int64_t)m->chunk;
    for (int64_t k = 1; k < blocks; k++) { /* block 0: made by the writer before it starts */
        pthread_mutex_lock(&m->lock);
        while (!m->quit && m->released < k - 1) /* buf[k % 2] still holds block k - 2 */
            pthread_cond_wait(&m->changed, &m->lock);
        int quit = m->quit;
        pthread_mutex_unlock(&m->lock);
        if (quit)
            break;
        make_block(m, k);
        pthread_mutex_lock(&m->lock);
        m->made = k + 1;
        pthread_cond_broadcast(&m->changed);
        pthread_mutex_unlock(&m->lock);
    }
    return NULL;
}

/* Make block 0, then start the thread that makes the others (with every signal blocked: the
 * stop signals stay the writer's).  0 or -errno. */
static int maker_start(block_maker *m)
{
    sigset_t all, old;
    make_block(m, 0);
    m->made = 1;
    if (m->nbytes <= (int64_t)m->chunk)
        return 0; /* one block: no thread */
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->changed, NULL);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&m->thread, NULL, maker_main, m);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&m->changed);
        pthread_mutex_destroy(&m->lock);
    }
    return -rc;
}

/* Block k, once made (the wait added to *waited_ns); block k - 1 released. */
static unsigned char *maker_take(block_maker *m, int64_t k, int64_t *waited_ns)
{
    if (m->nbytes <= (int64_t)m->chunk)
        return m->buf[0];
    int64_t t0 = dio_now_ns();
    pthread_mutex_lock(&m->lock);
    m->released = k;
    pthread_cond_broadcast(&m->changed);
    while (m->made <= k)
        pthread_cond_wait(&m->changed, &m->lock);
    pthread_mutex_unlock(&m->lock);
    *waited_ns += dio_now_ns() - t0;
    return m->buf[k % 2];
}

static void maker_stop(block_maker *m)
{
    if (m->nbytes <= (int64_t)m->chunk)
        return;
    pthread_mutex_lock(&m->lock);
    m->quit = 1;
    pthread_cond_broadcast(&m->changed);
    pthread_mutex_unlock(&m->lock);
    pthread_join(m->thread, NULL);
    pthread_cond_destroy(&m->changed);
    pthread_mutex_destroy(&m->lock);
}

/* Allocate the maker's buffers (one when the shard is one block) and start it.  0 or -errno. */
static int maker_open(block_maker *m, int64_t nbytes, uint64_t seed, const dio_content *c,
                      size_t chunk, int64_t *made_ns)
{
    memset(m, 0, sizeof *m);
    m->chunk = chunk, m->nbytes = nbytes, m->seed = seed, m->content = c;
    if (!(m->buf[0] = buffer_take(chunk, &m->bytes[0])) ||
        (nbytes > (int64_t)chunk && !(m->buf[1] = buffer_take(chunk, &m->bytes[1])))) {
        buffer_give(m->buf[0], m->bytes[0]);
        return -ENOMEM;
    }
    int64_t t0 = dio_now_ns();
    int rc = maker_start(m);
    *made_ns += dio_now_ns() - t0;
    if (rc < 0) {
        buffer_give(m->buf[0], m->bytes[0]);
        buffer_give(m->buf[1], m->bytes[1]);
    }
    return rc;
}

static void maker_close(block_maker *m)
{
    maker_stop(m);
    buffer_give(m->buf[0], m->bytes[0]);
    buffer_give(m->buf[1], m->bytes[1]);
}

int dio_shard_write(int fd, int64_t offset, int64_t nbytes, uint64_t seed,
                    const dio_content *c, size_t chunk, int odirect, int do_fsync,
                    dio_shard_stats *st, const char *path, dio_error *err)
{
    block_maker maker;
    int64_t done = 0, k = 0;
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
    if (odirect && (rc = set_direct(fd, 1)) < 0)
        return dio_fail(err, -rc, path, "shard write %s: O_DIRECT refused: %s", path,
                        strerror(-rc));
    if ((rc = maker_open(&maker, nbytes, seed, c, chunk, &st->emulator_ns)) < 0)
        return dio_fail(err, -rc, path, "shard write %s: cannot allocate two buffers of %zu "
                        "bytes and a thread: %s", path, chunk, strerror(-rc));
    while (done < nbytes) {
        size_t n = (uint64_t)(nbytes - done) < chunk ? (size_t)(nbytes - done) : chunk;
        if ((rc = dio_stopped(err, path)) < 0)
            break;
        unsigned char *buf = maker_take(&maker, k, &st->emulator_ns);
        if (odirect && n % 4096 && (rc = set_direct(fd, 0)) < 0) /* the unaligned tail */
            break;
        if ((rc = move_all(fd, buf, n, n, (off_t)(offset + done), 1, st)) < 0)
            break;
        done += (int64_t)n;
        k++;
    }
    maker_close(&maker);
    return end_write(fd, do_fsync, rc, done, nbytes, offset, st, path, err);
}

int dio_shard_snapshot(void *dst, int64_t nbytes, uint64_t seed, const dio_content *c,
                       size_t chunk, double bytes_per_second)
{
    unsigned char *out = dst;
    int64_t done = 0, t0 = dio_now_ns();
    chunk = dio_shard_chunk(chunk, nbytes);
    if (nbytes < 0)
        return -EINVAL;
    while (done < nbytes) {
        size_t n = (uint64_t)(nbytes - done) < chunk ? (size_t)(nbytes - done) : chunk;
        if (dio_stop_signal())
            return -ECANCELED;
        dio_ckpt_fill(out + done, n, seed, (uint64_t)done, c);
        done += (int64_t)n;
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
    int64_t done = 0;
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
    while (done < nbytes) {
        size_t n = (uint64_t)(nbytes - done) < chunk ? (size_t)(nbytes - done) : chunk;
        if ((rc = dio_stopped(err, path)) < 0)
            break;
        if (odirect && n % 4096 && (rc = set_direct(fd, 0)) < 0) /* the unaligned tail */
            break;
        if ((rc = move_all(fd, from + done, n, n, (off_t)(offset + done), 1, st)) < 0)
            break;
        done += (int64_t)n;
    }
    return end_write(fd, do_fsync, rc, done, nbytes, offset, st, path, err);
}

/* Compare a block (n bytes at shard offset at) with the stream (dio_ckpt_check: every 64th
 * granule whole, or all when verify > 1), its time the emulator's.  -1, or the shard offset
 * of the first granule that differs. */
static int64_t check_block(const unsigned char *buf, size_t n, int64_t at, uint64_t seed,
                           const dio_content *c, int verify, dio_shard_stats *st)
{
    int64_t t0 = dio_now_ns();
    int64_t bad = dio_ckpt_check(buf, n, seed, (uint64_t)at, c, verify > 1 ? 1 : WHOLE_EVERY,
                                 &st->verified);
    st->emulator_ns += dio_now_ns() - t0;
    return bad < 0 ? -1 : at + bad;
}

static int read_failed(int rc, int64_t offset, int64_t done, int64_t nbytes, int64_t bad,
                       const char *path, dio_error *err)
{
    if (rc == -ECANCELED) /* stopped (dio_stopped filled *err) */
        return rc;
    if (bad >= 0)
        return dio_fail(err, EIO, path, "checkpoint %s: the 4 KiB at offset %lld do not hold "
                        "the bytes written", path, (long long)(offset + bad));
    if (rc == -ENODATA)
        return dio_fail(err, EIO, path, "checkpoint %s: ends at offset %lld, before its %lld "
                        "bytes", path, (long long)(offset + done), (long long)nbytes);
    return dio_fail(err, -rc, path, "pread %s at offset %lld: %s", path,
                    (long long)(offset + done), strerror(-rc));
}

int dio_shard_read(int fd, int64_t offset, int64_t nbytes, uint64_t seed,
                   const dio_content *c, size_t chunk, int verify, dio_shard_stats *st,
                   const char *path, dio_error *err)
{
    unsigned char *buf;
    size_t bytes = 0;
    int64_t done = 0, bad = -1;
    int rc = 0;
    if (!path)
        path = "";
    dio_clear_error(err);
    memset(st, 0, sizeof *st);
    if (offset < 0 || nbytes < 0)
        return dio_fail(err, EINVAL, path, "shard read %s: invalid extent", path);
    chunk = dio_shard_chunk(chunk, nbytes);
    if (!(buf = buffer_take(chunk, &bytes)))
        return dio_fail(err, ENOMEM, path, "shard read %s: cannot allocate %zu bytes", path,
                        chunk);
    while (done < nbytes) {
        size_t n = (uint64_t)(nbytes - done) < chunk ? (size_t)(nbytes - done) : chunk;
        size_t want = (n + 4095) / 4096 * 4096; /* O_DIRECT reads whole pages */
        if ((rc = dio_stopped(err, path)) < 0)
            break;
        if ((rc = move_all(fd, buf, n, want, (off_t)(offset + done), 0, st)) < 0)
            break;
        if (verify && (bad = check_block(buf, n, done, seed, c, verify, st)) >= 0) {
            rc = -EILSEQ;
            break;
        }
        done += (int64_t)n;
    }
    st->bytes = done;
    buffer_give(buf, bytes);
    return rc < 0 ? read_failed(rc, offset, done, nbytes, bad, path, err) : 0;
}

