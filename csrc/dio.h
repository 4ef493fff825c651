/*
 * dio.h - the whole C API of the dlio-mpi I/O core.
 *
 * Python plans, C moves bytes: the planner hands the engine one epoch of read requests
 * (file, offset, length) grouped into batches; worker threads execute them with pread
 * (optionally O_DIRECT) into a ring of batch buffers, and the training loop waits for one
 * batch at a time.  Nothing here knows about MPI, so the core builds anywhere.
 *
 * Conventions: functions return 0 (or a count) on success and -errno on failure, with
 * *err (when not NULL) filled with a message naming the operation and the path.
 * Buffers passed in are owned by the caller unless a comment says otherwise.
 */
#ifndef DIO_H
#define DIO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ errors */

typedef struct dio_error {
    int  code;            /* errno value; 0 = no error */
    char message[768];    /* one line: what failed, on which path, at which offset */
    char path[4096];      /* the file concerned, "" if none */
} dio_error;

/* ------------------------------------------------------------------ time */

/* CLOCK_MONOTONIC in nanoseconds. */
int64_t dio_now_ns(void);

/* Wait until the absolute CLOCK_MONOTONIC deadline: clock_nanosleep (TIMER_ABSTIME, EINTR
 * retried) until deadline_ns - spin_ns, then poll the clock for the last spin_ns (0 = sleep
 * only), which hides the timer's wake-up latency at the price of that much CPU.
 * Returns dio_now_ns() after waking (>= deadline_ns). */
int64_t dio_sleep_until_ns(int64_t deadline_ns, int64_t spin_ns);

/* Sleep until deadline_ns (CLOCK_MONOTONIC) in naps of at most 0.1 s, ending early when a stop
 * signal was received (dio_stop_signal): 0, or -ECANCELED when stopped. */
int dio_nap_until_ns(int64_t deadline_ns);

/* Spend cpu_ns of the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID) on integer work over
 * a small thread-local table: the stand-in for CPU work of that cost (a loader's decode and
 * transform, the training process taking a batch).  Unlike a sleep it occupies a core, so
 * where threads and processes contend for the cores it takes longer than cpu_ns of wall time,
 * as the work it stands for would.  Returns dio_now_ns() when done (at once if cpu_ns <= 0). */
int64_t dio_burn_cpu_ns(int64_t cpu_ns);

/* A pacer paces the compute waits of one thread: each wait sleeps until spin_ns before its
 * deadline and polls the clock for the rest.  Adaptive (fixed_spin_ns < 0): the spin follows
 * how late the recent sleeps woke up (1.25 x the second largest lateness of the last
 * DIO_PACER_WINDOW sleeps, plus 5 us, within [DIO_PACER_MIN_SPIN, DIO_PACER_MAX_SPIN]), so
 * it costs as little CPU as the machine's wake-up latency allows. */
#define DIO_PACER_WINDOW 32
#define DIO_PACER_MIN_SPIN 10000
#define DIO_PACER_MAX_SPIN 2000000
#define DIO_PACER_FIRST_SPIN 200000

typedef struct dio_pacer {
    int64_t spin_ns;                     /* spin of the next wait */
    int64_t fixed_spin_ns;               /* >= 0: always this spin; < 0: adaptive */
    int64_t late_ns[DIO_PACER_WINDOW];   /* how late the recent sleeps woke up (a ring) */
    int     nlate, next;                 /* entries in late_ns, next slot */
    int64_t waits;                       /* waits so far */
    int64_t spun_ns;                     /* time spent polling, over all waits */
    int64_t batch_poll_ns;               /* the step loop polls this long for a batch still
                                          * being read (dio_engine_next_polling); 0: sleeps */
    int64_t batch_polled_ns;             /* time spent polling for batches, over all steps */
} dio_pacer;

void dio_pacer_init(dio_pacer *p, int64_t fixed_spin_ns);

/* Wait until the absolute CLOCK_MONOTONIC deadline as described above; returns dio_now_ns()
 * after the wait (>= deadline_ns). */
int64_t dio_pacer_wait(dio_pacer *p, int64_t deadline_ns);

/* Timer slack of the calling thread (prctl PR_SET_TIMERSLACK; Linux's default is 50 us, which
 * every timed sleep may overshoot by); 0 asks for the minimum, 1 ns.  New threads inherit it.
 * Returns 0 or -errno. */
