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

#include "dio_fdcache.h"
#include "dio_internal.h"

#define CHUNK_MAX_REQ 64
#define CHUNK_MAX_BYTES ((int64_t)4 << 20)
#define PREAD_MAX ((int64_t)1 << 30) /* one pread moves at most this (Linux caps at ~2 GiB) */
#define MAX_THREADS 4096
#define PLACE_ALIGN 64               /* request placement in a batch buffer without O_DIRECT */
#define HUGE_ALIGN ((size_t)2 << 20)
#define PATH_MAX_LEN 4096
#define WHO_MAX_LEN 64
#define STALL_ENV "DLIO_MPI_TEST_STALL"

enum { WATCH_OPEN = 1, WATCH_READ = 2 };

/* The open or read a reader has in flight, for the watchdog.  The reader writes file and op,
 * then since (release); it clears since when done.  The watcher reads since, file, op, since
 * again, and trusts them only if since did not change. */
typedef struct watch_slot {
    int64_t since;    /* dio_now_ns() when it began; 0 = nothing in flight */
    int64_t file;     /* index into the file table */
    int     op;       /* WATCH_OPEN or WATCH_READ */
    int64_t reported; /* the watcher's own: `since` of the last one it reported */
} watch_slot;

typedef struct req {
    int64_t  file;    /* index into the file table */
    int64_t  rd_off;  /* file offset of the extent read (aligned down with O_DIRECT) */
    int64_t  rd_len;  /* bytes of the extent (aligned up with O_DIRECT) */
    int64_t  need;    /* bytes of the extent that must arrive: (offset + expect) - rd_off */
    int64_t  buf_pos; /* where the extent starts in the batch buffer */
    int64_t  off;     /* the request as planned, for messages */
    int64_t  len;
    uint32_t flags;   /* DIO_REQ_* */
    int      to_eof;  /* expect < len: exactly need bytes arrive, the file ends there */
    int64_t  delay_ns; /* slept after the read (preprocessing), 0 = none */
    int64_t  cpu_ns;   /* then CPU time spent (preprocessing, dio_burn_cpu_ns), 0 = none */
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

#define CACHE_KEY ((int64_t)1 << 62) /* fd cache key of a file's cache-tier copy: file | it */
#define FILL_BUF ((size_t)8 << 20)     /* a fill's copy calls */

typedef struct worker {
    dio_engine *e;
    pthread_t tid;
    int started;
    fd_cache cache;
    int access_fd;       /* descriptor of the access in progress, -1 if none */
    int64_t access_file;
    char path[PATH_MAX_LEN]; /* a pattern file's name, formatted here */
    char cpath[PATH_MAX_LEN]; /* its cache-tier copy's */
    char tpath[PATH_MAX_LEN + 64]; /* a fill's temporary */
    void *fill_buf;      /* FILL_BUF bytes, aligned; allocated by the first fill */
    char *scratch;       /* with discard: where every request of this thread lands */
    size_t scratch_cap;
    dio_error err;       /* this thread's last failure, copied into the engine under the lock */
    watch_slot watch;    /* what it is blocked on, for the watchdog */
} worker;

typedef struct chunk_result {
    int64_t ndone, bytes, ops, end_ns;
} chunk_result;

/* How file indices become paths: a list, or DLIO's naming formula. */
typedef struct file_table {
    int64_t nfiles;
    char **paths;        /* explicit list (NULL with a pattern) */
    char *folder;        /* pattern: <folder>/[<sub>/]<stem><index><tail> */
    int64_t subfolders;  /* > 1: subfolder index mod subfolders, zero-padded */
    int sub_digits, digits;
    char *stem, *tail;
} file_table;

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

    file_table files;
    file_table cache;    /* the cache tier's copies (nfiles 0: none) */
    char *tmp_suffix;    /* of a fill's temporaries */

    /* the epoch */
    int active;
    int64_t nbatches, nreq;
    req *reqs;
    int64_t reqs_cap;
    int64_t *evict_at, *evict_file; /* copies of the plan's */
    int evict_at_on;                /* this epoch's plan has evictions */
    int64_t evict_at_cap, evict_file_cap;
    batch_state *batches;
    int64_t batches_cap;
    int64_t *out_lat, *out_nread;
    int64_t *out_start, *out_thread; /* tracing only, else NULL */
    int64_t not_before; /* no chunk of the epoch starts before (the loader's start-up) */
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
    int64_t opens, closes, stats, bytes_read, read_ops;
    int64_t cache_reads, cache_fills, cache_fill_bytes, cache_fill_ns, cache_evictions,
        cache_fallbacks;
    int64_t preprocess_cpu_ns, preprocess_wall_ns;

    char who[WHO_MAX_LEN]; /* named in watchdog reports; "" = nobody */

    /* the test hook (STALL_ENV): the first `stall_op` of a path ending with stall_suffix
     * sleeps stall_ns (> 0: the hook is set); stall_armed (atomic) until it has */
    int stall_op, stall_armed;
    int64_t stall_ns;
    char *stall_suffix;
};

