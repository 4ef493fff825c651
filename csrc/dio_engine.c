/*
 * dio_engine.c - the read engine: worker threads execute an epoch of planned read requests
 * with pread (optionally O_DIRECT) into a ring of batch buffers; the consumer waits for one
 * batch at a time.
 *
 * Ring: nslots = prefetch + 1 buffers (1 when nthreads == 0).  Batch b lives in slot
 * b % nslots.  The consumer holds the batch it got last; dio_engine_next releases it before
 * waiting for the next one.  Workers may only work on batch b while b < released + nslots,
 * where `released` counts the batches the consumer has released, so they never overwrite a
 * batch the consumer still holds.
 *
 * Work distribution: requests are ordered by batch, and one cursor (under the mutex) hands
 * out chunks of consecutive requests of one batch (up to CHUNK_MAX_REQ requests or about
 * CHUNK_MAX_BYTES, at least one).  A worker reads its chunk without the lock, then adds the
 * chunk to its batch's completed count under the lock; the consumer sleeps on done_cv until
 * its batch is complete or failed.  So the per-request cost is a pread, two clock reads and a
 * direct-mapped descriptor-cache lookup; locks are taken per chunk.
 *
 * Errors: the first failure (lowest batch) is kept with its message; the cursor stops, and
 * dio_engine_next returns -errno for that batch and for every later call until a new epoch
 * starts (the error is sticky).  Batches before the failed one are delivered normally.
 *
 * Descriptors: each thread owns a direct-mapped cache of fd_cache descriptors keyed by file
 * index (no locking); an eviction closes the old descriptor.  Caches are only touched by their
 * owner while it reads a chunk (counted in `inflight`), so with inflight == 0 and the mutex
 * held the API thread may flush them (set_files, destroy).
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

#include "dio_internal.h"

#define CHUNK_MAX_REQ 64
#define CHUNK_MAX_BYTES ((int64_t)4 << 20)
#define PREAD_MAX ((int64_t)1 << 30) /* one pread moves at most this (Linux caps at ~2 GiB) */
#define MAX_THREADS 4096
#define PLACE_ALIGN 64               /* request placement in a batch buffer without O_DIRECT */
#define HUGE_ALIGN ((size_t)2 << 20)

typedef struct req {
    int64_t file;    /* index into the file table */
    int64_t rd_off;  /* file offset of the extent read (aligned down with O_DIRECT) */
    int64_t rd_len;  /* bytes of the extent (aligned up with O_DIRECT) */
    int64_t need;    /* bytes of the extent that must arrive: (offset + length) - rd_off */
    int64_t buf_pos; /* where the extent starts in the batch buffer */
    int64_t off;     /* the request as planned, for messages */
    int64_t len;
} req;

typedef struct batch_state {
    int64_t start, end; /* request range [start, end) */
    int64_t done;       /* requests completed */
    int64_t data_len;
    int64_t bytes_requested;
    int64_t bytes_read;
    int64_t read_ops;
    int64_t ready_ns;
} batch_state;

typedef struct fd_ent {
    int64_t file; /* -1 = empty */
    int fd;
} fd_ent;

typedef struct worker {
    dio_engine *e;
    pthread_t tid;
    int started;
    fd_ent *cache;
    dio_error err; /* this thread's last failure, copied into the engine under the lock */
} worker;

typedef struct chunk_result {
    int64_t ndone, bytes, ops, end_ns;
} chunk_result;

struct dio_engine {
    dio_engine_config cfg;
    int nslots;
    int64_t place_align; /* placement alignment inside a batch buffer */
    int64_t ext_align;   /* extent alignment (O_DIRECT), 1 without */

    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* workers wait here for claimable work */
    pthread_cond_t done_cv; /* the API thread waits here (batch complete, failed, idle) */
    int stop;

    worker *workers;
    int nworkers;
    worker self; /* the caller's reader when nthreads == 0 */

    int64_t nfiles;
    char **paths;

