# cython: language_level=3, boundscheck=False, wraparound=False
"""dlio_mpi._core - the C I/O core (csrc/dio.h) as Python calls.

A thin layer: one wrapper per C call, the GIL released around every call that can block, and
every failure turned into OSError(errno, message, path) by one helper (_check), so that
FileNotFoundError & co. come out as usual.  Arrays are typed memoryviews (any contiguous int64
buffer: numpy arrays, array.array('q'), ...); NumPy is not needed to build this module.
"""

from cpython.buffer cimport (PyBUF_ANY_CONTIGUOUS, PyBUF_SIMPLE, PyBUF_WRITABLE,
                             PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer)
from libc.errno cimport EIO
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset


cdef extern from "dio.h" nogil:
    ctypedef struct dio_error:
        int code
        char message[768]
        char path[4096]

    int64_t dio_now_ns()
    int64_t dio_sleep_until_ns(int64_t deadline_ns, int64_t spin_ns)
    int64_t dio_burn_cpu_ns(int64_t cpu_ns)
    int dio_set_timer_slack_ns(uint64_t slack_ns)

    ctypedef struct dio_pacer:
        int64_t spin_ns
        int64_t fixed_spin_ns
        int64_t waits
        int64_t spun_ns
        int64_t batch_poll_ns
        int64_t batch_polled_ns

    void dio_pacer_init(dio_pacer *p, int64_t fixed_spin_ns)
    int64_t dio_pacer_wait(dio_pacer *p, int64_t deadline_ns)
    uint32_t dio_crc32(uint32_t crc, const void *buf, size_t n)
    uint32_t dio_crc32c(uint32_t crc, const void *buf, size_t n)
    uint32_t dio_crc32c_mask(uint32_t crc)
    ctypedef struct dio_copy_times:
        int64_t read_ns
        int64_t write_ns

    int dio_copy_range(int src, int dst, int64_t offset, int64_t length, void *buf,
                       size_t buf_size, size_t align, int stoppable, dio_copy_times *times,
                       const char *src_path, const char *dst_path, dio_error *err)

    ctypedef struct dio_trace_reads_in:
        size_t n
        const char *head
        size_t head_len
        const int64_t *tid
        const int64_t *start_ns
        const int64_t *lat_ns
        const int64_t *nread
        const int64_t *file
        const int64_t *offset
        const int64_t *length
        const int64_t *step
        const char *paths
        const int64_t *path_off
        int64_t epoch

    size_t dio_trace_reads(char *buf, size_t cap, const dio_trace_reads_in *inp, size_t first,
                           size_t *next)
    int dio_write_tfrecords(int fd, int64_t offset, const void *head, size_t head_len,
                            const void *tail, size_t tail_len, uint64_t payload_len,
                            int64_t count, uint64_t seed, uint64_t start, size_t chunk,
                            const char *path, dio_error *err)
    void dio_fill_random(void *buf, size_t n, uint64_t seed)
    void dio_fill_random_at(void *buf, size_t n, uint64_t seed, uint64_t start)
    int dio_write_random(int fd, int64_t offset, int64_t nbytes, uint64_t seed, size_t chunk,
                         uint32_t *crc, const char *path, dio_error *err)
    int dio_syncfs(int fd)
    int64_t dio_write_ns()
    ctypedef struct dio_shard_stats:
        int64_t bytes
        int64_t calls
        int64_t io_ns
        int64_t syncs
        int64_t sync_ns
        int64_t verified
        int64_t emulator_ns
    ctypedef struct dio_content:
        uint32_t random_bytes
        uint64_t unique
    void dio_ckpt_fill(void *buf, size_t n, uint64_t seed, uint64_t start, const dio_content *c)
    int64_t dio_ckpt_check(const void *buf, size_t n, uint64_t seed, uint64_t start,
                           const dio_content *c, uint64_t whole_every, int64_t *compared)
    int dio_shard_write(int fd, int64_t offset, int64_t nbytes, uint64_t seed,
                        const dio_content *c, size_t chunk, int odirect, int do_fsync,
                        dio_shard_stats *st, const char *path, dio_error *err)
    size_t dio_shard_chunk(size_t chunk, int64_t nbytes)
    int dio_shard_prepare(size_t chunk, int count)
    int dio_shard_snapshot(void *dst, int64_t nbytes, uint64_t seed, const dio_content *c,
                           size_t chunk, double bytes_per_second)
    int dio_buffer_write(int fd, int64_t offset, const void *buf, int64_t nbytes, size_t chunk,
                         int odirect, int do_fsync, dio_shard_stats *st, const char *path,
                         dio_error *err)
    int dio_shard_read(int fd, int64_t offset, int64_t nbytes, uint64_t seed,
                       const dio_content *c, size_t chunk, int verify, dio_shard_stats *st,
                       const char *path, dio_error *err)
    int dio_stop_on_signals()
    int dio_stop_signal()
    int dio_permute(uint64_t n, uint64_t seed, const int64_t *inp, int64_t count, int64_t *out)
    int64_t dio_gather(void *dst, int64_t dst_len, const void *src, int64_t src_len,
                       const int64_t *at, const int64_t *length, int64_t count)
    int dio_odirect_alignment(const char *path, uint32_t *mem_align, uint32_t *offset_align,
                              dio_error *err)
    int dio_probe_odirect(const char *path, dio_error *err)
    int dio_open_regular(const char *path, int odirect, dio_error *err)
    int64_t dio_regular_size(const char *path, dio_error *err)

    ctypedef struct dio_engine:
        pass

    ctypedef struct dio_engine_config:
        int nthreads
        int prefetch
        int odirect
        int fd_cache
        uint32_t align
        int discard
        int64_t watchdog_ns
        int watchdog_abort
        const char *who
        int whole_batches

    ctypedef struct dio_file_pattern:
        int64_t nfiles
        const char *folder
        int64_t subfolders
        int sub_digits
        const char *stem
        int digits
        const char *tail

    ctypedef struct dio_epoch_plan:
        int64_t nbatches
        const int64_t *batch_start
        const int64_t *file_idx
        const int64_t *offset
        const int64_t *length
        const int64_t *expect
        const uint32_t *flags
        const int64_t *delay_ns
        const int64_t *cpu_ns
        int64_t not_before_ns
        const int64_t *evict_at
        const int64_t *evict_file

    ctypedef struct dio_epoch_outputs:
        int64_t *req_buf_off
        int64_t *lat_ns
        int64_t *nread
        int64_t *start_ns
        int64_t *thread

    dio_engine *dio_engine_create(const dio_engine_config *cfg, dio_error *err)
    void dio_engine_destroy(dio_engine *e)
    int dio_engine_set_files(dio_engine *e, int64_t nfiles, const char *const *paths,
                             dio_error *err)
    int dio_engine_set_file_pattern(dio_engine *e, const dio_file_pattern *p, dio_error *err)
    int dio_engine_set_cache(dio_engine *e, const dio_file_pattern *p, int64_t nfiles,
                             const char *const *paths, const char *tmp_suffix, dio_error *err)
    void dio_engine_close_files(dio_engine *e)
    int dio_engine_drop_cache(dio_engine *e, const int64_t *files, int64_t n, dio_error *err)
    int dio_engine_reserve(dio_engine *e, const dio_epoch_plan *plan, dio_error *err)
    int dio_engine_start_epoch(dio_engine *e, const dio_epoch_plan *plan,
                               const dio_epoch_outputs *out, dio_error *err)
    uint32_t DIO_REQ_OPEN
    int DIO_MAX_THREADS
    uint32_t DIO_REQ_CLOSE
    uint32_t DIO_REQ_FSTAT
    uint32_t DIO_REQ_MMAP
    uint32_t DIO_REQ_CACHED
    uint32_t DIO_REQ_FILL
    uint32_t DIO_REQ_HIT

    ctypedef struct dio_batch:
        int64_t index
        void *data
        int64_t data_len
        int64_t nreq
        int64_t bytes_requested
        int64_t bytes_read
        int64_t read_ops
        int64_t ready_ns

    int dio_engine_next(dio_engine *e, dio_batch *out, int flags, dio_error *err)

    int32_t DIO_STEP_FAILED

    ctypedef struct dio_step_sync:
        int (*start)(void *request)
        int (*test)(void *request, int *flag, void *status)
        void *request
        int64_t spin_ns
        int64_t nap_ns
        int32_t *stop_out
        const int32_t *stop_in

    ctypedef struct dio_step_record:
        int64_t start

    ctypedef struct dio_step_plan:
        int64_t nsteps
        const int64_t *compute_ns
        const int64_t *host_cpu_ns
        const int64_t *host_wait_ns
        int64_t start_ns

    int dio_step_sync_once(const dio_step_sync *sync, dio_error *err)
    int64_t dio_engine_run_steps(dio_engine *e, dio_pacer *pacer, const dio_step_sync *sync,
                                 const dio_step_plan *steps, dio_step_record *out,
                                 dio_error *err)

    ctypedef struct dio_engine_counters:
        int64_t opens
        int64_t closes
        int64_t stats
        int64_t bytes_read
        int64_t read_ops
        int64_t cache_reads
        int64_t cache_fills
        int64_t cache_fill_bytes
        int64_t cache_fill_ns
        int64_t cache_evictions
        int64_t cache_fallbacks
        int64_t cache_fallback_reads
        int64_t cache_fallback_bytes
        int64_t cache_hit_fallbacks
        int64_t cache_fill_failures
        int64_t preprocess_cpu_ns
        int64_t preprocess_wall_ns

    void dio_engine_get_counters(const dio_engine *e, dio_engine_counters *out)


