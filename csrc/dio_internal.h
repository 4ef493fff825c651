/*
 * dio_internal.h - helpers shared by the csrc/ files; not part of the public API (dio.h).
 */
#ifndef DIO_INTERNAL_H
#define DIO_INTERNAL_H

#include "dio.h"

#if defined(__GNUC__)
#define DIO_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define DIO_LIKELY(x) __builtin_expect(!!(x), 1)
#define DIO_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define DIO_PRINTF(a, b)
#define DIO_LIKELY(x) (x)
#define DIO_UNLIKELY(x) (x)
#endif

/* Fill *err (if not NULL): code, path (may be NULL) and a printf-style message.
 * Returns -code so callers can write `return dio_fail(err, ...)`. */
int dio_fail(dio_error *err, int code, const char *path, const char *fmt, ...) DIO_PRINTF(4, 5);

/* Reset *err to "no error" (if not NULL). */
void dio_clear_error(dio_error *err);

/* The message for an O_DIRECT refusal (EINVAL from open/read, or a file system that only
 * emulates direct I/O); why (may be NULL) is appended to strerror(code).  Returns -code. */
int dio_fail_odirect(dio_error *err, int code, const char *path, const char *why);

#define DIO_WHY_EMULATED "the file system only emulates direct I/O through the page cache"

/* 0 if the file system behind fd does real direct I/O as far as we can tell, else -EINVAL
 * (tmpfs/ramfs: since Linux 6.6 tmpfs accepts O_DIRECT but serves it from the page cache,
 * which would silently measure memory instead of storage). */
int dio_odirect_fs_check(int fd);

/* A position in the payload stream of a seed (dio_random.c; see dio_fill_random): seek once,
 * then fill piece after piece, the pieces getting consecutive bytes of the stream. */
typedef struct dio_rng {
    uint64_t s[4];
    unsigned char left[8]; /* bytes of the last output not handed out yet */
    int nleft;
} dio_rng;

typedef struct dio_stream {
    dio_rng r;
    uint64_t seed, pos; /* pos: the next byte's offset in the stream */
} dio_stream;

void dio_stream_seek(dio_stream *st, uint64_t seed, uint64_t pos);
void dio_stream_fill(dio_stream *st, void *buf, size_t n);

/* pwrite all n bytes of buf to fd at offset (EINTR retried); 0 or -errno with *err filled
 * (path only names the file in the message). */
int dio_pwrite_all(int fd, const void *buf, size_t n, int64_t offset, const char *path,
                   dio_error *err);

/* Rename from to to unless something is named to (then -1 with errno EEXIST): renameat2's
 * RENAME_NOREPLACE, or link + unlink where the file system lacks it.  0 or -1 with errno. */
int dio_rename_noreplace(const char *from, const char *to);

/* Seconds after the first SIGINT/SIGTERM before the process ends by the signal's default
 * action if it has not ended by itself (dio_signal.c's backstop). */
#define DIO_STOP_GRACE_S 20

/* -ECANCELED with *err saying so when a stop signal was received (dio_stop_signal), else 0:
 * the loops that move bytes or wait call it between two calls. */
int dio_stopped(dio_error *err, const char *path);

#endif /* DIO_INTERNAL_H */