int dio_set_timer_slack_ns(uint64_t slack_ns);

/* ------------------------------------------------------------------ checksums, payloads */

/* zlib-compatible CRC-32 (zip, npz): crc = dio_crc32(0, buf, n) for a fresh sum. */
uint32_t dio_crc32(uint32_t crc, const void *buf, size_t n);

/* CRC-32C (Castagnoli, TFRecord framing): same chaining convention. */
uint32_t dio_crc32c(uint32_t crc, const void *buf, size_t n);

/* Fill buf with n pseudo-random bytes; the stream is a pure function of seed (xoshiro256**
 * seeded through splitmix64, reseeded every DIO_PAYLOAD_BLOCK bytes), so the same seed always
 * gives the same bytes. */
#define DIO_PAYLOAD_BLOCK ((uint64_t)8 << 20)
void dio_fill_random(void *buf, size_t n, uint64_t seed);

/* The bytes [start, start + n) of the stream of seed (made without the bytes before them
 * but for the part of start's block before start). */
void dio_fill_random_at(void *buf, size_t n, uint64_t seed, uint64_t start);

/* Write nbytes of the dio_fill_random(seed) stream to fd at offset with pwrite, in chunks
 * of at most chunk bytes (0 = 8 MiB), reusing one buffer.  If crc is not NULL it is in/out:
 * its value on entry is the running CRC-32 to continue (0 for a fresh sum; lets a caller chain a
 * header it wrote itself) and on return it holds that CRC continued over everything written.
 * path is only used in messages. */
int dio_write_random(int fd, int64_t offset, int64_t nbytes, uint64_t seed, size_t chunk,
                     uint32_t *crc, const char *path, dio_error *err);

/* The nanoseconds this process has spent so far in the pwrite calls of dio_write_random,
 * dio_write_tfrecords and the copy engine (every thread): a phase's storage time is the
 * difference across it. */
int64_t dio_write_ns(void);

/* TFRecord's CRC mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32). */
uint32_t dio_crc32c_mask(uint32_t crc);

/* Write `count` TFRecord records of equal framing to fd at offset (dio_tfrecord.c): each is
 * head (head_len >= 12 bytes: the uint64 length, its masked CRC-32C, the data before the
 * payload), payload_len bytes of the stream of seed (record r: its bytes from
 * start + r * payload_len on), tail (the rest of the data), and the masked CRC-32C of the data
 * (everything after the head's first 12 bytes).  EINVAL when the head's length field does
 * not match; through one reused buffer of chunk bytes (0 = 8 MiB). */
int dio_write_tfrecords(int fd, int64_t offset, const void *head, size_t head_len,
                        const void *tail, size_t tail_len, uint64_t payload_len, int64_t count,
                        uint64_t seed, uint64_t start, size_t chunk, const char *path,
                        dio_error *err);

/* ------------------------------------------------------------------ checkpoint bytes */

/* The checkpoint stream (dio_ckpt_stream.c): granules of DIO_GRANULE bytes, each made
 * without the others; a check compares DIO_CHECK_HEAD bytes of every granule, or all. */
#define DIO_GRANULE 4096
#define DIO_CHECK_HEAD 64

/* What a checkpoint's granules hold (checkpoint.content); NULL or zeros: the fresh stream,
 * incompressible and with no two granules equal. */
typedef struct dio_content {
    uint32_t random_bytes; /* of each granule, from the stream; the rest zeros (0: all) */
    uint64_t unique;       /* granule g holds granule g % unique's bytes (0: its own) */
} dio_content;

/* Bytes [start, start + n) of the checkpoint stream of seed under content c. */
void dio_ckpt_fill(void *buf, size_t n, uint64_t seed, uint64_t start, const dio_content *c);

/* Compare buf (n bytes) with bytes [start, start + n) of the stream: every granule's first
 * DIO_CHECK_HEAD bytes, and the whole of every granule whose number is a multiple of
 * whole_every (1: everything; 0: heads only); the bytes compared added to *compared (may be
 * NULL). -1, or the offset in buf of the first granule that differs. */
int64_t dio_ckpt_check(const void *buf, size_t n, uint64_t seed, uint64_t start,
                       const dio_content *c, uint64_t whole_every, int64_t *compared);

/* ------------------------------------------------------------------ checkpoint shards */

