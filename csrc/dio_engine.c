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
 * CHUNK_MAX_BYTES, at least one, never splitting an access: DIO_REQ_OPEN .. DIO_REQ_CLOSE;
 * with whole_batches, the whole batch, as a DataLoader's worker makes it).
 * A worker reads its chunk without the lock, then adds it to its batch's completed count
 * under the lock; the consumer sleeps on done_cv until its batch is complete or failed.
 *
 * Descriptors: a request inside an access uses the descriptor its DIO_REQ_OPEN opened;
 * any other request uses its thread's LRU cache (dio_fdcache.c).  Caches are only touched by
 * their owner while it reads a chunk (counted in `inflight`), so with inflight == 0 and the
 * mutex held the API thread may clear them (set_files, close_files, destroy).
 *
 * Errors: the first failure (lowest batch) is kept with its message; the cursor stops, and
 * dio_engine_next returns -errno for that batch and for every later call until a new epoch
 * starts (the error is sticky).  Batches before the failed one are delivered normally.
 *
 * Watchdog: each reader publishes the open or read it has in flight (watch_slot: when it began,
 * reusing the clock read the latency needs, and which file), lock-free.  A thread waiting for
 * the readers waits on done_cv with a timeout at the moment the oldest unreported one reaches
 * watchdog_ns, then reports it (or fails with it): a reader stuck in the kernel cannot be
 * interrupted, but the rank it belongs to can say so and end.
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

/* ------------------------------------------------------------------ lifecycle */

