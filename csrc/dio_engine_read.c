/*
 * dio_engine_read.c - the reader threads: claim a chunk of requests under the lock, read it
 * without (pread, or a mapping), burn and sleep the preprocessing, report it done.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dio_engine_internal.h"

/* ------------------------------------------------------------------ reading */

static int read_failed(dio_engine *e, worker *w, const req *q, int er, int64_t at, int64_t want)
{
    const char *path = eng_file_path(&e->files, q->file, w->path);
    if (e->cfg.odirect && er == EINVAL)
        return dio_fail_odirect(&w->err, er, path, NULL);
    return dio_fail(&w->err, er, path, "pread %s at offset %lld (%lld bytes): %s", path,
                    (long long)at, (long long)want, strerror(er));
}

/* DIO_REQ_MMAP: map the request's extent (from its page), copy it into dst (every page
 * faulted in, through the page cache and its read-ahead, as an mmap reader's access to the
 * sample does) and unmap it.  The mapping stops at the end of the file: what lies past it
 * is not there (a short read, as pread's). */
static int map_request(dio_engine *e, worker *w, const req *q, int fd, char *dst,
                       int64_t *got, int64_t *ops)
{
    long page = sysconf(_SC_PAGESIZE);
    struct stat st;
    *got = 0;
    *ops = 1;
    if (fstat(fd, &st) != 0)
        return read_failed(e, w, q, errno, q->rd_off, q->rd_len);
    int64_t end = q->rd_off + q->rd_len < st.st_size ? q->rd_off + q->rd_len : st.st_size;
    if (end <= q->rd_off)
        return 0;
    int64_t start = q->rd_off / page * page;
    size_t span = (size_t)(end - start);
    void *map = mmap(NULL, span, PROT_READ, MAP_SHARED, fd, (off_t)start);
    if (map == MAP_FAILED)
        return read_failed(e, w, q, errno, q->rd_off, q->rd_len);
    memcpy(dst, (char *)map + (q->rd_off - start), (size_t)(end - q->rd_off));
    munmap(map, span);
    *got = end - q->rd_off;
    return 0;
}

/* Read one request into dst with descriptor fd; *got, *ops. */
static int read_request(dio_engine *e, worker *w, const req *q, int fd, char *dst,
                        int64_t *got, int64_t *ops)
{
    *got = *ops = 0;
    if (q->flags & DIO_REQ_MMAP) {
        int rc = map_request(e, w, q, fd, dst, got, ops);
        if (rc < 0)
            return rc;
        goto check; /* the same checks of what arrived as pread's */
    }
    while (*got < q->rd_len) {
        int64_t want = q->rd_len - *got < PREAD_MAX ? q->rd_len - *got : PREAD_MAX;
        ssize_t n = pread(fd, dst + *got, (size_t)want, (off_t)(q->rd_off + *got));
        if (DIO_LIKELY(n > 0)) {
            ++*ops;
            *got += n;
            if (DIO_UNLIKELY(n < want && *got >= q->need))
                break; /* O_DIRECT extent clipped at end of file: no pread to see EOF */
            continue;
        }
        if (n == 0) {
            ++*ops;
            break; /* end of file */
        }
        if (errno == EINTR)
            continue;
        ++*ops;
        return read_failed(e, w, q, errno, q->rd_off + *got, want);
    }
check:
    if (DIO_UNLIKELY(*got < q->need || (q->to_eof && *got > q->need))) {
        const char *path = eng_file_path(&e->files, q->file, w->path);
        int64_t have = *got - (q->off - q->rd_off);
        return dio_fail(&w->err, EIO, path,
                        "%s read of %s at offset %lld: expected %lld bytes, got %lld (the "
                        "file %s)", *got < q->need ? "short" : "long", path, (long long)q->off,
                        (long long)(q->need - (q->off - q->rd_off)),
                        (long long)(have < 0 ? 0 : have),
                        *got < q->need ? "ends before the data planned from its layout"
                                       : "goes on past the end planned from its layout");
    }
    return 0;
}

/* With discard: the thread's scratch buffer, grown to hold `need` bytes (aligned for
 * O_DIRECT); NULL if out of memory. */
static char *scratch_for(dio_engine *e, worker *w, int64_t need)
{
    size_t align = e->cfg.align > 4096 ? e->cfg.align : 4096;
    void *p = NULL;
    if ((size_t)need <= w->scratch_cap)
        return w->scratch;
    free(w->scratch);
    w->scratch = NULL;
    w->scratch_cap = 0;
    if (posix_memalign(&p, align, ((size_t)need + align - 1) / align * align) != 0)
        return NULL;
    w->scratch = p;
    w->scratch_cap = ((size_t)need + align - 1) / align * align;
    return w->scratch;
}