typedef struct dio_shard_stats {
    int64_t bytes;       /* bytes written or read */
    int64_t calls;       /* pwrite/pread system calls */
    int64_t io_ns;       /* time in them (the storage's) */
    int64_t syncs;       /* fsync calls (0 or 1) */
    int64_t sync_ns;     /* time in fsync */
    int64_t verified;    /* bytes compared with what was written (reads) */
    int64_t emulator_ns; /* time the call waited on the emulator's own work: bytes being made
                          * (writes), bytes being checked (reads) */
} dio_shard_stats;

/* Write the nbytes of the shard of `seed` to fd at offset: bytes [0, nbytes) of the
 * checkpoint stream of seed under content c (dio_ckpt_fill), in calls of chunk bytes
 * (0 = 64 MiB; whole pages) from two aligned buffers, the next block made by a second thread
 * while the current one is written (its wait is emulator_ns).  odirect: O_DIRECT is set on
 * fd (offset must be 4096-aligned; an unaligned tail is written after clearing it again);
 * do_fsync: fsync(fd) at the end, timed apart.  0 or -errno. */
int dio_shard_write(int fd, int64_t offset, int64_t nbytes, uint64_t seed,
                    const dio_content *c, size_t chunk, int odirect, int do_fsync,
                    dio_shard_stats *st, const char *path, dio_error *err);

/* Read the shard back (fd opened with O_DIRECT or not: whole pages are asked for) and, with
 * verify, compare it with what dio_shard_write wrote: every granule's first DIO_CHECK_HEAD
 * bytes and every 64th granule whole (verify > 1: everything); -EIO naming the offset if
 * they differ. */
int dio_shard_read(int fd, int64_t offset, int64_t nbytes, uint64_t seed,
                   const dio_content *c, size_t chunk, int verify, dio_shard_stats *st,
                   const char *path, dio_error *err);

/* Allocate and touch `count` (at most 2) buffers of chunk bytes for the next writes or reads
 * (kept by the process from then on, as every shard buffer is), so that the first save
 * does not pay their page faults.  0 or -ENOMEM. */
int dio_shard_prepare(size_t chunk, int count);

/* The chunk dio_shard_write and dio_shard_read use for a shard of nbytes asked to use
 * `chunk` (0 = 64 MiB): whole pages, no more than the shard's. */
size_t dio_shard_chunk(size_t chunk, int64_t nbytes);

/* Asynchronous checkpoints' snapshot: put into dst the nbytes dio_shard_write(seed, c)
 * would write, made block by block (chunk bytes) with a stop check between blocks and, with
 * bytes_per_second > 0, paced to that rate (a device-to-host copy).  0, -ECANCELED when
 * stopped. */
int dio_shard_snapshot(void *dst, int64_t nbytes, uint64_t seed, const dio_content *c,
                       size_t chunk, double bytes_per_second);

/* Write nbytes of buf to fd at offset as dio_shard_write writes its blocks (odirect: O_DIRECT
 * set on fd, buf and offset 4096-aligned, an unaligned tail without it; do_fsync: fsync at
 * the end).  0 or -errno. */
int dio_buffer_write(int fd, int64_t offset, const void *buf, int64_t nbytes, size_t chunk,
                     int odirect, int do_fsync, dio_shard_stats *st, const char *path,
                     dio_error *err);

/* syncfs(2): flush everything written to the file system holding fd.  0 or -errno. */
int dio_syncfs(int fd);

/* ------------------------------------------------------------------ shuffling */

/* out[i] = pi(in[i]) for i < count, where pi is a pseudo-random permutation of [0, n)
 * chosen by seed (the same seed and n always give the same pi), n < 2^64; in and out may be
 * the same array.  Returns 0, or -EINVAL if a value of in is not within [0, n). */
int dio_permute(uint64_t n, uint64_t seed, const int64_t *in, int64_t count, int64_t *out);

/* ------------------------------------------------------------------ batches from memory */

/* Copy src[at[i], at[i] + length[i]) for i < count, in order and end to end, to dst.  Returns
 * the bytes copied, or -EINVAL (nothing copied) if a range is not within src's src_len bytes
 * or the ranges together exceed dst_len. */
int64_t dio_gather(void *dst, int64_t dst_len, const void *src, int64_t src_len,
                   const int64_t *at, const int64_t *length, int64_t count);

/* ------------------------------------------------------------------ opening data files */

