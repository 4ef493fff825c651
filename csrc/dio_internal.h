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

#endif /* DIO_INTERNAL_H */