/* ------------------------------------------------------------------ file table */

static void table_free(file_table *t)
{
    if (t->paths)
        for (int64_t i = 0; i < t->nfiles; i++)
            free(t->paths[i]);
    free(t->paths);
    free(t->folder);
    free(t->stem);
    free(t->tail);
    memset(t, 0, sizeof *t);
}

/* The path of file `file`; pattern names are formatted into buf (PATH_MAX_LEN bytes). */
static const char *file_path(const file_table *t, int64_t file, char *buf)
{
    if (t->paths)
        return t->paths[file];
    if (t->subfolders > 1)
        snprintf(buf, PATH_MAX_LEN, "%s/%0*lld/%s%0*lld%s", t->folder, t->sub_digits,
                 (long long)(file % t->subfolders), t->stem, t->digits, (long long)file,
                 t->tail);
    else
        snprintf(buf, PATH_MAX_LEN, "%s/%s%0*lld%s", t->folder, t->stem, t->digits,
                 (long long)file, t->tail);
    return buf;
}

/* ------------------------------------------------------------------ the watchdog */

static inline void watch_begin(watch_slot *s, int op, int64_t file, int64_t since)
{
    __atomic_store_n(&s->file, file, __ATOMIC_RELAXED);
    __atomic_store_n(&s->op, op, __ATOMIC_RELAXED);
    __atomic_store_n(&s->since, since, __ATOMIC_RELEASE);
}

static inline void watch_end(watch_slot *s)
{
    __atomic_store_n(&s->since, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE); /* the next begin's stores come after this one */
}

/* What the slot's reader has in flight: 1 with *since, *file, *op; 0 if nothing (or if it
 * changed while we looked: then it was not stuck). */
