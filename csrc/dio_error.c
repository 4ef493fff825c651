/* dio_error.c - filling dio_error records. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dio_internal.h"

void dio_clear_error(dio_error *err)
{
    if (err) {
        err->code = 0;
        err->message[0] = '\0';
        err->path[0] = '\0';
    }
}

int dio_fail(dio_error *err, int code, const char *path, const char *fmt, ...)
{
    if (code <= 0)
        code = EIO;
    if (err) {
        va_list ap;
        err->code = code;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        snprintf(err->path, sizeof err->path, "%s", path ? path : "");
    }
    return -code;
}

int dio_fail_odirect(dio_error *err, int code, const char *path, const char *why)
{
    return dio_fail(err, code, path,
                    "O_DIRECT is not supported for %s (reader.odirect: true): %s%s%s%s; use a "
                    "file system that supports direct I/O or set reader.odirect: false",
                    path, strerror(code), why ? " (" : "", why ? why : "", why ? ")" : "");
}