/* Open a data file (one this process did not create) for reading, unable to block: with
 * O_NONBLOCK, as a FIFO or device in its place would block the open until a writer comes (on a
 * regular file Linux ignores the flag), O_CLOEXEC, and O_DIRECT when odirect.  Anything but a
 * regular file is refused, the message naming the path and what it is ("<path> is a FIFO, not
 * a regular file"; EISDIR for a directory, else EINVAL); with O_DIRECT, a file system that
 * refuses or only emulates direct I/O gets the reader.odirect message.  Returns the descriptor
 * (the caller closes it) or -errno (EMFILE too: a caller holding descriptors may free some and
 * retry). */
int dio_open_regular(const char *path, int odirect, dio_error *err);

/* The size of path (stat(2), which cannot block on a FIFO), refused as dio_open_regular
 * refuses it when it is not a regular file.  Returns the size or -errno. */
int64_t dio_regular_size(const char *path, dio_error *err);

/* ------------------------------------------------------------------ direct I/O */

/* Alignment O_DIRECT needs for path: statx STATX_DIOALIGN where the kernel reports it,
 * else 4096 for both.  Either out pointer may be NULL. */
int dio_odirect_alignment(const char *path, uint32_t *mem_align, uint32_t *offset_align,
                          dio_error *err);

/* Check that path can be opened and read with O_DIRECT (tmpfs refuses: EINVAL).
 * The message names the path and the setting reader.odirect.  Since Linux 6.6 tmpfs accepts
 * O_DIRECT opens but serves them from the page cache, so tmpfs/ramfs (fstatfs magic) and files
 * whose statx reports no direct-I/O alignment are refused with EINVAL too; the engine applies
 * the same check to every descriptor it opens with O_DIRECT. */
int dio_probe_odirect(const char *path, dio_error *err);

/* ------------------------------------------------------------------ read engine */

typedef struct dio_engine dio_engine;

#define DIO_MAX_THREADS 4096 /* reader threads an engine takes at most (reader.read_threads) */

typedef struct dio_engine_config {
    int      nthreads;    /* worker threads (read_threads); 0 = the caller reads inside dio_engine_next */
    int      prefetch;    /* batches read ahead of the one being consumed (prefetch_size, >= 0) */
    int      odirect;     /* open O_DIRECT; extents and buffers aligned to align */
    int      fd_cache;    /* descriptors kept open per engine (>= 1), split evenly over the
                           * threads, each an LRU cache; used by requests outside an access */
    uint32_t align;       /* O_DIRECT alignment in bytes (power of two); 0 = 4096 */
    int      discard;     /* read every request into one small buffer per thread, reused, and
                           * deliver batches without data (data = NULL): the same system calls
                           * and bytes from storage without a batch's worth of memory traffic
                           * (nobody consumes an emulated batch) */
    int64_t  watchdog_ns; /* the watchdog (reader.io_watchdog_seconds): an open or read of a
                           * reader thread in flight this long (a dead NFS or Lustre server) is
                           * reported on stderr, once per request, by the thread waiting for the
                           * readers; 0 = never.  Not with nthreads == 0, where the only thread
                           * is the one reading */
    int      watchdog_abort; /* then dio_engine_next fails with -ETIMEDOUT, its message naming
                              * the file and the wait, instead of reporting and waiting on */
    const char *who;      /* whose engine, named in watchdog reports ("rank 3"); copied; NULL or
                           * "" = nobody */
    int      whole_batches; /* a reader thread takes a whole batch at a time, as each worker
                             * process of a torch DataLoader makes its batches alone; 0 = the
                             * threads share a batch in chunks of requests */
} dio_engine_config;

/* Create an engine and start its threads (idle until an epoch starts). NULL on error.
 * Test hook: with DLIO_MPI_TEST_STALL=<open|read>:<seconds>:<suffix> in the environment, the
 * first open (or read) of a file whose path ends with <suffix> sleeps <seconds> first, in
 * flight as an open or read stuck on a dead server would be (for tests of the watchdog). */
dio_engine *dio_engine_create(const dio_engine_config *cfg, dio_error *err);

/* Stop the threads (abandoning any epoch in flight), close descriptors, free buffers. */
void dio_engine_destroy(dio_engine *e);

/* Set the file table as a list; requests name files by index into it.  Paths are copied.
 * Abandons an epoch in flight and closes every descriptor. */
int dio_engine_set_files(dio_engine *e, int64_t nfiles, const char *const *paths, dio_error *err);