/* The descriptor request q reads through (*fd; -1 for a zero-length request outside an
 * access): its access's, opened by its DIO_REQ_OPEN, or the thread's cached one; the fstat
 * a loader makes again where the plan says so; *fell_back: the file itself where its copy
 * was asked for (the copy was gone).  0 or -errno. */
static int request_fd(dio_engine *e, worker *w, const req *q, int cached, int *fd,
                      int *fell_back)
{
    *fd = -1;
    *fell_back = 0;
    if (q->flags & DIO_REQ_OPEN) {
        int opened = eng_open_file(e, w, q->file, cached, &w->err);
        if (opened < 0)
            return opened;
        w->access_fd = opened;
        w->access_file = q->file;
        w->access_fell_back = w->fell_back;
    }
    if (w->access_fd >= 0) {
        *fd = w->access_fd;
        *fell_back = w->access_fell_back;
    } else if (q->rd_len > 0 || (q->flags & DIO_REQ_FSTAT)) {
        int got = eng_cached_fd(e, w, q->file, cached, fell_back, &w->err);
        if (got < 0)
            return got;
        *fd = got;
    }
    if ((q->flags & DIO_REQ_FSTAT) && *fd >= 0) {
        struct stat st; /* what the loader asks again; the answer is not needed */
        __atomic_fetch_add(&e->stats, 1, __ATOMIC_RELAXED);
        fstat(*fd, &st);
    }
    return 0;
}

/* The sample's preprocessing on this thread, after its read: a sleep, then CPU work that
 * contends for the cores.  When the sample is ready (done_ns without any). */
static int64_t preprocess(dio_engine *e, const req *q, int64_t done_ns)
{
    if (q->delay_ns > 0)
        done_ns = dio_sleep_until_ns(dio_now_ns() + q->delay_ns, 0);
    if (q->cpu_ns > 0) {
        int64_t began = dio_now_ns();
        done_ns = dio_burn_cpu_ns(q->cpu_ns);
        __atomic_fetch_add(&e->preprocess_cpu_ns, q->cpu_ns, __ATOMIC_RELAXED);
        __atomic_fetch_add(&e->preprocess_wall_ns, done_ns - began, __ATOMIC_RELAXED);
    }
    return done_ns;
}

/* A read of the cache tier, counted by where its bytes came from: the copy, or the file
 * itself where the copy was gone (a planned hit that missed, when DIO_REQ_HIT). */