    /* the epoch */
    int active;
    int64_t nbatches, nreq;
    req *reqs;
    int64_t reqs_cap;
    batch_state *batches;
    int64_t batches_cap;
    int64_t *out_lat, *out_nread;
    int64_t cursor;     /* next request to hand out */
    int64_t cur_batch;  /* batch of the cursor */
    int64_t next_batch; /* next batch the consumer gets */
    int holding;        /* the consumer holds batch next_batch - 1 */
    int wake_pending;   /* readers wait for the slot the consumer released (atomic) */
    int64_t released;   /* batches released by the consumer */
    int64_t inflight;   /* chunks being read outside the lock */
    int64_t wait_batch; /* batch the consumer waits for, -1 if none */
    int wait_idle;      /* the API thread waits for inflight == 0 */
    int64_t err_batch;  /* lowest failed batch; INT64_MAX if none */
    dio_error first_err;

    /* the ring */
    void **slot;
    size_t *slot_cap;

    /* counters (atomics) */
    int64_t opens, closes, bytes_read, read_ops;
};

/* ------------------------------------------------------------------ descriptors */

static void cache_flush(dio_engine *e, worker *w)
{
    if (!w->cache)
        return;
    for (int i = 0; i < e->cfg.fd_cache; i++) {
        if (w->cache[i].fd >= 0) {
            close(w->cache[i].fd);
            __atomic_fetch_add(&e->closes, 1, __ATOMIC_RELAXED);
        }
        w->cache[i].fd = -1;
        w->cache[i].file = -1;
    }
}

static int cache_init(dio_engine *e, worker *w)
{
    w->e = e;
    w->cache = malloc(sizeof(fd_ent) * (size_t)e->cfg.fd_cache);
    if (!w->cache)
        return -ENOMEM;
    for (int i = 0; i < e->cfg.fd_cache; i++) {
        w->cache[i].fd = -1;
        w->cache[i].file = -1;
    }
    return 0;
}

static int get_fd(dio_engine *e, worker *w, int64_t file, dio_error *err)
{
    fd_ent *ent = &w->cache[file % e->cfg.fd_cache];
    const char *path;
    int flags, fd, retried = 0;
    if (DIO_LIKELY(ent->file == file))
        return ent->fd;
    if (ent->fd >= 0) {
        close(ent->fd);
        __atomic_fetch_add(&e->closes, 1, __ATOMIC_RELAXED);
        ent->fd = -1;
        ent->file = -1;
    }
    path = e->paths[file];
    /* O_NONBLOCK: no effect on regular files, but a FIFO or device in the dataset must fail
     * below instead of blocking this thread (and with it the whole job) forever. */
    flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (e->cfg.odirect ? O_DIRECT : 0);
    for (;;) {
        fd = open(path, flags);
        if (fd >= 0)
            break;
        int er = errno;
        if (er == EINTR)
            continue;
        if ((er == EMFILE || er == ENFILE) && !retried) {
            cache_flush(e, w); /* out of descriptors: give back ours and try once more */
            retried = 1;
            continue;
        }
        if (e->cfg.odirect && er == EINVAL)
            return dio_fail_odirect(err, er, path, NULL);
        return dio_fail(err, er, path, "open %s: %s", path, strerror(er));
    }
    __atomic_fetch_add(&e->opens, 1, __ATOMIC_RELAXED);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        __atomic_fetch_add(&e->closes, 1, __ATOMIC_RELAXED);
        return dio_fail(err, EINVAL, path, "open %s: not a regular file", path);
    }
    if (e->cfg.odirect && dio_odirect_fs_check(fd) != 0) {
        close(fd);
        __atomic_fetch_add(&e->closes, 1, __ATOMIC_RELAXED);
        return dio_fail_odirect(err, EINVAL, path, DIO_WHY_EMULATED);
    }
    ent->file = file;
    ent->fd = fd;
    return fd;
}

/* ------------------------------------------------------------------ reading */