/* The file table as a naming formula (no per-file memory): file i is
 * <folder>/<i mod subfolders, sub_digits wide>/<stem><i, digits wide><tail> when
 * subfolders > 1, else <folder>/<stem><i, digits wide><tail> (DLIO's names).  Strings are
 * copied.  Abandons an epoch in flight and closes every descriptor. */
typedef struct dio_file_pattern {
    int64_t     nfiles;
    const char *folder;
    int64_t     subfolders;
    int         sub_digits;  /* 1..20 */
    const char *stem;
    int         digits;      /* 1..20 */
    const char *tail;
} dio_file_pattern;
int dio_engine_set_file_pattern(dio_engine *e, const dio_file_pattern *p, dio_error *err);

/* The cache tier (reader.cache): where the copies of the file table's files go, named by a
 * pattern as dio_engine_set_file_pattern's (or, with p NULL, the list paths[0..nfiles)), and
 * the suffix a fill's temporaries carry (".dlio_mpi-<tag>.tmp").  Requests with
 * DIO_REQ_CACHED or DIO_REQ_FILL need it.  Abandons an epoch in flight. */
int dio_engine_set_cache(dio_engine *e, const dio_file_pattern *p, int64_t nfiles,
                         const char *const *paths, const char *tmp_suffix, dio_error *err);

/* Abandon an epoch in flight and close every descriptor the engine holds (what a loader does
 * with the files it kept open when an epoch ends). */
void dio_engine_close_files(dio_engine *e);

/* posix_fadvise(POSIX_FADV_DONTNEED) each of files[0..n) (indices into the file table), so
 * that their pages leave the page cache; each is opened (dio_open_regular: anything but a
 * regular file is an error) and closed for it, which the counters do not count.  Abandons an
 * epoch in flight.  Returns 0 or -errno. */
int dio_engine_drop_cache(dio_engine *e, const int64_t *files, int64_t n, dio_error *err);

/* Request flags.  An access is a run of requests of one batch on one file, from a request
 * with DIO_REQ_OPEN to one with DIO_REQ_CLOSE (the same request may carry both): one thread
 * executes it in order on a descriptor opened (and fstat'ed) for it, as a loader opening,
 * probing, reading and closing a file does.  Requests outside accesses use cached
 * descriptors. */
#define DIO_REQ_OPEN   1u  /* open a fresh descriptor (and fstat it) before this request */
#define DIO_REQ_CLOSE  2u  /* close the access's descriptor after this request */
#define DIO_REQ_FSTAT  4u  /* one more fstat before this request */
#define DIO_REQ_MMAP   8u  /* read by mapping the extent (mmap, MAP_SHARED) and copying it out,
                            * which touches every page, as an mmap reader consuming the sample
                            * does; one read op per request; not with O_DIRECT */
#define DIO_REQ_CACHED 16u /* read the cache tier's copy of the file (dio_engine_set_cache);
                            * where that copy is gone, the file table's file is read instead
                            * (a fallback, counted).  Every request of an access alike */
#define DIO_REQ_FILL   32u /* before this request, copy the file whole from the file table to
                            * the cache tier (under a temporary renamed into place, never over
                            * a copy already there), then read it as DIO_REQ_CACHED; a fill
                            * out of room (ENOSPC, EDQUOT) is counted, not an error */
#define DIO_REQ_HIT    64u /* with DIO_REQ_CACHED: the plan's hit (the file was cached when the
                            * epoch began); changes no read, only what the counters say when
                            * its copy is gone (cache_hit_fallbacks) */

/* One epoch of requests: batch b covers requests [batch_start[b], batch_start[b+1]).  The
 * arrays are copied by dio_engine_start_epoch.  batch_start[0] must be 0 and batch_start must
 * not decrease; empty batches are allowed.  Zero-length requests are allowed (no pread;
 * their flags still act). */