cdef extern from "errno.h":
    int ECANCELED  # not in Cython's libc.errno


cdef Py_ssize_t GIL_FREE_BYTES = 65536  # checksum/fill calls on less keep the GIL

cdef uint64_t U64_MASK = 0xFFFFFFFFFFFFFFFF


cdef int _check(int rc, dio_error *err) except -1:
    """The one place a C failure becomes an exception: OSError(errno, message, path), which
    Python turns into FileNotFoundError, PermissionError, ... by errno."""
    if rc >= 0:
        return rc
    code = err.code if err.code else -rc
    if code == ECANCELED:  # a loop that moves bytes saw the stop signal (dio_stopped)
        from .errors import StopRequested

        raise StopRequested(dio_stop_signal())
    if code <= 0:
        code = EIO
    message = err.message.decode("utf-8", "replace") or f"dio call failed ({code})"
    path = err.path.decode("utf-8", "surrogateescape")
    if path:
        raise OSError(code, message, path)
    raise OSError(code, message)


cdef inline void _clear(dio_error *err) noexcept nogil:
    err.code = 0
    err.message[0] = 0
    err.path[0] = 0


cdef bytes _fspath(path):
    import os
    return os.fsencode(path)


# ---------------------------------------------------------------------------- time

def now_ns():
    """CLOCK_MONOTONIC in nanoseconds."""
    return dio_now_ns()


def sleep_until_ns(int64_t deadline_ns, int64_t spin_ns=0):
    """Wait (GIL released) until the absolute CLOCK_MONOTONIC deadline: sleep, then poll the
    clock for the last spin_ns; returns now_ns() after waking, which is >= deadline_ns."""
    cdef int64_t t
    with nogil:
        t = dio_sleep_until_ns(deadline_ns, spin_ns)
    return t


def burn_cpu_ns(int64_t cpu_ns):
    """Spend cpu_ns of the calling thread's CPU time on integer work (GIL released): the
    stand-in for CPU work of that cost, contending for the cores as it would; returns
    now_ns() when done."""
    cdef int64_t t
    with nogil:
        t = dio_burn_cpu_ns(cpu_ns)
    return t


def set_timer_slack_ns(uint64_t slack_ns):
    """Set the calling thread's timer slack (prctl PR_SET_TIMERSLACK; 0 = the minimum)."""
    cdef dio_error err
    _clear(&err)
    rc = dio_set_timer_slack_ns(slack_ns)
    if rc < 0:
        err.code = -rc
    _check(rc, &err)


cdef class Pacer:
    """Paces the step loop's waits (dio_pacer): each compute wait sleeps until `spin_ns` before
    its deadline and polls the clock for the rest (fixed_spin_ns < 0 adapts the spin to how
    late this machine's sleeps wake up); the C step loop polls for a batch still being read
    for up to batch_poll_ns before sleeping (dio_engine_next_polling). One thread at a time."""
    cdef dio_pacer p

    def __cinit__(self, int64_t fixed_spin_ns=-1, int64_t batch_poll_ns=0):
        if batch_poll_ns < 0:
            raise ValueError(f"batch_poll_ns must be >= 0, got {batch_poll_ns}")
        dio_pacer_init(&self.p, fixed_spin_ns)
        self.p.batch_poll_ns = batch_poll_ns

    def wait_until(self, int64_t deadline_ns):
        """Wait (GIL released) until the CLOCK_MONOTONIC deadline; returns now_ns() after."""
        cdef int64_t t
        with nogil:
            t = dio_pacer_wait(&self.p, deadline_ns)
        return t

    @property
    def spin_ns(self):
        """The spin the next wait will use."""
        return self.p.spin_ns

    @property
    def adaptive(self):
        return self.p.fixed_spin_ns < 0

    @property
    def waits(self):
        return self.p.waits

    @property
    def spun_ns(self):
        """Time spent polling the clock over all waits."""
        return self.p.spun_ns

    @property
    def batch_poll_ns(self):
        return self.p.batch_poll_ns

    @property
    def batch_polled_ns(self):
        """Time the C step loop spent polling for batches, over all steps."""
        return self.p.batch_polled_ns