/* Read requests [first, last) of batch b into its slot.  Never takes the lock. */
static int read_chunk(dio_engine *e, worker *w, int64_t b, int64_t first, int64_t last,
                      chunk_result *r)
{
    char *base = e->slot[b % e->nslots];
    int64_t *lat = e->out_lat, *nread = e->out_nread;
    r->ndone = r->bytes = r->ops = r->end_ns = 0;
    for (int64_t i = first; i < last; i++) {
        const req *q = &e->reqs[i];
        int64_t got = 0, ops = 0, t0, t1;
        char *dst;
        int fd;
        if (DIO_UNLIKELY(q->rd_len == 0)) { /* zero-length request: nothing to transfer */
            if (lat)
                lat[i] = 0;
            if (nread)
                nread[i] = 0;
            r->ndone++;
            continue;
        }
        fd = get_fd(e, w, q->file, &w->err);
        if (DIO_UNLIKELY(fd < 0))
            return fd;
        dst = base + q->buf_pos;
        t0 = dio_now_ns();
        while (got < q->rd_len) {
            int64_t want = q->rd_len - got < PREAD_MAX ? q->rd_len - got : PREAD_MAX;
            ssize_t n = pread(fd, dst + got, (size_t)want, (off_t)(q->rd_off + got));
            if (DIO_LIKELY(n > 0)) {
                ops++;
                got += n;
                if (DIO_UNLIKELY(n < want && got >= q->need))
                    break; /* O_DIRECT extent clipped at end of file: no pread to see EOF */
                continue;
            }
            if (n == 0) {
                ops++;
                break; /* end of file */
            }
            int er = errno;
            if (er == EINTR)
                continue;
            ops++;
            r->bytes += got;
            r->ops += ops;
            const char *path = e->paths[q->file];
            if (e->cfg.odirect && er == EINVAL)
                return dio_fail_odirect(&w->err, er, path, NULL);
            return dio_fail(&w->err, er, path,
                            "pread %s at offset %lld (%lld bytes): %s", path,
                            (long long)(q->rd_off + got), (long long)want, strerror(er));
        }
        t1 = dio_now_ns();
        if (lat)
            lat[i] = t1 - t0;
        if (nread)
            nread[i] = got;
        r->bytes += got;
        r->ops += ops;
        r->end_ns = t1;
        if (DIO_UNLIKELY(got < q->need)) {
            int64_t have = got - (q->off - q->rd_off);
            const char *path = e->paths[q->file];
            if (have < 0)
                have = 0;
            return dio_fail(&w->err, EIO, path,
                            "short read of %s at offset %lld: expected %lld bytes, got %lld "
                            "(the file ends before offset + length)",
                            path, (long long)q->off, (long long)q->len, (long long)have);
        }
        r->ndone++;
    }
    return 0;
}

/* Under the lock: hand out the next chunk, if one is claimable. */
static int claim(dio_engine *e, int64_t *b, int64_t *first, int64_t *last)
{
    int64_t i, end, bytes = 0;
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
        bytes += e->reqs[i].rd_len;
        i++;
    } while (i < end && i - *first < CHUNK_MAX_REQ && bytes < CHUNK_MAX_BYTES);
    *last = e->cursor = i;
    e->inflight++;
    return 1;
}