typedef struct dio_epoch_plan {
    int64_t         nbatches;
    const int64_t  *batch_start; /* nbatches + 1 */
    const int64_t  *file_idx;    /* nreq = batch_start[nbatches] entries each */
    const int64_t  *offset;
    const int64_t  *length;      /* bytes the read asks for */
    const int64_t  *expect;      /* bytes that must arrive; NULL = length.  Less than length
                                  * only for a read that reaches the end of the file (a loader
                                  * asking for a buffer's worth near EOF): then exactly expect
                                  * bytes must arrive (the file ends there) */
    const uint32_t *flags;       /* DIO_REQ_*; NULL = none */
    const int64_t  *delay_ns;    /* after the read, the reader thread sleeps this long (a
                                  * loader's per-sample preprocessing: the batch is ready only
                                  * after it; read latencies leave it out); NULL = none */
    const int64_t  *cpu_ns;      /* after the read and the sleep, the reader thread spends this
                                  * much CPU time (dio_burn_cpu_ns: a loader's decode and
                                  * transform, contending for the cores); NULL = none */
    int64_t         not_before_ns; /* no request of the epoch starts before this
                                  * CLOCK_MONOTONIC time (a loader's start-up: its workers
                                  * starting); 0 = at once */
    const int64_t  *evict_at;    /* NULL, or nreq + 1 non-decreasing offsets into evict_file:
                                  * before request i, its thread removes the cache tier's
                                  * copies of evict_file[evict_at[i] .. evict_at[i+1]) */
    const int64_t  *evict_file;
} dio_epoch_plan;

/* Per-request outputs, each NULL or nreq entries, owned by the caller, which must keep them
 * alive until the epoch ends or a new one starts:
 *   req_buf_off - filled by dio_engine_start_epoch: where request i's bytes begin in its batch
 *                 buffer (64-byte aligned, or the align-aligned extent with O_DIRECT:
 *                 [floor(off/align)*align, ceil((off+len)/align)*align));
 *   lat_ns      - filled as requests complete: pread latency of request i (all its calls);
 *   nread       - filled as requests complete: bytes transferred for request i (with O_DIRECT
 *                 the aligned extent, clipped at end of file);
 *   start_ns    - filled as requests complete (tracing): when request i's read began
 *                 (CLOCK_MONOTONIC, dio_now_ns; its end is start_ns + lat_ns; a request
 *                 that reads nothing: when it was done);
 *   thread      - filled as requests complete (tracing): the reader thread that served
 *                 request i (0 .. nthreads-1; -1: the caller's thread, when nthreads is 0).
 * Each entry is written by the one thread that served its request. */
typedef struct dio_epoch_outputs {
    int64_t *req_buf_off;
    int64_t *lat_ns;
    int64_t *nread;
    int64_t *start_ns;
    int64_t *thread;
} dio_epoch_outputs;

/* Start an epoch (out may be NULL).  Any epoch still in flight is abandoned first.  A request
 * naming a file outside the table, with a negative offset/length, or breaking an access fails
 * the call with -EINVAL before anything is abandoned. */
int dio_engine_start_epoch(dio_engine *e, const dio_epoch_plan *plan,
                           const dio_epoch_outputs *out, dio_error *err);

/* Allocate (and fault in) the batch buffers `plan` will need, so that dio_engine_start_epoch
 * does no memory work (call it before the epoch's clock starts).  Abandons an epoch in
 * flight.  Nothing to do with discard. */
int dio_engine_reserve(dio_engine *e, const dio_epoch_plan *plan, dio_error *err);

typedef struct dio_batch {
    int64_t  index;           /* batch number within the epoch */
    void    *data;            /* batch buffer (NULL with discard); valid until the next
                               * dio_engine_next / start / destroy */
    int64_t  data_len;        /* bytes of the buffer this batch uses */
    int64_t  nreq;            /* requests in the batch */
    int64_t  bytes_requested; /* sum of request lengths */
    int64_t  bytes_read;      /* bytes transferred from storage */
    int64_t  read_ops;        /* pread calls issued */
    int64_t  ready_ns;        /* dio_now_ns() when its last request completed */
} dio_batch;

/* Release the previously returned batch and wait for the next one (blocks; call without the
 * GIL).  Returns 1 with *out filled, 0 when the epoch has no more batches (or no epoch was
 * started), -errno if a request of this batch failed (open, short read: the file is shorter
 * than the request, EIO, ...) or, with watchdog_abort, -ETIMEDOUT when a reader's open or read
 * has been in flight for watchdog_ns.  After a failure the readers stop and every later call
 * returns the same error until the next dio_engine_start_epoch; batches before the failed one
 * are delivered normally.  One consumer thread at a time; destroy/start/set_files must not run
 * concurrently with a call to next.
 * flags: DIO_NEXT_DEFER_WAKE leaves waking the readers for the released slot to a later
 * dio_engine_wake (or the next call that has to wait), so that a batch that is already there
 * is handed over without a futex wake (an inter-processor interrupt, slow on a VM) on the
 * caller's critical path. */
