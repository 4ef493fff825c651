/*
 * dio_engine_internal.h - the read engine's own types and the functions its files share
 * (dio_engine.c: lifecycle, epochs and the consumer; dio_engine_files.c: file tables and
 * descriptors; dio_engine_read.c: the reader threads; dio_engine_watch.c: the watchdog;
 * dio_engine_cache.c: cache-tier fills and evictions).  Not part of the public API (dio.h).
 */
#ifndef DIO_ENGINE_INTERNAL_H
#define DIO_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "dio_fdcache.h"
#include "dio_internal.h"

#include "dio_internal.h"

#define CHUNK_MAX_REQ 64
#define CHUNK_MAX_BYTES ((int64_t)4 << 20)
#define PREAD_MAX ((int64_t)1 << 30) /* one pread moves at most this (Linux caps at ~2 GiB) */
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
    int access_fell_back; /* access_fd is the file table's file: its copy was gone */
    int fell_back;       /* the last eng_open_file of a copy opened the file table's file */
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
        cache_fallbacks, cache_fallback_reads, cache_fallback_bytes, cache_hit_fallbacks,
        cache_fill_failures;
    int64_t preprocess_cpu_ns, preprocess_wall_ns;

    char who[WHO_MAX_LEN]; /* named in watchdog reports; "" = nobody */

    /* the test hook (STALL_ENV): the first `stall_op` of a path ending with stall_suffix
     * sleeps stall_ns (> 0: the hook is set); stall_armed (atomic) until it has */
    int stall_op, stall_armed;
    int64_t stall_ns;
    char *stall_suffix;
};

/* What a reader has in flight, for the watchdog (lock-free; see watch_slot). */
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

/* dio_engine_files.c: file tables and descriptors */
void eng_table_free(file_table *t);
const char *eng_file_path(const file_table *t, int64_t file, char *buf);
void eng_close_counted(int fd, void *arg);
void eng_flush_worker(dio_engine *e, worker *w);
int eng_worker_init(dio_engine *e, worker *w, int cache_cap);
int eng_open_file(dio_engine *e, worker *w, int64_t file, int cached, dio_error *err);
int eng_cached_fd(dio_engine *e, worker *w, int64_t file, int cached, int *fell_back,
                  dio_error *err);

/* dio_engine_watch.c: the watchdog and the test hook that stalls a reader */
int eng_wait_readers(dio_engine *e, int may_fail, dio_error *err);
void eng_stall_if_chosen(dio_engine *e, worker *w, int op, int64_t file);
void eng_arm_stall(dio_engine *e);

/* dio_engine_read.c: the reader threads */
int eng_read_chunk(dio_engine *e, worker *w, int64_t b, int64_t first, int64_t last,
                   chunk_result *r);
void eng_finish_chunk(dio_engine *e, worker *w, int64_t b, const chunk_result *r, int rc);
void *eng_worker_main(void *arg);
void eng_abandon_epoch(dio_engine *e);

/* dio_engine_cache.c: the cache tier's fills and evictions */
int eng_fill_cache(dio_engine *e, worker *w, int64_t file, dio_error *err);
void eng_evict_before(dio_engine *e, worker *w, int64_t i);

#endif /* DIO_ENGINE_INTERNAL_H */