dio_engine *dio_engine_create(const dio_engine_config *cfg, dio_error *err)
{
    dio_engine *e;
    sigset_t all, old;
    int rc, per_thread;
    dio_clear_error(err);
    if (!cfg) {
        dio_fail(err, EINVAL, "", "engine: no configuration");
        return NULL;
    }
    if (cfg->nthreads < 0 || cfg->nthreads > DIO_MAX_THREADS || cfg->prefetch < 0 ||
        cfg->prefetch > (1 << 20) || cfg->fd_cache < 1 || cfg->fd_cache > (1 << 24) ||
        (cfg->align & (cfg->align - 1)) != 0 || cfg->align > (1u << 30)) {
        dio_fail(err, EINVAL, "",
                 "engine: invalid configuration (threads %d, prefetch %d, fd_cache %d, "
                 "align %u): threads 0..%d, prefetch 0..2^20, fd_cache 1..2^24, align a "
                 "power of two",
                 cfg->nthreads, cfg->prefetch, cfg->fd_cache, cfg->align, DIO_MAX_THREADS);
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
    e->self.access_fd = -1;
    snprintf(e->who, sizeof e->who, "%s", cfg->who ? cfg->who : "");
    eng_arm_stall(e);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work_cv, NULL);
    {
        pthread_condattr_t monotonic; /* the watchdog's timed waits use dio_now_ns's clock */
        pthread_condattr_init(&monotonic);
        pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
        pthread_cond_init(&e->done_cv, &monotonic);
        pthread_condattr_destroy(&monotonic);
    }
    e->slot = calloc((size_t)e->nslots, sizeof *e->slot);
    e->slot_cap = calloc((size_t)e->nslots, sizeof *e->slot_cap);
    e->workers = calloc((size_t)(cfg->nthreads > 0 ? cfg->nthreads : 1), sizeof *e->workers);
    per_thread = cfg->fd_cache / (cfg->nthreads > 0 ? cfg->nthreads : 1);
    if (!e->slot || !e->slot_cap || !e->workers || eng_worker_init(e, &e->self, cfg->fd_cache) != 0)
        goto nomem;
    for (int i = 0; i < cfg->nthreads; i++)
        if (eng_worker_init(e, &e->workers[i], per_thread) != 0)
            goto nomem;
    /* workers block all signals: they are delivered to the application's threads */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < cfg->nthreads; i++) {
        rc = pthread_create(&e->workers[i].tid, NULL, eng_worker_main, &e->workers[i]);
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
            eng_flush_worker(e, &e->workers[i]);
            fd_cache_free(&e->workers[i].cache);
            free(e->workers[i].scratch);
            free(e->workers[i].fill_buf);
        }
    }
    eng_flush_worker(e, &e->self);
    fd_cache_free(&e->self.cache);
    free(e->self.scratch);
    free(e->self.fill_buf);
    free(e->workers);
    if (e->slot)
        for (int i = 0; i < e->nslots; i++)
            free(e->slot[i]);
    free(e->slot);
    free(e->slot_cap);
    free(e->reqs);
    free(e->batches);
    eng_table_free(&e->files);
    eng_table_free(&e->cache);
    free(e->tmp_suffix);
    free(e->evict_at);
    free(e->evict_file);
    free(e->stall_suffix);
    pthread_cond_destroy(&e->work_cv);
    pthread_cond_destroy(&e->done_cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
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

/* Check a plan before anything is abandoned: batch bounds, file indices, extents, accesses
 * (DIO_REQ_OPEN .. DIO_REQ_CLOSE within one batch, on one file, not nested). */
static int check_plan(dio_engine *e, const dio_epoch_plan *p, dio_error *err)
{
    const int64_t *bs = p->batch_start;
    char buf[PATH_MAX_LEN];
    int64_t nreq, al = e->ext_align;
    if (p->nbatches < 0 || !bs)
        return dio_fail(err, EINVAL, "", "start_epoch: invalid arguments");
    if (bs[0] != 0)
        return dio_fail(err, EINVAL, "", "start_epoch: batch_start[0] is %lld, not 0",
                        (long long)bs[0]);
    for (int64_t b = 0; b < p->nbatches; b++)
        if (bs[b + 1] < bs[b])
            return dio_fail(err, EINVAL, "",
                            "start_epoch: batch_start decreases at batch %lld (%lld -> %lld)",
                            (long long)b, (long long)bs[b], (long long)bs[b + 1]);
    nreq = bs[p->nbatches];
    if (nreq > 0 && (!p->file_idx || !p->offset || !p->length))
        return dio_fail(err, EINVAL, "", "start_epoch: missing request arrays");
    for (int64_t b = 0, i = 0; b < p->nbatches; b++) {
        int64_t access_file = -1;
        for (; i < bs[b + 1]; i++) {
            int64_t f = p->file_idx[i], off = p->offset[i], len = p->length[i];
            int64_t expect = p->expect ? p->expect[i] : len;
            uint32_t fl = p->flags ? p->flags[i] : 0;
            if (f < 0 || f >= e->files.nfiles)
                return dio_fail(err, EINVAL, "",
                                "start_epoch: request %lld names file %lld, but the file table "
                                "has %lld files", (long long)i, (long long)f,
                                (long long)e->files.nfiles);
            if (off < 0 || len < 0 || off > INT64_MAX / 2 - len - al || expect < 0 ||
                expect > len) {
                const char *path = eng_file_path(&e->files, f, buf);
                return dio_fail(err, EINVAL, path,
                                "start_epoch: request %lld on %s has an invalid extent (offset "
                                "%lld, length %lld, expect %lld)", (long long)i, path,
                                (long long)off, (long long)len, (long long)expect);
            }
            if (((fl & DIO_REQ_OPEN) && access_file >= 0) ||
                (!(fl & DIO_REQ_OPEN) && access_file >= 0 && f != access_file) ||
                ((fl & DIO_REQ_CLOSE) && access_file < 0 && !(fl & DIO_REQ_OPEN)))
                return dio_fail(err, EINVAL, "",
                                "start_epoch: request %lld breaks an access (open .. close on "
                                "one file within one batch)", (long long)i);
            if ((fl & (DIO_REQ_CACHED | DIO_REQ_FILL)) && f >= e->cache.nfiles)
                return dio_fail(err, EINVAL, "",
                                "start_epoch: request %lld reads the cache tier's copy of file "
                                "%lld, but the cache tier has %lld files", (long long)i,
                                (long long)f, (long long)e->cache.nfiles);
            if (fl & DIO_REQ_OPEN)
                access_file = f;
            if (fl & DIO_REQ_CLOSE)
                access_file = -1;
        }
        if (access_file >= 0)
            return dio_fail(err, EINVAL, "",
                            "start_epoch: an access of batch %lld is not closed", (long long)b);
    }
    if (p->evict_at) {
        if (!p->evict_file && p->evict_at[nreq] > 0)
            return dio_fail(err, EINVAL, "", "start_epoch: evictions without their files");
        if (p->evict_at[0] != 0)
            return dio_fail(err, EINVAL, "", "start_epoch: evict_at[0] is not 0");
        for (int64_t i = 0; i < nreq; i++)
            if (p->evict_at[i + 1] < p->evict_at[i])
                return dio_fail(err, EINVAL, "", "start_epoch: evict_at decreases at %lld",
                                (long long)i);
        for (int64_t k = 0; k < p->evict_at[nreq]; k++)
            if (p->evict_file[k] < 0 || p->evict_file[k] >= e->cache.nfiles)
                return dio_fail(err, EINVAL, "",
                                "start_epoch: eviction %lld names file %lld outside the cache "
                                "tier's %lld files", (long long)k, (long long)p->evict_file[k],
                                (long long)e->cache.nfiles);
    }
    return 0;
}

/* Where a request [off, off + len) goes in its batch buffer, after what is placed below
 * `pos`: the next place-aligned position (returned); its extent [*rd_off, *rd_off + *rd_len)
 * is the request widened to `al` (O_DIRECT alignment; 1 without), empty for an empty one.
 * The one placement both the footprint and the epoch use. */
static int64_t place_extent(const dio_engine *e, int64_t pos, int64_t off, int64_t len,
                            int64_t *rd_off, int64_t *rd_len)
{
    int64_t al = e->ext_align, pa = e->place_align;
    *rd_off = len == 0 ? off : off / al * al;
    *rd_len = len == 0 ? 0 : (off + len + al - 1) / al * al - *rd_off;
    return (pos + pa - 1) / pa * pa;
}

/* The largest batch's buffer footprint: its extents placed as the epoch places them. */
static int64_t plan_footprint(const dio_engine *e, const dio_epoch_plan *p)
{
    int64_t footprint = 0, rd_off, rd_len;
    for (int64_t b = 0; b < p->nbatches; b++) {
        int64_t pos = 0;
        for (int64_t i = p->batch_start[b]; i < p->batch_start[b + 1]; i++) {
            pos = place_extent(e, pos, p->offset[i], p->length[i], &rd_off, &rd_len);
            pos += rd_len;
        }
        if (pos > footprint)
            footprint = pos;
    }
    return footprint;
}

int dio_engine_reserve(dio_engine *e, const dio_epoch_plan *p, dio_error *err)
{
    int rc;
    dio_clear_error(err);
    if (!e || !p)
        return dio_fail(err, EINVAL, "", "reserve: invalid arguments");
    if ((rc = check_plan(e, p, err)) < 0)
        return rc;
    if (e->cfg.discard)
        return 0;
    eng_abandon_epoch(e);
    return grow_slots(e, plan_footprint(e, p), err);
}

/* The epoch's requests and batches from the plan, each request's extent placed in its batch
 * buffer (place_extent); *footprint: the largest batch's bytes. */
static int place_requests(dio_engine *e, const dio_epoch_plan *p, const dio_epoch_outputs *out,
                          int64_t *footprint, dio_error *err)
{
    *footprint = 0;
    for (int64_t b = 0; b < p->nbatches; b++) {
        batch_state *bs = &e->batches[b];
        int64_t pos = 0, asked = 0;
        memset(bs, 0, sizeof *bs);
        bs->start = p->batch_start[b];
        bs->end = p->batch_start[b + 1];
        for (int64_t i = bs->start; i < bs->end; i++) {
            req *q = &e->reqs[i];
            int64_t off = p->offset[i], len = p->length[i];
            int64_t expect = p->expect ? p->expect[i] : len;
            q->file = p->file_idx[i];
            q->off = off;
            q->len = len;
            q->flags = p->flags ? p->flags[i] : 0;
            q->delay_ns = p->delay_ns && p->delay_ns[i] > 0 ? p->delay_ns[i] : 0;
            q->cpu_ns = p->cpu_ns && p->cpu_ns[i] > 0 ? p->cpu_ns[i] : 0;
            q->to_eof = expect < len;
            pos = place_extent(e, pos, off, len, &q->rd_off, &q->rd_len);
            q->need = len == 0 ? 0 : off + expect - q->rd_off;
            if (pos > INT64_MAX / 4 - q->rd_len)
                return dio_fail(err, ENOMEM, "", "start_epoch: batch %lld is too large",
                                (long long)b);
            q->buf_pos = pos;
            if (out && out->req_buf_off)
                out->req_buf_off[i] = pos + (off - q->rd_off);
            pos += q->rd_len;
            asked += len;
        }
        bs->data_len = pos;
        bs->bytes_requested = asked;
        if (pos > *footprint)
            *footprint = pos;
    }
    return 0;
}

/* The cache tier's evictions of the epoch, copied from the plan (none: nothing). */
static int copy_evictions(dio_engine *e, const dio_epoch_plan *p, int64_t nreq, dio_error *err)
{
    int64_t nev;
    if (!p->evict_at)
        return 0;
    nev = p->evict_at[nreq];
    if (grow((void **)&e->evict_at, &e->evict_at_cap, nreq + 1, sizeof(int64_t)) != 0 ||
        grow((void **)&e->evict_file, &e->evict_file_cap, nev > 0 ? nev : 1,
             sizeof(int64_t)) != 0)
        return dio_fail(err, ENOMEM, "", "start_epoch: out of memory (evictions)");
    memcpy(e->evict_at, p->evict_at, (size_t)(nreq + 1) * sizeof(int64_t));
    if (nev > 0)
        memcpy(e->evict_file, p->evict_file, (size_t)nev * sizeof(int64_t));
    return 0;
}

/* Under the lock: the epoch starts (its outputs set, the cursor at 0, the readers woken). */
static void begin_epoch(dio_engine *e, const dio_epoch_plan *p, const dio_epoch_outputs *out,
                        int64_t nreq)
{
    pthread_mutex_lock(&e->mu);
    e->nbatches = p->nbatches;
    e->nreq = nreq;
    e->evict_at_on = p->evict_at != NULL;
    e->not_before = p->not_before_ns;
    e->out_lat = out ? out->lat_ns : NULL;
    e->out_nread = out ? out->nread : NULL;
    /* both or neither */
    e->out_start = out && out->start_ns && out->thread ? out->start_ns : NULL;
    e->out_thread = e->out_start ? out->thread : NULL;
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
}

int dio_engine_start_epoch(dio_engine *e, const dio_epoch_plan *p, const dio_epoch_outputs *out,
                           dio_error *err)
{
    int64_t nreq, footprint;
    int rc;
    dio_clear_error(err);
    if (!e || !p)
        return dio_fail(err, EINVAL, "", "start_epoch: invalid arguments");
    if ((rc = check_plan(e, p, err)) < 0)
        return rc;
    nreq = p->batch_start[p->nbatches];

    eng_abandon_epoch(e);

    if (grow((void **)&e->reqs, &e->reqs_cap, nreq > 0 ? nreq : 1, sizeof(req)) != 0 ||
        grow((void **)&e->batches, &e->batches_cap, p->nbatches > 0 ? p->nbatches : 1,
             sizeof(batch_state)) != 0)
        return dio_fail(err, ENOMEM, "", "start_epoch: out of memory (%lld requests)",
                        (long long)nreq);
    if ((rc = place_requests(e, p, out, &footprint, err)) < 0)
        return rc;
    rc = e->cfg.discard ? 0 : grow_slots(e, footprint, err);
    if (rc < 0 || (rc = copy_evictions(e, p, nreq, err)) < 0)
        return rc;
    begin_epoch(e, p, out, nreq);
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

/* Under the lock: poll for the `n` requests of batch `bs` being done, for up to poll_ns, with
 * the lock released (readers update bs->done under it with atomic stores); the time spent is
 * added to *polled_ns (if not NULL). */
static void poll_batch(dio_engine *e, const batch_state *bs, int64_t n, int64_t poll_ns,
                       int64_t *polled_ns)
{
    int64_t began = dio_now_ns(), now = began;
    pthread_mutex_unlock(&e->mu);
    while (__atomic_load_n(&bs->done, __ATOMIC_ACQUIRE) < n && now - began < poll_ns) {
        sched_yield();
        now = dio_now_ns();
    }
    pthread_mutex_lock(&e->mu);
    if (polled_ns)
        *polled_ns += now - began;
}

int dio_engine_next(dio_engine *e, dio_batch *out, int flags, dio_error *err)
{
    return dio_engine_next_polling(e, out, flags, 0, NULL, err);
}

int dio_engine_next_polling(dio_engine *e, dio_batch *out, int flags, int64_t poll_ns,
                            int64_t *polled_ns, dio_error *err)
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
                rc = eng_read_chunk(e, &e->self, b, bs->start, bs->end, &r);
                pthread_mutex_lock(&e->mu);
                eng_finish_chunk(e, &e->self, b, &r, rc);
            }
        } else {
            if (bs->done < n)
                wake_readers(e); /* never sleep on readers that wait for our release */
            if (poll_ns > 0 && bs->done < n && e->err_batch > b)
                poll_batch(e, bs, n, poll_ns, polled_ns);
            e->wait_batch = b;
            while (bs->done < n && e->err_batch > b)
                if (eng_wait_readers(e, 1, &e->first_err) < 0) { /* the watchdog ends the epoch */
                    e->err_batch = b;
                    e->cursor = e->nreq;
                }
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
    out->data = e->cfg.discard ? NULL : e->slot[b % e->nslots];
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
    out->stats = __atomic_load_n(&e->stats, __ATOMIC_RELAXED);
    out->bytes_read = __atomic_load_n(&e->bytes_read, __ATOMIC_RELAXED);
    out->read_ops = __atomic_load_n(&e->read_ops, __ATOMIC_RELAXED);
    out->cache_reads = __atomic_load_n(&e->cache_reads, __ATOMIC_RELAXED);
    out->cache_fills = __atomic_load_n(&e->cache_fills, __ATOMIC_RELAXED);
    out->cache_fill_bytes = __atomic_load_n(&e->cache_fill_bytes, __ATOMIC_RELAXED);
    out->cache_fill_ns = __atomic_load_n(&e->cache_fill_ns, __ATOMIC_RELAXED);
    out->cache_evictions = __atomic_load_n(&e->cache_evictions, __ATOMIC_RELAXED);
    out->cache_fallbacks = __atomic_load_n(&e->cache_fallbacks, __ATOMIC_RELAXED);
    out->cache_fallback_reads = __atomic_load_n(&e->cache_fallback_reads, __ATOMIC_RELAXED);
    out->cache_fallback_bytes = __atomic_load_n(&e->cache_fallback_bytes, __ATOMIC_RELAXED);
    out->cache_hit_fallbacks = __atomic_load_n(&e->cache_hit_fallbacks, __ATOMIC_RELAXED);
    out->cache_fill_failures = __atomic_load_n(&e->cache_fill_failures, __ATOMIC_RELAXED);
    out->preprocess_cpu_ns = __atomic_load_n(&e->preprocess_cpu_ns, __ATOMIC_RELAXED);
    out->preprocess_wall_ns = __atomic_load_n(&e->preprocess_wall_ns, __ATOMIC_RELAXED);
}