#define DIO_NEXT_DEFER_WAKE 1
int dio_engine_next(dio_engine *e, dio_batch *out, int flags, dio_error *err);

/* dio_engine_next, but a batch still being read is polled for first, for up to poll_ns,
 * with sched_yield between polls (a reader on this core runs at once) and without the lock,
 * before sleeping until the readers signal it: a thread woken from a sleep starts tens to
 * hundreds of microseconds after its wake-up on a VM or from a deep C-state, a polling one
 * sees its batch at once.  For a caller with a core to spare.  *polled_ns (if not NULL)
 * grows by the time spent polling. */
int dio_engine_next_polling(dio_engine *e, dio_batch *out, int flags, int64_t poll_ns,
                            int64_t *polled_ns, dio_error *err);

/* Wake the readers if a dio_engine_next with DIO_NEXT_DEFER_WAKE left them waiting.  Safe to
 * call from the consumer thread at any time. */
void dio_engine_wake(dio_engine *e);

/* ------------------------------------------------------------------ the step loop */

/* The per-step synchronisation: a started-and-tested persistent MPI request, called through
 * the MPI library's MPI_Start and MPI_Test (looked up by the caller; request points at the
 * MPI_Request).  Polled with sched_yield between tests for spin_ns, then with naps of
 * nap_ns.  request NULL: no synchronisation (evaluation). */
/* What a rank whose batch failed sends in its step's allreduce (above any signal number):
 * every rank learns of the failure in that step and ends the loop there, so that the job can
 * end with an error all ranks agree on rather than one rank aborting it. */
#define DIO_STEP_FAILED 0x10000

typedef struct dio_step_sync {
    int   (*start)(void *request);
    int   (*test)(void *request, int *flag, void *status);
    void   *request;
    int64_t spin_ns;
    int64_t nap_ns;
    /* The request is an allreduce (MAX) of one int32 when these are set: before each start
     * *stop_out = the stop signal this process received (dio_stop_signal), or
     * DIO_STEP_FAILED when its batch failed; after completion *stop_in != 0 ends the loop on
     * every rank after the same step.  NULL: a barrier. */
    int32_t *stop_out;
    const int32_t *stop_in;
} dio_step_sync;

/* The steps to run: step i waits compute_ns[i] (the planned compute) after its host work on
 * the step loop's thread, what the training process spends taking its batch from the loader,
 * which is not compute: host_cpu_ns[i] of CPU time (dio_burn_cpu_ns: receiving, rebuilding,
 * pinning), then host_wait_ns[i] slept (waiting on the worker processes for the batch's
 * hand-over).  Either NULL = none. */
typedef struct dio_step_plan {
    int64_t        nsteps;
    const int64_t *compute_ns;
    const int64_t *host_cpu_ns;
    const int64_t *host_wait_ns;
    int64_t        start_ns;  /* when the first step began waiting for its batch */
} dio_step_plan;

/* One step's clock stamps (CLOCK_MONOTONIC ns) and what its batch brought. */
typedef struct dio_step_record {
    int64_t start;    /* began waiting for its batch (the previous step's end) */
    int64_t ready;    /* the engine had the batch complete */
    int64_t got;      /* the loop held it; its host work, then the compute, start */
    int64_t deadline; /* the planned compute ends (it started at deadline - compute_ns) */
    int64_t computed; /* the compute wait returned: the arrival at the synchronisation */
    int64_t synced;   /* the synchronisation returned */
    int64_t bytes;    /* bytes storage returned for the batch */
    int64_t ops;      /* read calls for the batch */
} dio_step_record;

/* Run steps->nsteps steps of the epoch started on e: take the next batch, spend its host CPU
 * time, wait compute_ns[i] with the pacer, synchronise (sync may be NULL); out[i] gets step
 * i's record, the first step starting at steps->start_ns.  Call without the GIL.  Returns the
 * number of steps run (nsteps, or fewer when the ranks agreed to stop, see dio_step_sync), or
 * -errno when a batch failed (the engine's error), another rank's did (ECONNABORTED; both after
 * the step's allreduce, which carried DIO_STEP_FAILED: *sync->stop_in says so on every rank)
 * or the MPI calls failed; the records of the steps before are filled. */
int64_t dio_engine_run_steps(dio_engine *e, dio_pacer *pacer, const dio_step_sync *sync,
                             const dio_step_plan *steps, dio_step_record *out, dio_error *err);