/* Under the lock: account a chunk that was read (rc < 0: it failed with w->err). */
static void finish_chunk(dio_engine *e, worker *w, int64_t b, const chunk_result *r, int rc)
{
    batch_state *bs = &e->batches[b];
    int wake = 0;
    e->inflight--;
    bs->done += r->ndone;
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

static void *worker_main(void *arg)
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
        rc = read_chunk(e, w, b, first, last, &r);
        pthread_mutex_lock(&e->mu);
        finish_chunk(e, w, b, &r, rc);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Stop handing out work of the current epoch and wait until no chunk is being read. */
static void abandon_epoch(dio_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->active = 0;
    e->cursor = e->nreq;
    e->wait_idle = 1;
    while (e->inflight > 0)
        pthread_cond_wait(&e->done_cv, &e->mu);
    e->wait_idle = 0;
    e->holding = 0;
    pthread_mutex_unlock(&e->mu);
}

/* ------------------------------------------------------------------ lifecycle */

dio_engine *dio_engine_create(const dio_engine_config *cfg, dio_error *err)
{
    dio_engine *e;
    sigset_t all, old;
    int rc;
    dio_clear_error(err);
    if (!cfg) {
        dio_fail(err, EINVAL, "", "engine: no configuration");
        return NULL;
    }
    if (cfg->nthreads < 0 || cfg->nthreads > MAX_THREADS || cfg->prefetch < 0 ||
        cfg->prefetch > (1 << 20) || cfg->fd_cache < 1 || cfg->fd_cache > (1 << 24) ||
        (cfg->align & (cfg->align - 1)) != 0 || cfg->align > (1u << 30)) {
        dio_fail(err, EINVAL, "",
                 "engine: invalid configuration (threads %d, prefetch %d, fd_cache %d, "
                 "align %u): threads 0..%d, prefetch >= 0, fd_cache >= 1, align a power of two",
                 cfg->nthreads, cfg->prefetch, cfg->fd_cache, cfg->align, MAX_THREADS);
        return NULL;
    }
    e = calloc(1, sizeof *e);
    if (!e) {
        dio_fail(err, ENOMEM, "", "engine: out of memory");
        return NULL;
    }
    e->cfg = *cfg;
    if (e->cfg.align == 0)
        e->cfg.align = 4096;
    e->nslots = cfg->nthreads > 0 ? cfg->prefetch + 1 : 1;
    e->ext_align = cfg->odirect ? (int64_t)e->cfg.align : 1;
    e->place_align = cfg->odirect && e->cfg.align > PLACE_ALIGN ? (int64_t)e->cfg.align
                                                                 : PLACE_ALIGN;
    e->wait_batch = -1;
    e->err_batch = INT64_MAX;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work_cv, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    e->slot = calloc((size_t)e->nslots, sizeof *e->slot);
    e->slot_cap = calloc((size_t)e->nslots, sizeof *e->slot_cap);
    e->workers = calloc((size_t)(cfg->nthreads > 0 ? cfg->nthreads : 1), sizeof *e->workers);
    if (!e->slot || !e->slot_cap || !e->workers || cache_init(e, &e->self) != 0)
        goto nomem;
    for (int i = 0; i < cfg->nthreads; i++)
        if (cache_init(e, &e->workers[i]) != 0)
            goto nomem;
    /* workers block all signals: they are delivered to the application's threads */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < cfg->nthreads; i++) {
        rc = pthread_create(&e->workers[i].tid, NULL, worker_main, &e->workers[i]);
        if (rc != 0) {
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            e->nworkers = i;
            dio_engine_destroy(e);
            dio_fail(err, rc, "", "engine: cannot start reader thread %d: %s", i, strerror(rc));
            return NULL;
        }
        e->workers[i].started = 1;
        e->nworkers = i + 1;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return e;
nomem:
    dio_engine_destroy(e);
    dio_fail(err, ENOMEM, "", "engine: out of memory");
    return NULL;
}

static void free_paths(char **paths, int64_t n)
{
    if (!paths)
        return;
    for (int64_t i = 0; i < n; i++)
        free(paths[i]);
    free(paths);
}

void dio_engine_destroy(dio_engine *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    e->active = 0;
    pthread_cond_broadcast(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < e->nworkers; i++)
        if (e->workers[i].started)
            pthread_join(e->workers[i].tid, NULL);
    if (e->workers) {
        int n = e->cfg.nthreads > 0 ? e->cfg.nthreads : 1;
        for (int i = 0; i < n; i++) {
            cache_flush(e, &e->workers[i]);
            free(e->workers[i].cache);
        }
    }
    cache_flush(e, &e->self);
    free(e->self.cache);
    free(e->workers);
    if (e->slot)
        for (int i = 0; i < e->nslots; i++)
            free(e->slot[i]);
    free(e->slot);
    free(e->slot_cap);
    free(e->reqs);
    free(e->batches);
    free_paths(e->paths, e->nfiles);
    pthread_cond_destroy(&e->work_cv);
    pthread_cond_destroy(&e->done_cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

int dio_engine_set_files(dio_engine *e, int64_t nfiles, const char *const *paths, dio_error *err)
{
    char **copy;
    dio_clear_error(err);
    if (!e || nfiles < 0 || (nfiles > 0 && !paths))
        return dio_fail(err, EINVAL, "", "set_files: invalid arguments");
    copy = calloc((size_t)(nfiles > 0 ? nfiles : 1), sizeof *copy);
    if (!copy)
        return dio_fail(err, ENOMEM, "", "set_files: out of memory (%lld files)",
                        (long long)nfiles);
    for (int64_t i = 0; i < nfiles; i++) {
        if (!paths[i]) {
            free_paths(copy, i);
            return dio_fail(err, EINVAL, "", "set_files: path %lld is NULL", (long long)i);
        }
        copy[i] = strdup(paths[i]);
        if (!copy[i]) {
            free_paths(copy, i);
            return dio_fail(err, ENOMEM, "", "set_files: out of memory");
        }
    }
    abandon_epoch(e); /* the old epoch's file indices mean nothing with the new table */
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->nworkers; i++)
        cache_flush(e, &e->workers[i]);
    cache_flush(e, &e->self);
    free_paths(e->paths, e->nfiles);
    e->paths = copy;
    e->nfiles = nfiles;
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* ------------------------------------------------------------------ epochs */

static int grow(void **p, int64_t *cap, int64_t need, size_t elem)
{
    void *q;
    int64_t n;
    if (need <= *cap)
        return 0;
    n = *cap * 2 > need ? *cap * 2 : need;
    q = realloc(*p, (size_t)n * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

/* Make every slot hold at least need bytes.  Buffers only grow and are reused across epochs;
 * fresh memory is faulted in here so that the first batches do not pay for it. */
static int grow_slots(dio_engine *e, int64_t need, dio_error *err)
{
    size_t align = e->cfg.align > 4096 ? e->cfg.align : 4096;
    if (need <= 0)
        return 0;
    if ((uint64_t)need > (uint64_t)SIZE_MAX / 2)
        return dio_fail(err, ENOMEM, "", "start_epoch: batch buffer of %lld bytes is too large",
                        (long long)need);
    if ((size_t)need >= HUGE_ALIGN && align < HUGE_ALIGN)
        align = HUGE_ALIGN;
    for (int s = 0; s < e->nslots; s++) {
        void *p = NULL;
        size_t size;
        if (e->slot_cap[s] >= (size_t)need)
            continue;
        size = ((size_t)need + 4095) & ~(size_t)4095;
        free(e->slot[s]);
        e->slot[s] = NULL;
        e->slot_cap[s] = 0;
        if (posix_memalign(&p, align, size) != 0)
            return dio_fail(err, ENOMEM, "",
                            "start_epoch: cannot allocate %zu bytes for batch buffer %d of %d "
                            "(prefetch + 1 buffers of the largest batch)",
                            size, s + 1, e->nslots);
#ifdef MADV_HUGEPAGE
        if (size >= HUGE_ALIGN)
            madvise(p, size, MADV_HUGEPAGE);
#endif
        for (size_t i = 0; i < size; i += 4096)
            ((volatile char *)p)[i] = 0;
        e->slot[s] = p;
        e->slot_cap[s] = size;
    }
    return 0;
}

int dio_engine_start_epoch(dio_engine *e, int64_t nbatches, const int64_t *batch_start,
                           const int64_t *file_idx, const int64_t *offset, const int64_t *length,
                           int64_t *req_buf_off, int64_t *lat_ns, int64_t *nread, dio_error *err)
{
    int64_t nreq, footprint = 0, al, pa;
    int rc;
    dio_clear_error(err);
    if (!e || nbatches < 0 || !batch_start)
        return dio_fail(err, EINVAL, "", "start_epoch: invalid arguments");
    if (batch_start[0] != 0)
        return dio_fail(err, EINVAL, "", "start_epoch: batch_start[0] is %lld, not 0",
                        (long long)batch_start[0]);
    for (int64_t b = 0; b < nbatches; b++)
        if (batch_start[b + 1] < batch_start[b])
            return dio_fail(err, EINVAL, "",
                            "start_epoch: batch_start decreases at batch %lld (%lld -> %lld)",
                            (long long)b, (long long)batch_start[b],
                            (long long)batch_start[b + 1]);
    nreq = batch_start[nbatches];
    if (nreq > 0 && (!file_idx || !offset || !length))
        return dio_fail(err, EINVAL, "", "start_epoch: missing request arrays");
    al = e->ext_align;
    for (int64_t i = 0; i < nreq; i++) {
        if (file_idx[i] < 0 || file_idx[i] >= e->nfiles)
            return dio_fail(err, EINVAL, "",
                            "start_epoch: request %lld names file %lld, but the file table has "
                            "%lld files",
                            (long long)i, (long long)file_idx[i], (long long)e->nfiles);
        if (offset[i] < 0 || length[i] < 0 || offset[i] > INT64_MAX / 2 - length[i] - al)
            return dio_fail(err, EINVAL, e->paths[file_idx[i]],
                            "start_epoch: request %lld on %s has an invalid extent (offset "
                            "%lld, length %lld)",
                            (long long)i, e->paths[file_idx[i]], (long long)offset[i],
                            (long long)length[i]);
    }

    abandon_epoch(e);

    if (grow((void **)&e->reqs, &e->reqs_cap, nreq > 0 ? nreq : 1, sizeof(req)) != 0 ||
        grow((void **)&e->batches, &e->batches_cap, nbatches > 0 ? nbatches : 1,
             sizeof(batch_state)) != 0)
        return dio_fail(err, ENOMEM, "", "start_epoch: out of memory (%lld requests)",
                        (long long)nreq);

    /* place each request's extent in its batch buffer */
    pa = e->place_align;
    for (int64_t b = 0; b < nbatches; b++) {
        batch_state *bs = &e->batches[b];
        int64_t pos = 0, asked = 0;
        memset(bs, 0, sizeof *bs);
        bs->start = batch_start[b];
        bs->end = batch_start[b + 1];
        for (int64_t i = bs->start; i < bs->end; i++) {
            req *q = &e->reqs[i];
            int64_t off = offset[i], len = length[i];
            q->file = file_idx[i];
            q->off = off;
            q->len = len;
            if (len == 0) {
                q->rd_off = off;
                q->rd_len = q->need = 0;
            } else {
                q->rd_off = off / al * al;
                q->rd_len = (off + len + al - 1) / al * al - q->rd_off;
                q->need = off + len - q->rd_off;
            }
            pos = (pos + pa - 1) / pa * pa;
            if (pos > INT64_MAX / 4 - q->rd_len)
                return dio_fail(err, ENOMEM, "", "start_epoch: batch %lld is too large",
                                (long long)b);
            q->buf_pos = pos;
            if (req_buf_off)
                req_buf_off[i] = pos + (off - q->rd_off);
            pos += q->rd_len;
            asked += len;
        }
        bs->data_len = pos;
        bs->bytes_requested = asked;
        if (pos > footprint)
            footprint = pos;
    }
    rc = grow_slots(e, footprint, err);
    if (rc < 0)
        return rc;

    pthread_mutex_lock(&e->mu);
    e->nbatches = nbatches;
    e->nreq = nreq;
    e->out_lat = lat_ns;
    e->out_nread = nread;
    e->cursor = 0;
    e->cur_batch = 0;
    e->next_batch = 0;
    e->holding = 0;
    e->released = 0;
    e->wait_batch = -1;
    e->err_batch = INT64_MAX;
    dio_clear_error(&e->first_err);
    e->active = 1;
    if (e->nworkers > 0 && nreq > 0)
        pthread_cond_broadcast(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

static void wake_readers(dio_engine *e)
{
    if (__atomic_exchange_n(&e->wake_pending, 0, __ATOMIC_ACQ_REL))
        pthread_cond_broadcast(&e->work_cv);
}

void dio_engine_wake(dio_engine *e)
{
    if (e)
        wake_readers(e);
}

int dio_engine_next(dio_engine *e, dio_batch *out, int flags, dio_error *err)
{
    batch_state *bs;
    int64_t b, n;
    dio_clear_error(err);
    if (!e || !out)
        return dio_fail(err, EINVAL, "", "next: invalid arguments");
    pthread_mutex_lock(&e->mu);
    if (!e->active) {
        pthread_mutex_unlock(&e->mu);
        return 0;
    }
    if (e->holding) {
        e->holding = 0;
        e->released = e->next_batch;
        if (e->nworkers > 0 && e->cursor < e->nreq)
            __atomic_store_n(&e->wake_pending, 1, __ATOMIC_RELEASE);
    }
    if (!(flags & DIO_NEXT_DEFER_WAKE))
        wake_readers(e);
    b = e->next_batch;
    if (b >= e->nbatches && e->err_batch == INT64_MAX) {
        pthread_mutex_unlock(&e->mu);
        return 0;
    }
    if (e->err_batch > b) { /* then b < nbatches */
        bs = &e->batches[b];
        n = bs->end - bs->start;
        if (e->nworkers == 0) {
            if (bs->done < n) { /* read the batch here, in the calling thread */
                chunk_result r;
                int rc;
                e->cursor = bs->end;
                e->inflight++;
                pthread_mutex_unlock(&e->mu);
                rc = read_chunk(e, &e->self, b, bs->start, bs->end, &r);
                pthread_mutex_lock(&e->mu);
                finish_chunk(e, &e->self, b, &r, rc);
            }
        } else {
            if (bs->done < n)
                wake_readers(e); /* never sleep on readers that wait for our release */
            e->wait_batch = b;
            while (bs->done < n && e->err_batch > b)
                pthread_cond_wait(&e->done_cv, &e->mu);
            e->wait_batch = -1;
        }
    }
    if (e->err_batch <= b) { /* sticky until the next epoch */
        int code = e->first_err.code ? e->first_err.code : EIO;
        if (err)
            *err = e->first_err;
        pthread_mutex_unlock(&e->mu);
        return -code;
    }
    bs = &e->batches[b];
    n = bs->end - bs->start;
    if (bs->ready_ns == 0)
        bs->ready_ns = dio_now_ns(); /* empty batch */
    out->index = b;
    out->data = e->slot[b % e->nslots];
    out->data_len = bs->data_len;
    out->nreq = n;
    out->bytes_requested = bs->bytes_requested;
    out->bytes_read = bs->bytes_read;
    out->read_ops = bs->read_ops;
    out->ready_ns = bs->ready_ns;
    e->next_batch = b + 1;
    e->holding = 1;
    pthread_mutex_unlock(&e->mu);
    return 1;
}

void dio_engine_get_counters(const dio_engine *e, dio_engine_counters *out)
{
    if (!out)
        return;
    if (!e) {
        memset(out, 0, sizeof *out);
        return;
    }
    out->opens = __atomic_load_n(&e->opens, __ATOMIC_RELAXED);
    out->closes = __atomic_load_n(&e->closes, __ATOMIC_RELAXED);
    out->bytes_read = __atomic_load_n(&e->bytes_read, __ATOMIC_RELAXED);
    out->read_ops = __atomic_load_n(&e->read_ops, __ATOMIC_RELAXED);
}