static void count_cache_read(dio_engine *e, const req *q, int fell_back)
{
    if (!fell_back) {
        __atomic_fetch_add(&e->cache_reads, 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_fetch_add(&e->cache_fallback_reads, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&e->cache_fallback_bytes, q->len, __ATOMIC_RELAXED);
    if (q->flags & DIO_REQ_HIT)
        __atomic_fetch_add(&e->cache_hit_fallbacks, 1, __ATOMIC_RELAXED);
}

/* Read requests [first, last) of batch b into its slot.  Never takes the lock. */
int eng_read_chunk(dio_engine *e, worker *w, int64_t b, int64_t first, int64_t last,
                   chunk_result *r)
{
    char *base = e->cfg.discard ? NULL : e->slot[b % e->nslots];
    int64_t *lat = e->out_lat, *nread = e->out_nread, *start = e->out_start;
    r->ndone = r->bytes = r->ops = r->end_ns = 0;
    if (DIO_UNLIKELY(e->not_before > 0) && dio_now_ns() < e->not_before)
        dio_sleep_until_ns(e->not_before, 0); /* the loader is still starting */
    for (int64_t i = first; i < last; i++) {
        const req *q = &e->reqs[i];
        int64_t got = 0, ops = 0, t0, t1;
        int fd, fell_back, rc = 0;
        int cached = (q->flags & (DIO_REQ_CACHED | DIO_REQ_FILL)) != 0;
        if (e->evict_at_on)
            eng_evict_before(e, w, i);
        if ((q->flags & DIO_REQ_FILL) && (rc = eng_fill_cache(e, w, q->file, &w->err)) < 0)
            return rc;
        if ((rc = request_fd(e, w, q, cached, &fd, &fell_back)) < 0)
            return rc;
        t0 = t1 = 0;
        if (q->rd_len > 0) {
            t0 = dio_now_ns();
            watch_begin(&w->watch, WATCH_READ, q->file, t0);
            if (DIO_UNLIKELY(e->stall_ns > 0))
                eng_stall_if_chosen(e, w, WATCH_READ, q->file);
            char *dst = base ? base + q->buf_pos : scratch_for(e, w, q->rd_len);
            rc = dst ? read_request(e, w, q, fd, dst, &got, &ops)
                     : dio_fail(&w->err, ENOMEM, "", "read: out of memory for %lld bytes",
                                (long long)q->rd_len);
            t1 = dio_now_ns();
            watch_end(&w->watch);
        }
        int64_t done_ns = rc == 0 ? preprocess(e, q, t1) : t1; /* its sample ready */
        r->bytes += got;
        r->ops += ops;
        if (cached && q->rd_len > 0)
            count_cache_read(e, q, fell_back);
        if (q->flags & DIO_REQ_CLOSE || (rc < 0 && w->access_fd >= 0)) {
            eng_close_counted(w->access_fd, e);
            w->access_fd = -1;
        }
        if (rc < 0)
            return rc;
        if (lat)
            lat[i] = t1 - t0;
        if (nread)
            nread[i] = got;
        if (DIO_UNLIKELY(start != NULL)) { /* tracing: when, and on which thread */
            start[i] = t0 ? t0 : dio_now_ns();
            e->out_thread[i] = w == &e->self ? -1 : (int64_t)(w - e->workers);
        }
        if (done_ns > r->end_ns)
            r->end_ns = done_ns;
        r->ndone++;
    }
    return 0;
}

/* Under the lock: hand out the next chunk, if one is claimable. */
static int claim(dio_engine *e, int64_t *b, int64_t *first, int64_t *last)
{
    int64_t i, end, bytes = 0;
    int in_access = 0;
    if (!e->active || e->cursor >= e->nreq)
        return 0;
    while (e->batches[e->cur_batch].end <= e->cursor)
        e->cur_batch++; /* skips empty batches; cursor < nreq bounds this */
    if (e->cur_batch >= e->released + e->nslots)
        return 0;
    *b = e->cur_batch;
    *first = i = e->cursor;
    end = e->batches[e->cur_batch].end;
    do {
        const req *q = &e->reqs[i];
        if (q->flags & DIO_REQ_OPEN)
            in_access = 1;
        if (q->flags & DIO_REQ_CLOSE)
            in_access = 0;
        bytes += q->rd_len;
        i++;
    } while (i < end && (in_access || e->cfg.whole_batches ||
                         (i - *first < CHUNK_MAX_REQ && bytes < CHUNK_MAX_BYTES)));
    *last = e->cursor = i;
    e->inflight++;
    return 1;
}

/* Under the lock: account a chunk that was read (rc < 0: it failed with w->err). */
void eng_finish_chunk(dio_engine *e, worker *w, int64_t b, const chunk_result *r, int rc)
{
    batch_state *bs = &e->batches[b];
    int wake = 0;
    e->inflight--;
    __atomic_store_n(&bs->done, bs->done + r->ndone, __ATOMIC_RELEASE); /* polled unlocked */
    bs->bytes_read += r->bytes;
    bs->read_ops += r->ops;
    __atomic_fetch_add(&e->bytes_read, r->bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&e->read_ops, r->ops, __ATOMIC_RELAXED);
    if (r->end_ns > bs->ready_ns)
        bs->ready_ns = r->end_ns;
    if (rc < 0) {
        if (b < e->err_batch) {
            e->err_batch = b;
            e->first_err = w->err;
        }
        e->cursor = e->nreq; /* stop: batches before b were all handed out already */
        wake = 1;
    } else if (bs->done == bs->end - bs->start) {
        if (bs->ready_ns == 0)
            bs->ready_ns = dio_now_ns();
        if (e->wait_batch == b)
            wake = 1;
    }
    if (e->wait_idle && e->inflight == 0)
        wake = 1;
    if (wake)
        pthread_cond_broadcast(&e->done_cv);
}

void *eng_worker_main(void *arg)
{
    worker *w = arg;
    dio_engine *e = w->e;
    /* SCHED_BATCH: a reader woken while the consumer runs on its core does not preempt it
     * (the consumer paces the emulated accelerator; a reader can wait for the next sleep). */
    struct sched_param batch = {0};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &batch);
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        int64_t b, first, last;
        chunk_result r;
        int rc;
        if (!claim(e, &b, &first, &last)) {
            pthread_cond_wait(&e->work_cv, &e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        rc = eng_read_chunk(e, w, b, first, last, &r);
        pthread_mutex_lock(&e->mu);
        eng_finish_chunk(e, w, b, &r, rc);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Stop handing out work of the current epoch and wait until no chunk is being read. */
void eng_abandon_epoch(dio_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->active = 0;
    e->cursor = e->nreq;
    e->wait_idle = 1;
    while (e->inflight > 0)
        eng_wait_readers(e, 0, NULL); /* reports a stuck reader, cannot fail */
    e->wait_idle = 0;
    e->holding = 0;
    pthread_mutex_unlock(&e->mu);
}