/* One step's synchronisation as the C step loop does it (for step loops in Python): start
 * the request, poll it (yielding, then napping); with stop_out/stop_in set, *stop_in holds the
 * agreed stop signal afterwards.  Call without the GIL.  Returns 0 or -errno. */
int dio_step_sync_once(const dio_step_sync *sync, dio_error *err);

/* A stop asked for by SIGINT or SIGTERM (a batch system's time limit, a user's Ctrl-C):
 * dio_stop_on_signals installs handlers that record the first such signal, so the job can end
 * at the next step on every rank and write its results; a second one takes the default
 * action (kills the process).  dio_stop_signal: the signal recorded, or 0.  Returns 0 or
 * -errno. */
int dio_stop_on_signals(void);
int dio_stop_signal(void);

typedef struct dio_engine_counters {
    int64_t opens;            /* open() calls since create */
    int64_t closes;           /* close() calls since create (cache evictions included) */
    int64_t stats;            /* fstat() calls since create (one per open, DIO_REQ_FSTAT) */
    int64_t bytes_read;       /* bytes transferred since create */
    int64_t read_ops;         /* pread calls since create */
    int64_t cache_reads;      /* DIO_REQ_CACHED/FILL requests read from their copies */
    int64_t cache_fills;      /* files copied into the cache tier (DIO_REQ_FILL) */
    int64_t cache_fill_bytes; /* bytes they held */
    int64_t cache_fill_ns;    /* time the fills took, summed over the threads */
    int64_t cache_evictions;  /* copies removed (evict_file) */
    int64_t cache_fallbacks;  /* opens of copies found gone (the file table's file opened) */
    int64_t cache_fallback_reads; /* DIO_REQ_CACHED/FILL requests read from the file table's
                                   * file since their copy was gone */
    int64_t cache_fallback_bytes; /* the bytes those requests asked for (their lengths) */
    int64_t cache_hit_fallbacks;  /* those of them with DIO_REQ_HIT */
    int64_t cache_fill_failures;  /* fills that ran out of room (ENOSPC, EDQUOT): temporary
                                   * removed, not counted as fills, the file itself read */
    int64_t preprocess_cpu_ns;  /* CPU time the readers spent on the plans' cpu_ns */
    int64_t preprocess_wall_ns; /* the wall time that took (more where the cores were shared) */
} dio_engine_counters;

void dio_engine_get_counters(const dio_engine *e, dio_engine_counters *out);

/* ------------------------------------------------------------------ copy */

typedef struct dio_copy_times {
    int64_t read_ns, write_ns;  /* time in pread and in pwrite, added to */
} dio_copy_times;

/* Copy bytes [offset, offset + length) of src to the same offsets of dst (dio_copy.c), through
 * buf (buf_size bytes, a multiple of align, aligned to it for O_DIRECT descriptors), adding the
 * time spent reading and writing to *times. 0 or -errno with *err filled (the paths only name
 * the files in the message); `stoppable`: -ECANCELED between two calls once a stop signal was
 * received (dio_stopped). */
int dio_copy_range(int src, int dst, int64_t offset, int64_t length, void *buf,
                   size_t buf_size, size_t align, int stoppable, dio_copy_times *times,
                   const char *src_path, const char *dst_path, dio_error *err);

/* ------------------------------------------------------------------ trace */

/* One epoch's read requests for output.trace (dio_trace.c): per request i, its Chrome
 * track tid[i], start (ns since the trace's origin), latency, bytes returned, file (an index
 * into path_off: the file's JSON-quoted path is paths[path_off[f]:path_off[f+1]]), offset,
 * length and step. head: the text each event begins with, up to its tid. */
typedef struct dio_trace_reads_in {
    size_t n;
    const char *head;
    size_t head_len;
    const int64_t *tid, *start_ns, *lat_ns, *nread, *file, *offset, *length, *step;
    const char *paths;
    const int64_t *path_off;
    int64_t epoch;
} dio_trace_reads_in;

/* Format the events of requests first.. into buf (cap bytes), each ",\n{...}", as many as
 * fit; *next = the first request not written. Returns the bytes written. */
size_t dio_trace_reads(char *buf, size_t cap, const dio_trace_reads_in *in, size_t first,
                       size_t *next);

#ifdef __cplusplus
}
#endif
#endif /* DIO_H */