static int watch_look(watch_slot *s, int64_t *since, int64_t *file, int *op)
{
    *since = __atomic_load_n(&s->since, __ATOMIC_ACQUIRE);
    *file = __atomic_load_n(&s->file, __ATOMIC_RELAXED);
    *op = __atomic_load_n(&s->op, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return *since != 0 && __atomic_load_n(&s->since, __ATOMIC_RELAXED) == *since;
}

/* Report an open or read of `file` that began at `since` and is still in flight at `now`: on
 * stderr (one line, naming who waits and the file), or with watchdog_abort, when the caller
 * may fail, as the failure (-ETIMEDOUT) it returns. */
static int report_stuck(dio_engine *e, int op, int64_t file, int64_t since, int64_t now,
                        int may_fail, dio_error *err)
{
    char buf[PATH_MAX_LEN], what[PATH_MAX_LEN + 64], line[PATH_MAX_LEN + 256];
    const char *path = file_path(&e->files, file, buf);
    double limit = e->cfg.watchdog_ns / 1e9;
    ssize_t said;
    int n;
    snprintf(what, sizeof what, "%s of %s has waited %.1f s",
             op == WATCH_OPEN ? "an open" : "a read", path, (now - since) / 1e9);
    if (e->cfg.watchdog_abort && may_fail)
        return dio_fail(err, ETIMEDOUT, path, "watchdog: %s (reader.io_watchdog_seconds=%g; "
                        "reader.io_watchdog_abort: true ends the job)", what, limit);
    n = snprintf(line, sizeof line,
                 "dlio-mpi: %s%swatchdog: %s (reader.io_watchdog_seconds=%g)\n", e->who,
                 e->who[0] ? ": " : "", what, limit);
    /* one write, so that lines of other threads and ranks do not cut into it (if stderr is
     * gone, there is nowhere to say it) */
    said = write(STDERR_FILENO, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
    (void)said;
    return 0;
}

/* Under the lock: report each open or read in flight for watchdog_ns that was not reported yet
 * (report_stuck); *wake gets when the next unreported one will reach the limit (now + limit
 * if none is in flight). */
static int watch_readers(dio_engine *e, int may_fail, int64_t *wake, dio_error *err)
{
    int64_t now = dio_now_ns(), limit = e->cfg.watchdog_ns;
    *wake = now + limit;
    for (int i = 0; i < e->nworkers; i++) {
        watch_slot *slot = &e->workers[i].watch;
        int64_t since, file;
        int op, rc;
        if (!watch_look(slot, &since, &file, &op) || since == slot->reported)
            continue;
        if (now - since < limit) {
            if (since + limit < *wake)
                *wake = since + limit;
            continue;
        }
        slot->reported = since;
        if ((rc = report_stuck(e, op, file, since, now, may_fail, err)) < 0)
            return rc;
    }
    return 0;
}

/* Under the lock: wait for the readers' progress (done_cv); with the watchdog on, only until
 * the next open or read in flight reaches its limit, which is then reported (or, may_fail and
 * watchdog_abort, returned as -ETIMEDOUT).  Returns 0 after a wake-up, spurious ones included:
 * callers wait in a loop on their condition. */
static int wait_readers(dio_engine *e, int may_fail, dio_error *err)
{
    struct timespec ts;
    int64_t wake;
    int rc;
    if (e->cfg.watchdog_ns <= 0 || e->nworkers == 0) {
        pthread_cond_wait(&e->done_cv, &e->mu);
        return 0;
    }
    if ((rc = watch_readers(e, may_fail, &wake, err)) < 0)
        return rc;
    ts.tv_sec = (time_t)(wake / 1000000000);
    ts.tv_nsec = (long)(wake % 1000000000);
    pthread_cond_timedwait(&e->done_cv, &e->mu, &ts);
    return 0;
}

/* The test hook: sleep if this is the armed stall's first open or read of its file. */
static void stall_if_chosen(dio_engine *e, worker *w, int op, int64_t file)
{
    const char *path;
    size_t n, k = strlen(e->stall_suffix);
    if (op != e->stall_op || !__atomic_load_n(&e->stall_armed, __ATOMIC_RELAXED))
        return;
    path = file_path(&e->files, file, w->path);
    n = strlen(path);
    if (n >= k && strcmp(path + n - k, e->stall_suffix) == 0 &&
        __atomic_exchange_n(&e->stall_armed, 0, __ATOMIC_ACQ_REL))
        dio_sleep_until_ns(dio_now_ns() + e->stall_ns, 0);
}

/* Arm the test hook from STALL_ENV (<open|read>:<seconds>:<suffix>), if set and well formed. */
static void arm_stall(dio_engine *e)
{
    const char *spec = getenv(STALL_ENV);
    char *end;
    double seconds;
    if (!spec)
        return;
    if (strncmp(spec, "open:", 5) == 0)
        e->stall_op = WATCH_OPEN;
    else if (strncmp(spec, "read:", 5) == 0)
        e->stall_op = WATCH_READ;
    else
        return;
    seconds = strtod(spec + 5, &end);
    if (end == spec + 5 || *end != ':' || !(seconds > 0))
        return;
    if (!(e->stall_suffix = strdup(end + 1)))
        return;
    e->stall_ns = (int64_t)(seconds * 1e9);
    e->stall_armed = 1;
}

/* ------------------------------------------------------------------ descriptors */

static void close_counted(int fd, void *arg)
{
    dio_engine *e = arg;
    close(fd);
    __atomic_fetch_add(&e->closes, 1, __ATOMIC_RELAXED);
}

static void flush_worker(dio_engine *e, worker *w)
{
    fd_cache_clear(&w->cache, close_counted, e);
    if (w->access_fd >= 0)
        close_counted(w->access_fd, e);
    w->access_fd = -1;
}

static int worker_init(dio_engine *e, worker *w, int cache_cap)
{
    w->e = e;
    w->access_fd = -1;
    return fd_cache_init(&w->cache, cache_cap);
}

/* Open file `file` as this engine reads (dio_open_regular: never blocks on a FIFO or device,
 * refuses anything but a regular file, checks O_DIRECT's file system), in the thread's watch
 * slot.  On EMFILE the thread gives back its least recently used cached descriptors and tries
 * again. */
static int open_file(dio_engine *e, worker *w, int64_t file, int cached, dio_error *err)
{
    const char *path = cached ? file_path(&e->cache, file, w->cpath)
                              : file_path(&e->files, file, w->path);
    int fd, victim;
    watch_begin(&w->watch, WATCH_OPEN, file, dio_now_ns());
    if (DIO_UNLIKELY(e->stall_ns > 0))
        stall_if_chosen(e, w, WATCH_OPEN, file);
    while ((fd = dio_open_regular(path, e->cfg.odirect, err)) == -EMFILE || fd == -ENFILE) {
        if ((victim = fd_cache_evict(&w->cache)) < 0)
            break;
        close_counted(victim, e);
    }
    watch_end(&w->watch);
    if (fd >= 0) {
        __atomic_fetch_add(&e->opens, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&e->stats, 1, __ATOMIC_RELAXED); /* dio_open_regular's fstat */
    } else if (cached && fd == -ENOENT) { /* the copy is gone: read the file itself */
        __atomic_fetch_add(&e->cache_fallbacks, 1, __ATOMIC_RELAXED);
        dio_clear_error(err);
        return open_file(e, w, file, 0, err);
    }
    return fd;
}

/* The descriptor for a request outside an access: from the thread's cache, else opened. */
static int cached_fd(dio_engine *e, worker *w, int64_t file, int cached, dio_error *err)
{
    int64_t key = cached ? file | CACHE_KEY : file;
    fd_entry *ent = fd_cache_find(&w->cache, key);
    int fd, victim;
    if (DIO_LIKELY(ent != NULL))
        return ent->fd;
    fd = open_file(e, w, file, cached, err);
    if (fd < 0)
        return fd;
    ent = fd_cache_insert(&w->cache, key, &victim);
    if (victim >= 0)
        close_counted(victim, e);
    ent->fd = fd;
    return fd;
}

/* ------------------------------------------------------------------ reading */

static int read_failed(dio_engine *e, worker *w, const req *q, int er, int64_t at, int64_t want)
{
    const char *path = file_path(&e->files, q->file, w->path);
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
        const char *path = file_path(&e->files, q->file, w->path);
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

/* DIO_REQ_FILL: copy file `file` whole into the cache tier, under a temporary renamed into
 * place without replacing a copy already there (then the temporary is dropped). */
static int fill_cache(dio_engine *e, worker *w, int64_t file, dio_error *err)
{
    const char *src = file_path(&e->files, file, w->path);
    const char *dst = file_path(&e->cache, file, w->cpath);
    dio_copy_times times = {0, 0};
    struct stat st;
    int64_t t0 = dio_now_ns();
    int in, out, rc;
    if (!w->fill_buf && posix_memalign(&w->fill_buf, 4096, FILL_BUF) != 0) {
        w->fill_buf = NULL;
        return dio_fail(err, ENOMEM, dst, "cache fill of %s: out of memory", dst);
    }
    snprintf(w->tpath, sizeof w->tpath, "%s%s", dst, e->tmp_suffix);
    in = open_file(e, w, file, 0, err);
    if (in < 0)
        return in;
    if (fstat(in, &st) != 0) {
        rc = dio_fail(err, errno, src, "cache fill: fstat %s: %s", src, strerror(errno));
        close_counted(in, e);
        return rc;
    }
    out = open(w->tpath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC |
               (e->cfg.odirect ? O_DIRECT : 0), 0644);
    if (out < 0) {
        rc = dio_fail(err, errno, w->tpath, "cache fill: create %s: %s", w->tpath,
                      strerror(errno));
        close_counted(in, e);
        return rc;
    }
    rc = dio_copy_range(in, out, 0, (int64_t)st.st_size, w->fill_buf, FILL_BUF,
                        e->cfg.odirect ? e->cfg.align : 4096, &times, src, w->tpath, err);
    close_counted(in, e);
    close(out);
    if (rc == 0 && dio_rename_noreplace(w->tpath, dst) != 0) {
        int er = errno;
        if (er != EEXIST)
            rc = dio_fail(err, er, dst, "cache fill: rename %s to %s: %s", w->tpath, dst,
                          strerror(er));
    }
    unlink(w->tpath); /* after a failure, or a copy that was there first; else gone already */
    if (rc < 0)
        return rc;
    __atomic_fetch_add(&e->cache_fills, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&e->cache_fill_bytes, (int64_t)st.st_size, __ATOMIC_RELAXED);
    __atomic_fetch_add(&e->cache_fill_ns, dio_now_ns() - t0, __ATOMIC_RELAXED);
    return 0;
}

/* Remove the cache tier's copies the plan evicts before request i (gone already: fine). */
static void evict_before(dio_engine *e, worker *w, int64_t i)
{
    for (int64_t k = e->evict_at[i]; k < e->evict_at[i + 1]; k++) {
        int64_t f = e->evict_file[k];
        int fd = fd_cache_remove(&w->cache, f | CACHE_KEY);
        if (fd >= 0) /* a descriptor this thread keeps on the copy would hold its space */
            close_counted(fd, e);
        if (unlink(file_path(&e->cache, f, w->cpath)) == 0)
            __atomic_fetch_add(&e->cache_evictions, 1, __ATOMIC_RELAXED);
    }
}

/* Read requests [first, last) of batch b into its slot.  Never takes the lock. */
static int read_chunk(dio_engine *e, worker *w, int64_t b, int64_t first, int64_t last,
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
        int fd, rc = 0, cached = (q->flags & (DIO_REQ_CACHED | DIO_REQ_FILL)) != 0;
        if (e->evict_at_on)
            evict_before(e, w, i);
        if ((q->flags & DIO_REQ_FILL) && (rc = fill_cache(e, w, q->file, &w->err)) < 0)
            return rc;
        if (q->flags & DIO_REQ_OPEN) {
            fd = open_file(e, w, q->file, cached, &w->err);
            if (fd < 0)
                return fd;
            w->access_fd = fd;
            w->access_file = q->file;
        }
        if (w->access_fd >= 0) {
            fd = w->access_fd;
        } else if (q->rd_len > 0 || (q->flags & DIO_REQ_FSTAT)) {
            fd = cached_fd(e, w, q->file, cached, &w->err);
            if (fd < 0)
                return fd;
        } else {
            fd = -1; /* zero-length request outside an access: nothing to do */
        }
        if ((q->flags & DIO_REQ_FSTAT) && fd >= 0) {
            struct stat st; /* what the loader asks again; the answer is not needed */
            __atomic_fetch_add(&e->stats, 1, __ATOMIC_RELAXED);
            fstat(fd, &st);
        }
        t0 = t1 = 0;
        if (q->rd_len > 0) {
            t0 = dio_now_ns();
            watch_begin(&w->watch, WATCH_READ, q->file, t0);
            if (DIO_UNLIKELY(e->stall_ns > 0))
                stall_if_chosen(e, w, WATCH_READ, q->file);
            char *dst = base ? base + q->buf_pos : scratch_for(e, w, q->rd_len);
            rc = dst ? read_request(e, w, q, fd, dst, &got, &ops)
                     : dio_fail(&w->err, ENOMEM, "", "read: out of memory for %lld bytes",
                                (long long)q->rd_len);
            t1 = dio_now_ns();
            watch_end(&w->watch);
        }
        int64_t done_ns = t1; /* when the request's sample is ready */
        if (rc == 0 && q->delay_ns > 0) /* the sample's preprocessing, on this thread */
            done_ns = dio_sleep_until_ns(dio_now_ns() + q->delay_ns, 0);
        if (rc == 0 && q->cpu_ns > 0) { /* ... as CPU work, contending for the cores */
            int64_t began = dio_now_ns();
            done_ns = dio_burn_cpu_ns(q->cpu_ns);
            __atomic_fetch_add(&e->preprocess_cpu_ns, q->cpu_ns, __ATOMIC_RELAXED);
            __atomic_fetch_add(&e->preprocess_wall_ns, done_ns - began, __ATOMIC_RELAXED);
        }
        r->bytes += got;
        r->ops += ops;
        if (cached && q->rd_len > 0)
            __atomic_fetch_add(&e->cache_reads, 1, __ATOMIC_RELAXED);
        if (q->flags & DIO_REQ_CLOSE || (rc < 0 && w->access_fd >= 0)) {
            close_counted(w->access_fd, e);
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
        wait_readers(e, 0, NULL); /* reports a stuck reader, cannot fail */
    e->wait_idle = 0;
    e->holding = 0;
    pthread_mutex_unlock(&e->mu);
}

/* Abandon the epoch and close every descriptor the threads hold. */
static void close_all(dio_engine *e)
{
    abandon_epoch(e);
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->nworkers; i++)
        flush_worker(e, &e->workers[i]);
    flush_worker(e, &e->self);
    pthread_mutex_unlock(&e->mu);
}

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
    if (cfg->nthreads < 0 || cfg->nthreads > MAX_THREADS || cfg->prefetch < 0 ||
        cfg->prefetch > (1 << 20) || cfg->fd_cache < 1 || cfg->fd_cache > (1 << 24) ||
        (cfg->align & (cfg->align - 1)) != 0 || cfg->align > (1u << 30)) {
        dio_fail(err, EINVAL, "",
                 "engine: invalid configuration (threads %d, prefetch %d, fd_cache %d, "
                 "align %u): threads 0..%d, prefetch 0..2^20, fd_cache 1..2^24, align a "
                 "power of two",
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
    e->self.access_fd = -1;
    snprintf(e->who, sizeof e->who, "%s", cfg->who ? cfg->who : "");
    arm_stall(e);
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
    if (!e->slot || !e->slot_cap || !e->workers || worker_init(e, &e->self, cfg->fd_cache) != 0)
        goto nomem;
    for (int i = 0; i < cfg->nthreads; i++)
        if (worker_init(e, &e->workers[i], per_thread) != 0)
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
            flush_worker(e, &e->workers[i]);
            fd_cache_free(&e->workers[i].cache);
            free(e->workers[i].scratch);
            free(e->workers[i].fill_buf);
        }
    }
    flush_worker(e, &e->self);
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
    table_free(&e->files);
    table_free(&e->cache);
    free(e->tmp_suffix);
    free(e->evict_at);
    free(e->evict_file);
    free(e->stall_suffix);
    pthread_cond_destroy(&e->work_cv);
    pthread_cond_destroy(&e->done_cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* Install a new file table (the old epoch's file indices mean nothing with it). */
static void install_files(dio_engine *e, file_table *t)
{
    close_all(e);
    pthread_mutex_lock(&e->mu);
    table_free(&e->files);
    e->files = *t;
    pthread_mutex_unlock(&e->mu);
}

static int list_table(file_table *tp, int64_t nfiles, const char *const *paths,
                      dio_error *err)
{
    file_table t = {0};
    if (nfiles < 0 || (nfiles > 0 && !paths))
        return dio_fail(err, EINVAL, "", "set_files: invalid arguments");
    t.nfiles = nfiles;
    t.paths = calloc((size_t)(nfiles > 0 ? nfiles : 1), sizeof *t.paths);
    if (!t.paths)
        return dio_fail(err, ENOMEM, "", "set_files: out of memory (%lld files)",
                        (long long)nfiles);
    for (int64_t i = 0; i < nfiles; i++) {
        if (!paths[i]) {
            table_free(&t);
            return dio_fail(err, EINVAL, "", "set_files: path %lld is NULL", (long long)i);
        }
        if (!(t.paths[i] = strdup(paths[i]))) {
            table_free(&t);
            return dio_fail(err, ENOMEM, "", "set_files: out of memory");
        }
    }
    *tp = t;
    return 0;
}

static int pattern_table(file_table *tp, const dio_file_pattern *p, dio_error *err)
{
    file_table t = {0};
    if (!p || p->nfiles < 0 || !p->folder || !p->stem || !p->tail || p->digits < 1 ||
        p->digits > 20 || p->sub_digits < 1 || p->sub_digits > 20)
        return dio_fail(err, EINVAL, "", "set_file_pattern: invalid arguments");
    t.nfiles = p->nfiles;
    t.subfolders = p->subfolders;
    t.sub_digits = p->sub_digits;
    t.digits = p->digits;
    t.folder = strdup(p->folder);
    t.stem = strdup(p->stem);
    t.tail = strdup(p->tail);
    if (!t.folder || !t.stem || !t.tail) {
        table_free(&t);
        return dio_fail(err, ENOMEM, "", "set_file_pattern: out of memory");
    }
    *tp = t;
    return 0;
}

int dio_engine_set_files(dio_engine *e, int64_t nfiles, const char *const *paths, dio_error *err)
{
    file_table t;
    int rc;
    dio_clear_error(err);
    if (!e)
        return dio_fail(err, EINVAL, "", "set_files: invalid arguments");
    if ((rc = list_table(&t, nfiles, paths, err)) < 0)
        return rc;
    install_files(e, &t);
    return 0;
}

int dio_engine_set_file_pattern(dio_engine *e, const dio_file_pattern *p, dio_error *err)
{
    file_table t;
    int rc;
    dio_clear_error(err);
    if (!e)
        return dio_fail(err, EINVAL, "", "set_file_pattern: invalid arguments");
    if ((rc = pattern_table(&t, p, err)) < 0)
        return rc;
    install_files(e, &t);
    return 0;
}

int dio_engine_set_cache(dio_engine *e, const dio_file_pattern *p, int64_t nfiles,
                         const char *const *paths, const char *tmp_suffix, dio_error *err)
{
    file_table t;
    char *suffix;
    int rc;
    dio_clear_error(err);
    if (!e || !tmp_suffix || !*tmp_suffix || strlen(tmp_suffix) > 60)
        return dio_fail(err, EINVAL, "", "set_cache: invalid arguments");
    rc = p ? pattern_table(&t, p, err) : list_table(&t, nfiles, paths, err);
    if (rc < 0)
        return rc;
    if (!(suffix = strdup(tmp_suffix))) {
        table_free(&t);
        return dio_fail(err, ENOMEM, "", "set_cache: out of memory");
    }
    close_all(e);
    pthread_mutex_lock(&e->mu);
    table_free(&e->cache);
    free(e->tmp_suffix);
    e->cache = t;
    e->tmp_suffix = suffix;
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void dio_engine_close_files(dio_engine *e)
{
    if (e)
        close_all(e);
}

int dio_engine_drop_cache(dio_engine *e, const int64_t *files, int64_t n, dio_error *err)
{
    char buf[PATH_MAX_LEN];
    dio_clear_error(err);
    if (!e || n < 0 || (n > 0 && !files))
        return dio_fail(err, EINVAL, "", "drop_cache: invalid arguments");
    abandon_epoch(e);
    for (int64_t i = 0; i < n; i++) {
        const char *path;
        int fd, rc;
        if (files[i] < 0 || files[i] >= e->files.nfiles)
            return dio_fail(err, EINVAL, "", "drop_cache: file %lld is not in the table",
                            (long long)files[i]);
        path = file_path(&e->files, files[i], buf);
        fd = dio_open_regular(path, 0, err);
        if (fd < 0)
            return fd;
        rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
        if (rc != 0)
            return dio_fail(err, rc, path, "posix_fadvise %s: %s", path, strerror(rc));
    }
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
                const char *path = file_path(&e->files, f, buf);
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

/* The largest batch's buffer footprint: extents placed as dio_engine_start_epoch places them
 * (a request's extent at the next place-aligned position, O_DIRECT extents aligned). */
static int64_t plan_footprint(const dio_engine *e, const dio_epoch_plan *p)
{
    int64_t footprint = 0, al = e->ext_align, pa = e->place_align;
    for (int64_t b = 0; b < p->nbatches; b++) {
        int64_t pos = 0;
        for (int64_t i = p->batch_start[b]; i < p->batch_start[b + 1]; i++) {
            int64_t off = p->offset[i], len = p->length[i];
            pos = (pos + pa - 1) / pa * pa;
            if (len > 0)
                pos += (off + len + al - 1) / al * al - off / al * al;
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
    abandon_epoch(e);
    return grow_slots(e, plan_footprint(e, p), err);
}

int dio_engine_start_epoch(dio_engine *e, const dio_epoch_plan *p, const dio_epoch_outputs *out,
                           dio_error *err)
{
    int64_t nreq, footprint = 0, al, pa;
    int rc;
    dio_clear_error(err);
    if (!e || !p)
        return dio_fail(err, EINVAL, "", "start_epoch: invalid arguments");
    if ((rc = check_plan(e, p, err)) < 0)
        return rc;
    nreq = p->batch_start[p->nbatches];

    abandon_epoch(e);

    if (grow((void **)&e->reqs, &e->reqs_cap, nreq > 0 ? nreq : 1, sizeof(req)) != 0 ||
        grow((void **)&e->batches, &e->batches_cap, p->nbatches > 0 ? p->nbatches : 1,
             sizeof(batch_state)) != 0)
        return dio_fail(err, ENOMEM, "", "start_epoch: out of memory (%lld requests)",
                        (long long)nreq);

    /* place each request's extent in its batch buffer */
    al = e->ext_align;
    pa = e->place_align;
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
            if (len == 0) {
                q->rd_off = off;
                q->rd_len = q->need = 0;
            } else {
                q->rd_off = off / al * al;
                q->rd_len = (off + len + al - 1) / al * al - q->rd_off;
                q->need = off + expect - q->rd_off;
            }
            pos = (pos + pa - 1) / pa * pa;
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
        if (pos > footprint)
            footprint = pos;
    }
    rc = e->cfg.discard ? 0 : grow_slots(e, footprint, err);
    if (rc < 0)
        return rc;
    if (p->evict_at) {
        int64_t nev = p->evict_at[nreq];
        if (grow((void **)&e->evict_at, &e->evict_at_cap, nreq + 1, sizeof(int64_t)) != 0 ||
            grow((void **)&e->evict_file, &e->evict_file_cap, nev > 0 ? nev : 1,
                 sizeof(int64_t)) != 0)
            return dio_fail(err, ENOMEM, "", "start_epoch: out of memory (evictions)");
        memcpy(e->evict_at, p->evict_at, (size_t)(nreq + 1) * sizeof(int64_t));
        if (nev > 0)
            memcpy(e->evict_file, p->evict_file, (size_t)nev * sizeof(int64_t));
    }

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
                if (wait_readers(e, 1, &e->first_err) < 0) { /* the watchdog ends the epoch */
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
    out->preprocess_cpu_ns = __atomic_load_n(&e->preprocess_cpu_ns, __ATOMIC_RELAXED);
    out->preprocess_wall_ns = __atomic_load_n(&e->preprocess_wall_ns, __ATOMIC_RELAXED);
}