# ---------------------------------------------------------------------------- checksums

cdef uint32_t _crc(object data, uint32_t crc, bint castagnoli) except? 0xFFFFFFFF:
    cdef Py_buffer view
    cdef uint32_t out
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if view.len >= GIL_FREE_BYTES:
            with nogil:
                if castagnoli:
                    out = dio_crc32c(crc, view.buf, <size_t>view.len)
                else:
                    out = dio_crc32(crc, view.buf, <size_t>view.len)
        elif castagnoli:
            out = dio_crc32c(crc, view.buf, <size_t>view.len)
        else:
            out = dio_crc32(crc, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return out


def crc32(data, crc=0):
    """zlib-compatible CRC-32 of a bytes-like object, continuing crc (zlib.crc32 semantics)."""
    return _crc(data, <uint32_t>(crc & 0xFFFFFFFF), False)


def crc32c(data, crc=0):
    """CRC-32C (Castagnoli) of a bytes-like object, continuing crc."""
    return _crc(data, <uint32_t>(crc & 0xFFFFFFFF), True)


def masked_crc32c(data, crc=0):
    """TFRecord's masked CRC-32C of a bytes-like object (crc: an unmasked CRC-32C to continue):
    ((c >> 15) | (c << 17)) + 0xa282ead8 mod 2^32 of c = crc32c(data, crc)."""
    return dio_crc32c_mask(_crc(data, <uint32_t>(crc & 0xFFFFFFFF), True))


# ---------------------------------------------------------------------------- payloads

PAYLOAD_BLOCK = 8 << 20  # DIO_PAYLOAD_BLOCK: the stream is reseeded every so many bytes


def fill_random(buffer, seed, uint64_t start=0):
    """Fill a writable contiguous buffer with the pseudo-random stream of seed from its byte
    `start` on (the same seed always gives the same bytes; a shorter buffer gets a prefix of
    the same stream; a part of it can be made alone, fastest from a multiple of
    PAYLOAD_BLOCK)."""
    cdef Py_buffer view
    cdef uint64_t s = <uint64_t>(seed & U64_MASK)
    PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
    try:
        if view.len >= GIL_FREE_BYTES:
            with nogil:
                dio_fill_random_at(view.buf, <size_t>view.len, s, start)
        else:
            dio_fill_random_at(view.buf, <size_t>view.len, s, start)
    finally:
        PyBuffer_Release(&view)


def write_random(int fd, int64_t offset, int64_t nbytes, seed, size_t chunk=0, path="",
                 crc=0):
    """pwrite nbytes of the fill_random(seed) stream to fd at offset (chunks of at most chunk
    bytes, 0 = 8 MiB) and return the CRC-32 of the written bytes continued from crc (pass the
    CRC of a header written before to chain it).  path is only used in error messages."""
    cdef dio_error err
    cdef uint64_t s = <uint64_t>(seed & U64_MASK)
    cdef uint32_t c = <uint32_t>(crc & 0xFFFFFFFF)
    cdef bytes bpath = _fspath(path)
    cdef const char *cpath = bpath
    cdef int rc
    _clear(&err)
    with nogil:
        rc = dio_write_random(fd, offset, nbytes, s, chunk, &c, cpath, &err)
    _check(rc, &err)
    return c


def write_tfrecords(int fd, int64_t offset, const unsigned char[::1] head,
                    const unsigned char[::1] tail, uint64_t payload_len, int64_t count, seed,
                    uint64_t start=0, size_t chunk=0, path=""):
    """pwrite `count` TFRecord records to fd at offset, each head + payload_len bytes of the
    fill_random(seed) stream (record r: from byte start + r*payload_len on) + tail + the masked
    CRC-32C of the data (all but head's first 12 bytes, which hold the length and its CRC);
    in chunks of at most chunk bytes (0 = 8 MiB).  path is only used in error messages."""
    cdef dio_error err
    cdef uint64_t s = <uint64_t>(seed & U64_MASK)
    cdef bytes bpath = _fspath(path)
    cdef const char *cpath = bpath
    cdef const unsigned char *h = &head[0] if head.shape[0] else NULL
    cdef const unsigned char *t = &tail[0] if tail.shape[0] else NULL
    cdef size_t hlen = head.shape[0], tlen = tail.shape[0]
    cdef int rc
    _clear(&err)
    with nogil:
        rc = dio_write_tfrecords(fd, offset, h, hlen, t, tlen, payload_len, count, s, start,
                                 chunk, cpath, &err)
    _check(rc, &err)


cdef dict _shard_stats(dio_shard_stats *st):
    return {"bytes": st.bytes, "calls": st.calls, "io_ns": st.io_ns, "syncs": st.syncs,
            "sync_ns": st.sync_ns, "verified": st.verified, "emulator_ns": st.emulator_ns}


cdef const dio_content *_content(content, dio_content *c) except? NULL:
    """checkpoint.content as the C struct: None (the fresh stream), or (random bytes of each
    4 KiB granule, granules before one repeats: 0 for none)."""
    if content is None:
        return NULL
    c.random_bytes, c.unique = content
    return c


def ckpt_fill(buffer, seed, uint64_t start=0, content=None):
    """Fill a writable buffer with bytes [start, start + len) of the checkpoint stream of seed
    (dio_ckpt_fill), under `content` (see _content)."""
    cdef Py_buffer view
    cdef dio_content c
    cdef const dio_content *cp = _content(content, &c)
    cdef uint64_t s = <uint64_t>(seed & U64_MASK)
    PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
    try:
        with nogil:
            dio_ckpt_fill(view.buf, <size_t>view.len, s, start, cp)
    finally:
        PyBuffer_Release(&view)


def ckpt_check(buffer, seed, uint64_t start=0, content=None, uint64_t whole_every=0):
    """Compare a buffer with bytes [start, start + len) of the checkpoint stream of seed: every
    4 KiB granule's first 64 bytes, and the whole of every granule whose number is a multiple
    of whole_every (1: all; 0: none); (-1, or the offset in the buffer of the first granule
    that differs, and the bytes compared)."""
    cdef Py_buffer view
    cdef dio_content c
    cdef const dio_content *cp = _content(content, &c)
    cdef uint64_t s = <uint64_t>(seed & U64_MASK)
    cdef int64_t bad, compared = 0
    PyObject_GetBuffer(buffer, &view, PyBUF_ANY_CONTIGUOUS)
    try:
        with nogil:
            bad = dio_ckpt_check(view.buf, <size_t>view.len, s, start, cp, whole_every,
                                 &compared)
    finally:
        PyBuffer_Release(&view)
    return bad, compared


def write_shard(int fd, int64_t offset, int64_t nbytes, seed, size_t chunk=0, bint odirect=False,
                bint fsync=False, path="", content=None):
    """Write the nbytes of the checkpoint shard of seed to fd at offset (dio_shard_write: the
    checkpoint stream under `content`, made a block ahead by a second thread, in calls of chunk
    bytes; O_DIRECT set on fd when asked; fsync at the end when asked); returns its stats
    (bytes, calls, io_ns, syncs, sync_ns, emulator_ns)."""
    cdef dio_error err
    cdef dio_shard_stats st
    cdef dio_content c
    cdef const dio_content *cp = _content(content, &c)
    cdef uint64_t s = <uint64_t>(seed & U64_MASK)
    cdef bytes bpath = _fspath(path)
    cdef const char *cpath = bpath
    cdef int rc
    _clear(&err)
    with nogil:
        rc = dio_shard_write(fd, offset, nbytes, s, cp, chunk, odirect, fsync, &st, cpath, &err)
    _check(rc, &err)
    return _shard_stats(&st)


def write_ns():
    """Nanoseconds this process has spent so far in the C core's data writes (pwrite calls of
    write_random, write_tfrecords and the copy engine): a phase's storage time is the
    difference across it."""
    return dio_write_ns()


def shard_prepare(size_t chunk, int count=2):
    """Allocate and touch the C core's `count` shard buffers of chunk bytes now (kept by the
    process), so that the first save does not pay their page faults."""
    if dio_shard_prepare(chunk, count) < 0:
        raise MemoryError(f"shard_prepare: cannot allocate {count} buffers of {chunk} bytes")


def shard_chunk(size_t chunk, int64_t nbytes):
    """The chunk write_shard and read_shard use for a shard of nbytes asked for `chunk`."""
    return dio_shard_chunk(chunk, nbytes)


def shard_snapshot(buffer, seed, size_t chunk=0, double bytes_per_second=0, content=None):
    """Fill the writable `buffer` with the shard of seed as write_shard(chunk, content) writes
    it, block by block (dio_shard_snapshot); bytes_per_second > 0 paces it."""
    cdef Py_buffer view
    cdef dio_content c
    cdef const dio_content *cp = _content(content, &c)
    cdef uint64_t s = <uint64_t>(seed & U64_MASK)
    cdef int rc
    PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
    try:
        with nogil:
            rc = dio_shard_snapshot(view.buf, <int64_t>view.len, s, cp, chunk,
                                    bytes_per_second)
    finally:
        PyBuffer_Release(&view)
    if rc == -ECANCELED:  # the stop signal, between two blocks or in the pacing's wait
        from .errors import StopRequested

        raise StopRequested(dio_stop_signal())


def write_buffer(int fd, int64_t offset, buffer, size_t chunk=0, bint odirect=False,
                 bint fsync=False, path=""):
    """Write `buffer` to fd at offset as write_shard writes (dio_buffer_write: calls of
    chunk bytes, O_DIRECT and a final fsync when asked); returns the stats as write_shard's.
    Releases the GIL: the background writer of asynchronous checkpoints runs it in a thread."""
    cdef Py_buffer view
    cdef dio_error err
    cdef dio_shard_stats st
    cdef bytes bpath = _fspath(path)
    cdef const char *cpath = bpath
    cdef int rc
    _clear(&err)
    PyObject_GetBuffer(buffer, &view, PyBUF_ANY_CONTIGUOUS)
    try:
        with nogil:
            rc = dio_buffer_write(fd, offset, view.buf, <int64_t>view.len, chunk, odirect,
                                  fsync, &st, cpath, &err)
    finally:
        PyBuffer_Release(&view)
    _check(rc, &err)
    return _shard_stats(&st)


def read_shard(int fd, int64_t offset, int64_t nbytes, seed, size_t chunk=0, int verify=1,
               path="", content=None):
    """Read a shard written by write_shard back and check it (dio_shard_read: the first 64
    bytes of every 4 KiB, every 64th 4 KiB whole; verify=2 everything, 0 nothing); returns
    its stats; OSError (EIO) naming the offset that differs."""
    cdef dio_error err
    cdef dio_shard_stats st
    cdef dio_content c
    cdef const dio_content *cp = _content(content, &c)
    cdef uint64_t s = <uint64_t>(seed & U64_MASK)
    cdef bytes bpath = _fspath(path)
    cdef const char *cpath = bpath
    cdef int rc
    _clear(&err)
    with nogil:
        rc = dio_shard_read(fd, offset, nbytes, s, cp, chunk, verify, &st, cpath, &err)
    _check(rc, &err)
    return _shard_stats(&st)


cdef void _step_sync(tuple sync, dio_step_sync *s) except *:
    """A StepSync.native tuple as the C struct."""
    s.start = <int (*)(void *) noexcept nogil><size_t>sync[0]
    s.test = <int (*)(void *, int *, void *) noexcept nogil><size_t>sync[1]
    s.request = <void *><size_t>sync[2]
    s.spin_ns = sync[3]
    s.nap_ns = sync[4]
    s.stop_out = <int32_t *><size_t>sync[5]
    s.stop_in = <const int32_t *><size_t>sync[6]


def sync_once(tuple sync):
    """One step's synchronisation as the C step loop does it (see Engine.run_steps for the
    tuple), the GIL released while it polls."""
    cdef dio_step_sync s
    cdef dio_error err
    cdef int rc
    _step_sync(sync, &s)
    _clear(&err)
    with nogil:
        rc = dio_step_sync_once(&s, &err)
    _check(rc, &err)


# what a rank whose batch failed sends in the step's allreduce (StepSync.failed)
STEP_FAILED = DIO_STEP_FAILED


def stop_on_signals():
    """From now on SIGINT and SIGTERM ask for a stop (stop_signal()) rather than end the
    process; a second one ends it."""
    cdef int rc = dio_stop_on_signals()
    if rc < 0:
        raise OSError(-rc, "sigaction failed")


def stop_signal():
    """The SIGINT or SIGTERM received since stop_on_signals(), or 0."""
    return dio_stop_signal()


def syncfs(int fd):
    """syncfs(2): flush everything written to the file system that holds fd."""
    cdef int rc
    with nogil:
        rc = dio_syncfs(fd)
    if rc < 0:
        import os
        raise OSError(-rc, os.strerror(-rc))


# ---------------------------------------------------------------------------- copy

cdef extern from "stdlib.h" nogil:
    int posix_memalign(void **memptr, size_t alignment, size_t size)


cdef class Copier:
    """Copies byte ranges between files in calls of `buffer_bytes` (csrc/dio_copy.c), through
    one buffer aligned to `align` (for O_DIRECT descriptors), the GIL released; keeps the
    time spent reading and writing."""

    cdef void *buf
    cdef size_t size, align
    cdef dio_copy_times times

    def __cinit__(self, size_t buffer_bytes=64 << 20, size_t align=4096):
        if align == 0 or buffer_bytes < align or buffer_bytes % align:
            raise ValueError(f"Copier: buffer_bytes {buffer_bytes} is not a multiple of the "
                             f"alignment {align}")
        self.size, self.align = buffer_bytes, align
        self.times.read_ns = self.times.write_ns = 0
        if posix_memalign(&self.buf, align, buffer_bytes) != 0:
            self.buf = NULL
            raise MemoryError(f"Copier: {buffer_bytes} bytes aligned to {align}")
        memset(self.buf, 0, buffer_bytes)  # faulted in now, not during the timed copy

    def __dealloc__(self):
        free(self.buf)

    def copy(self, int src, int dst, int64_t offset, int64_t length, src_path="",
             dst_path=""):
        """Bytes [offset, offset + length) of src to the same offsets of dst."""
        cdef dio_error err
        cdef bytes bsrc = _fspath(src_path), bdst = _fspath(dst_path)
        cdef const char *csrc = bsrc
        cdef const char *cdst = bdst
        cdef int rc
        _clear(&err)
        with nogil:
            rc = dio_copy_range(src, dst, offset, length, self.buf, self.size, self.align, 1,
                                &self.times, csrc, cdst, &err)
        _check(rc, &err)

    @property
    def read_ns(self):
        return self.times.read_ns

    @property
    def write_ns(self):
        return self.times.write_ns


# ---------------------------------------------------------------------------- trace

def trace_reads(bytes head, const int64_t[::1] tid not None, const int64_t[::1] start_ns not None,
                const int64_t[::1] lat_ns not None, const int64_t[::1] nread not None,
                const int64_t[::1] file not None, const int64_t[::1] offset not None,
                const int64_t[::1] length not None, const int64_t[::1] step not None,
                bytes paths, const int64_t[::1] path_off not None, int64_t epoch, sink,
                size_t chunk=1 << 22):
    """output.trace's read events (csrc/dio_trace.c), ",\\n{...}" each, handed to
    `sink(bytearray)` in chunks of at most `chunk` bytes. Per request: its track, start (ns since the trace's
    origin), latency, bytes returned, file (index f: its JSON-quoted path is
    paths[path_off[f]:path_off[f+1]]), offset, length and step."""
    cdef dio_trace_reads_in inp
    cdef size_t n = tid.shape[0], first = 0, nxt = 0, used
    cdef bytearray buf
    cdef char *out
    if not (start_ns.shape[0] == lat_ns.shape[0] == nread.shape[0] == file.shape[0]
            == offset.shape[0] == length.shape[0] == step.shape[0] == <Py_ssize_t>n):
        raise ValueError("trace_reads: the per-request columns differ in length")
    cdef size_t i
    cdef int64_t files = path_off.shape[0] - 1
    cdef bint bad = False
    with nogil:
        for i in range(n):
            if file[i] < 0 or file[i] >= files:
                bad = True
                break
    if bad:
        raise ValueError("trace_reads: a file index has no path")
    inp.n, inp.head, inp.head_len, inp.epoch = n, head, len(head), epoch
    inp.paths, inp.path_off = paths, &path_off[0]
    if n:
        inp.tid, inp.start_ns, inp.lat_ns, inp.nread = &tid[0], &start_ns[0], &lat_ns[0], &nread[0]
        inp.file, inp.offset, inp.length, inp.step = &file[0], &offset[0], &length[0], &step[0]
    while first < n:
        buf = bytearray(chunk)
        out = buf
        with nogil:
            used = dio_trace_reads(out, chunk, &inp, first, &nxt)
        if nxt == first:
            raise ValueError("trace_reads: an event does not fit in a chunk")
        del buf[used:]
        sink(buf)
        first = nxt


# ---------------------------------------------------------------------------- shuffling

def permute(uint64_t n, seed, int64_t[::1] values not None):
    """Replace each value x of the int64 array by pi(x), pi the seeded pseudo-random
    permutation of [0, n)."""
    cdef uint64_t s = <uint64_t>(seed & U64_MASK)
    cdef int64_t count = values.shape[0]
    cdef int64_t *p = &values[0] if count > 0 else NULL
    cdef int rc
    with nogil:
        rc = dio_permute(n, s, p, count, p)
    if rc < 0:
        raise ValueError(f"permute: a value is not within [0, {n})")



def gather(unsigned char[::1] out not None, const unsigned char[::1] src not None,
           const int64_t[::1] at not None, const int64_t[::1] length not None):
    """Copy src[at[i]:at[i] + length[i]] for each i, in order and end to end, into out (the GIL
    released); return the bytes copied. ValueError, nothing copied, if a range is outside src
    or they do not fit in out."""
    cdef int64_t count = at.shape[0]
    cdef int64_t got
    if length.shape[0] != count:
        raise ValueError(f"gather: {count} offsets but {length.shape[0]} lengths")
    if count == 0:
        return 0
    with nogil:
        got = dio_gather(&out[0] if out.shape[0] else NULL, out.shape[0],
                         &src[0] if src.shape[0] else NULL, src.shape[0], &at[0], &length[0],
                         count)
    if got < 0:
        raise ValueError(f"gather: a range is outside the {src.shape[0]} bytes of the source "
                         f"or the ranges exceed the {out.shape[0]} bytes of the destination")
    return got

# ---------------------------------------------------------------------------- direct I/O

def odirect_alignment(path):
    """(mem_align, offset_align) O_DIRECT needs on path (statx STATX_DIOALIGN; 4096 for both
    when the kernel or file system does not say)."""
    cdef dio_error err
    cdef uint32_t mem = 0, off = 0
    cdef bytes bpath = _fspath(path)
    cdef const char *cpath = bpath
    cdef int rc
    _clear(&err)
    with nogil:
        rc = dio_odirect_alignment(cpath, &mem, &off, &err)
    _check(rc, &err)
    return (mem, off)


def probe_odirect(path):
    """Raise OSError (EINVAL, naming the path and reader.odirect) if path cannot be read with
    O_DIRECT, e.g. on tmpfs; None if it can."""
    cdef dio_error err
    cdef bytes bpath = _fspath(path)
    cdef const char *cpath = bpath
    cdef int rc
    _clear(&err)
    with nogil:
        rc = dio_probe_odirect(cpath, &err)
    _check(rc, &err)


# ---------------------------------------------------------------------------- data files

def open_regular(path):
    """Open a data file someone else put there for reading as the engine opens it
    (dio_open_regular): never blocking on a FIFO or device in its place, and refusing anything
    but a regular file with OSError naming the path and what it is.  Returns a binary file."""
    cdef dio_error err
    cdef bytes bpath = _fspath(path)
    cdef const char *cpath = bpath
    cdef int fd
    _clear(&err)
    with nogil:
        fd = dio_open_regular(cpath, 0, &err)
    _check(fd, &err)
    import os
    return os.fdopen(fd, "rb")


def regular_size(path):
    """The size of path (stat), refused as open_regular refuses anything but a regular file."""
    cdef dio_error err
    cdef bytes bpath = _fspath(path)
    cdef const char *cpath = bpath
    cdef int64_t size
    _clear(&err)
    with nogil:
        size = dio_regular_size(cpath, &err)
    if size < 0:
        _check(<int>size, &err)
    return size


# ---------------------------------------------------------------------------- engine

cdef class _BatchView:
    """Exports a batch buffer read-only through the buffer protocol."""
    cdef object owner  # the Engine: keeps it (and its buffers) from being deallocated
    cdef void *ptr
    cdef Py_ssize_t size

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        PyBuffer_FillInfo(buffer, self, self.ptr, self.size, 1, flags)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass


cdef int64_t _fill_plan(dio_epoch_plan *plan, const int64_t[::1] batch_start,
                        const int64_t[::1] file_idx, const int64_t[::1] offset,
                        const int64_t[::1] length, const uint32_t[::1] flags,
                        const int64_t[::1] expect, const int64_t[::1] delay_ns=None,
                        const int64_t[::1] evict_at=None,
                        const int64_t[::1] evict_file=None,
                        const int64_t[::1] cpu_ns=None, int64_t not_before_ns=0) except -1:
    """Point `plan` at the arrays after checking their lengths; returns the request count."""
    if batch_start.shape[0] < 1:
        raise ValueError("batch_start needs nbatches + 1 entries (at least one)")
    cdef int64_t nreq = batch_start[batch_start.shape[0] - 1]
    for name, arr in (("file_idx", file_idx), ("offset", offset), ("length", length)):
        if arr.shape[0] != nreq:
            raise ValueError(f"{name} has {arr.shape[0]} entries, batch_start says {nreq}")
    for name, arr in (("flags", flags), ("expect", expect), ("delay_ns", delay_ns),
                      ("cpu_ns", cpu_ns)):
        if arr is not None and arr.shape[0] != nreq:
            raise ValueError(f"{name} has {arr.shape[0]} entries, expected {nreq}")
    plan.nbatches = batch_start.shape[0] - 1
    plan.batch_start = &batch_start[0]
    plan.file_idx = plan.offset = plan.length = plan.expect = plan.delay_ns = NULL
    plan.cpu_ns = NULL
    plan.not_before_ns = not_before_ns
    plan.flags = NULL
    plan.evict_at = plan.evict_file = NULL
    if evict_at is not None:
        if evict_at.shape[0] != nreq + 1 or evict_file is None:
            raise ValueError(f"evict_at needs {nreq + 1} entries and evict_file")
        plan.evict_at = &evict_at[0]
        if evict_file.shape[0] > 0:
            plan.evict_file = &evict_file[0]
    if nreq > 0:
        plan.file_idx = &file_idx[0]
        plan.offset = &offset[0]
        plan.length = &length[0]
        if flags is not None:
            plan.flags = &flags[0]
        if expect is not None:
            plan.expect = &expect[0]
        if delay_ns is not None:
            plan.delay_ns = &delay_ns[0]
        if cpu_ns is not None:
            plan.cpu_ns = &cpu_ns[0]
    return nreq


cdef char _empty[1]


cdef class Batch:
    """One batch of the epoch, as dio_engine_next returned it.

    `data` is a read-only memoryview of the engine's batch buffer (data_len bytes; request i's
    bytes start at req_buf_off[i]).  It is only valid until the next Engine.next(),
    Engine.start_epoch(), Engine.set_files() or Engine.close(): the engine then reuses (or
    frees) that memory.  Copy what must be kept (bytes(batch.data[a:b]))."""
    cdef readonly int64_t index
    cdef readonly int64_t nreq
    cdef readonly int64_t bytes_requested
    cdef readonly int64_t bytes_read
    cdef readonly int64_t read_ops
    cdef readonly int64_t ready_ns
    cdef readonly int64_t data_len
    cdef readonly object data

    def __repr__(self):
        return (f"Batch(index={self.index}, nreq={self.nreq}, "
                f"bytes_requested={self.bytes_requested}, bytes_read={self.bytes_read}, "
                f"read_ops={self.read_ops}, data_len={self.data_len})")


MAX_THREADS = DIO_MAX_THREADS  # reader.read_threads at most
REQ_OPEN = DIO_REQ_OPEN
REQ_CLOSE = DIO_REQ_CLOSE
REQ_FSTAT = DIO_REQ_FSTAT
REQ_MMAP = DIO_REQ_MMAP
REQ_CACHED = DIO_REQ_CACHED
REQ_FILL = DIO_REQ_FILL
REQ_HIT = DIO_REQ_HIT


cdef class Engine:
    """The read engine: `threads` reader threads (0 = read inside next()), `prefetch` batches
    read ahead of the one being consumed, optional O_DIRECT with extents aligned to `align`
    (0 = 4096), `fd_cache` descriptors kept open (split over the threads, each an LRU).

    The watchdog: an open or read of a reader thread in flight for `watchdog_s` seconds (0 =
    never) is reported on stderr, naming `who` and the file, while next() or run_steps() waits
    for it; with `watchdog_abort` they raise OSError(ETIMEDOUT) instead.  Not with threads=0.
    `whole_batches`: each reader thread takes a whole batch at a time (a DataLoader's workers);
    else the threads share a batch in chunks of requests.

    Use from one thread at a time.  Usage per epoch: start_epoch(...), then next() until it
    returns None."""
    cdef dio_engine *e
    cdef bint busy
    # the caller's output arrays of the current epoch, kept alive (and exported) for it
    cdef object _outs

    def __cinit__(self, int threads, int prefetch, odirect=False, int fd_cache=256,
                  uint32_t align=0, discard=False, double watchdog_s=0.0, watchdog_abort=False,
                  who="", whole_batches=False):
        cdef dio_engine_config cfg
        cdef dio_error err
        cdef bytes bwho = who.encode()
        self.e = NULL
        self.busy = False
        self._outs = None
        if threads < 0:
            raise ValueError(f"threads must be >= 0, got {threads}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        if fd_cache < 1:
            raise ValueError(f"fd_cache must be >= 1, got {fd_cache}")
        if align & (align - 1):
            raise ValueError(f"align must be a power of two, got {align}")
        if not 0 <= watchdog_s < 2**33:
            raise ValueError(f"watchdog_s must be within [0, 2^33), got {watchdog_s}")
        cfg.nthreads = threads
        cfg.prefetch = prefetch
        cfg.odirect = 1 if odirect else 0
        cfg.fd_cache = fd_cache
        cfg.align = align
        cfg.discard = 1 if discard else 0
        cfg.watchdog_ns = <int64_t>(watchdog_s * 1e9)
        cfg.watchdog_abort = 1 if watchdog_abort else 0
        cfg.who = bwho
        cfg.whole_batches = 1 if whole_batches else 0
        _clear(&err)
        with nogil:
            self.e = dio_engine_create(&cfg, &err)
        if self.e == NULL:
            _check(-(err.code or EIO), &err)

    def __dealloc__(self):
        if self.e != NULL:
            with nogil:
                dio_engine_destroy(self.e)
            self.e = NULL

    cdef int _ready(self) except -1:
        if self.e == NULL:
            raise ValueError("the engine is closed")
        if self.busy:
            raise RuntimeError("the engine is in use by another thread (next())")
        return 0

    def close(self):
        """Stop the threads, close descriptors, free the buffers. Idempotent."""
        if self.e == NULL:
            return
        if self.busy:
            raise RuntimeError("the engine is in use by another thread (next())")
        cdef dio_engine *e = self.e
        self.e = NULL
        with nogil:
            dio_engine_destroy(e)
        self._outs = None

    @property
    def closed(self):
        return self.e == NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def set_files(self, paths):
        """Set the file table (requests name files by index). Abandons an epoch in flight."""
        self._ready()
        cdef list encoded = [_fspath(p) for p in paths]
        cdef Py_ssize_t n = len(encoded), i
        cdef const char **cpaths = <const char **>malloc(sizeof(char *) * (n if n > 0 else 1))
        cdef dio_error err
        cdef int rc
        if cpaths == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                cpaths[i] = <const char *>(<bytes>encoded[i])
            _clear(&err)
            with nogil:
                rc = dio_engine_set_files(self.e, n, cpaths, &err)
            if rc == 0:
                self._outs = None  # the epoch was abandoned: its outputs are free again
            _check(rc, &err)
        finally:
            free(cpaths)

    def start_epoch(self, requests not None, int64_t[::1] req_buf_off=None,
                    int64_t[::1] lat_ns=None, int64_t[::1] nread=None,
                    int64_t[::1] start_ns=None, int64_t[::1] thread=None,
                    int64_t not_before_ns=0):
        """Start an epoch of `requests`, the read plan whole (sampling.requests.ReadPlan, or
        EpochRequests: the fields the engine takes): batch b is requests [batch_start[b],
        batch_start[b+1]) of (file_idx, offset, length) (contiguous int64 arrays; copied),
        with optional uint32 `flags` (REQ_OPEN, REQ_CLOSE, REQ_FSTAT, REQ_MMAP), int64
        `expect` (bytes that must arrive, less than length only where a read reaches the end
        of the file, which must end there), int64 `delay_ns` (slept by the reader thread
        after the request's read: a loader's per-sample preprocessing; the batch is ready
        after it) and int64 `cpu_ns` (then spent as CPU time, burn_cpu_ns: the preprocessing
        as CPU work); the cache tier (set_cache): flags REQ_CACHED, REQ_FILL and REQ_HIT
        (a planned hit, for the counters), and `evict_at` (nreq + 1 offsets) into `evict_file`: the copies removed before each
        request.  No request starts before the CLOCK_MONOTONIC time `not_before_ns` (0: at
        once; a loader's start-up).
        Optional int64 outputs of one entry per request, kept referenced by the engine for the
        epoch: req_buf_off (filled now: where request i's bytes start in its batch's data),
        lat_ns and nread (filled as requests complete: pread latency, bytes transferred, with
        O_DIRECT the aligned extent clipped at end of file); for tracing, start_ns and thread
        (both or neither: when each request's read began, CLOCK_MONOTONIC ns, and the reader
        thread that served it, -1 for the caller's).  Any epoch in flight is abandoned
        first."""
        self._ready()
        cdef dio_epoch_plan plan
        cdef dio_epoch_outputs outs
        cdef dio_error err
        cdef int rc
        cdef int64_t nreq = _fill_plan(&plan, requests.batch_start, requests.file_idx,
                                       requests.offset, requests.length, requests.flags,
                                       requests.expect, requests.delay_ns, requests.evict_at,
                                       requests.evict_file, requests.cpu_ns, not_before_ns)
        for name, arr in (("req_buf_off", req_buf_off), ("lat_ns", lat_ns), ("nread", nread),
                          ("start_ns", start_ns), ("thread", thread)):
            if arr is not None and arr.shape[0] != nreq:
                raise ValueError(f"{name} has {arr.shape[0]} entries, expected {nreq}")
        if (start_ns is None) != (thread is None):
            raise ValueError("start_ns and thread go together")
        outs.req_buf_off = outs.lat_ns = outs.nread = outs.start_ns = outs.thread = NULL
        if nreq > 0:
            if req_buf_off is not None:
                outs.req_buf_off = &req_buf_off[0]
            if lat_ns is not None:
                outs.lat_ns = &lat_ns[0]
            if nread is not None:
                outs.nread = &nread[0]
            if start_ns is not None:
                outs.start_ns = &start_ns[0]
                outs.thread = &thread[0]
        _clear(&err)
        with nogil:
            rc = dio_engine_start_epoch(self.e, &plan, &outs, &err)
        # Hold the memoryviews: their buffer exports keep the arrays alive and unresizable while
        # the threads write into them.  On failure keep the previous ones: the C call may have
        # failed before abandoning the epoch in flight.
        if rc == 0:
            self._outs = (req_buf_off, lat_ns, nread, start_ns, thread)
        _check(rc, &err)

    def set_cache(self, tmp_suffix, int64_t nfiles=0, folder=None, int64_t subfolders=0,
                  int sub_digits=1, stem=None, int digits=1, tail=None, paths=None):
        """The cache tier's copies of the file table's files: DLIO's naming formula as
        set_file_pattern's (folder, stem, tail given), or the list `paths`; `tmp_suffix`
        ends a fill's temporaries (".dlio_mpi-<tag>.tmp")."""
        self._ready()
        cdef bytes bsuffix = _fspath(tmp_suffix)
        cdef const char *csuffix = bsuffix
        cdef bytes bfolder, bstem, btail
        cdef dio_file_pattern p
        cdef dio_error err
        cdef int rc
        cdef const char **cpaths = NULL
        cdef list keep = []
        cdef int64_t i, n = 0
        _clear(&err)
        if paths is None:
            bfolder, bstem, btail = _fspath(folder), _fspath(stem), _fspath(tail)
            p.nfiles, p.folder, p.subfolders, p.sub_digits = nfiles, bfolder, subfolders, sub_digits
            p.stem, p.digits, p.tail = bstem, digits, btail
            with nogil:
                rc = dio_engine_set_cache(self.e, &p, 0, NULL, csuffix, &err)
        else:
            keep = [_fspath(x) for x in paths]
            n = len(keep)
            cpaths = <const char **>malloc(max(n, 1) * sizeof(char *))
            if cpaths == NULL:
                raise MemoryError()
            try:
                for i in range(n):
                    cpaths[i] = <bytes>keep[i]
                with nogil:
                    rc = dio_engine_set_cache(self.e, NULL, n, cpaths, csuffix, &err)
            finally:
                free(cpaths)
        if rc == 0:
            self._outs = None
        _check(rc, &err)

    def reserve(self, requests not None):
        """Allocate and fault in the batch buffers an epoch of `requests` needs (before its
        clock starts; the read plan whole, as start_epoch takes it). Abandons an epoch in
        flight."""
        self._ready()
        cdef dio_epoch_plan plan
        cdef dio_error err
        cdef int rc
        _fill_plan(&plan, requests.batch_start, requests.file_idx, requests.offset,
                   requests.length, requests.flags, requests.expect)
        _clear(&err)
        with nogil:
            rc = dio_engine_reserve(self.e, &plan, &err)
        if rc == 0:
            self._outs = None
        _check(rc, &err)

    def set_file_pattern(self, int64_t nfiles, folder, int64_t subfolders, int sub_digits,
                         stem, int digits, tail):
        """Set the file table as DLIO's naming formula: file i is
        folder/[<i mod subfolders>/]<stem><i><tail>, zero-padded to sub_digits and digits."""
        self._ready()
        cdef bytes bfolder = _fspath(folder), bstem = _fspath(stem), btail = _fspath(tail)
        cdef dio_file_pattern p
        cdef dio_error err
        cdef int rc
        p.nfiles = nfiles
        p.folder = bfolder
        p.subfolders = subfolders
        p.sub_digits = sub_digits
        p.stem = bstem
        p.digits = digits
        p.tail = btail
        _clear(&err)
        with nogil:
            rc = dio_engine_set_file_pattern(self.e, &p, &err)
        if rc == 0:
            self._outs = None
        _check(rc, &err)

    def close_files(self):
        """Abandon an epoch in flight and close every descriptor the engine holds."""
        self._ready()
        with nogil:
            dio_engine_close_files(self.e)
        self._outs = None

    def drop_cache(self, const int64_t[::1] files not None):
        """posix_fadvise(DONTNEED) the given files (indices into the file table)."""
        self._ready()
        cdef dio_error err
        cdef int rc
        cdef int64_t n = files.shape[0]
        cdef const int64_t *p = &files[0] if n > 0 else NULL
        _clear(&err)
        with nogil:
            rc = dio_engine_drop_cache(self.e, p, n, &err)
        self._outs = None
        _check(rc, &err)

    def next(self):
        """Release the previous batch and wait (GIL released) for the next one; None at the
        end of the epoch (or with no epoch).  Raises OSError if a request of the batch failed
        (or the watchdog aborts: ETIMEDOUT); the error repeats on later calls until a new epoch
        starts."""
        self._ready()
        cdef dio_batch b
        cdef dio_error err
        cdef int rc
        _clear(&err)
        self.busy = True
        try:
            with nogil:
                rc = dio_engine_next(self.e, &b, 0, &err)
        finally:
            self.busy = False
        _check(rc, &err)
        if rc == 0:
            return None
        cdef _BatchView view = _BatchView.__new__(_BatchView)
        view.owner = self
        view.ptr = b.data if b.data != NULL else <void *>_empty
        view.size = b.data_len if b.data != NULL else 0
        cdef Batch out = Batch.__new__(Batch)
        out.index = b.index
        out.nreq = b.nreq
        out.bytes_requested = b.bytes_requested
        out.bytes_read = b.bytes_read
        out.read_ops = b.read_ops
        out.ready_ns = b.ready_ns
        out.data_len = b.data_len
        out.data = memoryview(view)
        return out

    def run_steps(self, Pacer pacer not None, sync, const int64_t[::1] compute_ns not None,
                  int64_t start_ns, int64_t[:, ::1] out not None,
                  const int64_t[::1] host_cpu_ns=None, const int64_t[::1] host_wait_ns=None):
        """Run the epoch's steps in C (GIL released): for step i take the next batch, spend
        host_cpu_ns[i] of CPU time (burn_cpu_ns) and sleep host_wait_ns[i] (None: none), wait
        compute_ns[i] with `pacer` from then, synchronise; out[i] gets (start, ready, got,
        deadline, computed, synced, bytes, read ops).  sync: None, or (MPI_Start address, MPI_Test
        address, address of a persistent MPI_Request, spin ns, nap ns, address of the int32
        the request sends, of the int32 it receives); the last two 0 for a barrier, else the
        request is an allreduce (MAX) of this process's stop signal and the loop ends after
        the step in which any rank had one.  Returns the number of steps run.  Raises
        OSError like next() when a batch fails."""
        self._ready()
        cdef dio_step_sync s
        cdef dio_step_sync *sp = NULL
        cdef dio_error err
        cdef int64_t rc
        cdef int64_t n = compute_ns.shape[0]
        cdef dio_step_plan steps
        if out.shape[0] != n or out.shape[1] != 8:
            raise ValueError(f"out must be ({n}, 8), got ({out.shape[0]}, {out.shape[1]})")
        for name, arr in (("host_cpu_ns", host_cpu_ns), ("host_wait_ns", host_wait_ns)):
            if arr is not None and arr.shape[0] != n:
                raise ValueError(f"{name} has {arr.shape[0]} entries, expected {n}")
        steps.nsteps = n
        steps.compute_ns = &compute_ns[0] if n > 0 else NULL
        steps.host_cpu_ns = &host_cpu_ns[0] if n > 0 and host_cpu_ns is not None else NULL
        steps.host_wait_ns = &host_wait_ns[0] if n > 0 and host_wait_ns is not None else NULL
        steps.start_ns = start_ns
        if sync is not None:
            _step_sync(sync, &s)
            sp = &s
        _clear(&err)
        self.busy = True
        try:
            with nogil:
                rc = dio_engine_run_steps(self.e, &pacer.p, sp, &steps,
                                          <dio_step_record *>&out[0, 0] if n > 0 else NULL,
                                          &err)
        finally:
            self.busy = False
        if rc < 0:
            _check(<int>rc, &err)
        return rc

    def counters(self):
        """Totals since the engine was created: opens, closes, stats, bytes_read, read_ops,
        the cache tier's (dio.h dio_engine_counters) and the preprocessing's."""
        cdef dio_engine_counters c
        if self.e == NULL:
            raise ValueError("the engine is closed")
        dio_engine_get_counters(self.e, &c)
        return {"opens": c.opens, "closes": c.closes, "stats": c.stats,
                "bytes_read": c.bytes_read, "read_ops": c.read_ops,
                "cache_reads": c.cache_reads, "cache_fills": c.cache_fills,
                "cache_fill_bytes": c.cache_fill_bytes, "cache_fill_ns": c.cache_fill_ns,
                "cache_evictions": c.cache_evictions, "cache_fallbacks": c.cache_fallbacks,
                "cache_fallback_reads": c.cache_fallback_reads,
                "cache_fallback_bytes": c.cache_fallback_bytes,
                "cache_hit_fallbacks": c.cache_hit_fallbacks,
                "cache_fill_failures": c.cache_fill_failures,
                "preprocess_cpu_ns": c.preprocess_cpu_ns,
                "preprocess_wall_ns": c.preprocess_wall_ns}
