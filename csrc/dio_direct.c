/*
 * dio_direct.c - what O_DIRECT needs on a path (statx STATX_DIOALIGN) and whether it works
 * (a probe read through dio_open.c, which refuses file systems that only emulate it).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dio_internal.h"

#define FALLBACK_ALIGN 4096u

int dio_odirect_alignment(const char *path, uint32_t *mem_align, uint32_t *offset_align,
                          dio_error *err)
{
    uint32_t mem = FALLBACK_ALIGN, off = FALLBACK_ALIGN;
    dio_clear_error(err);
    if (!path)
        return dio_fail(err, EINVAL, "", "odirect_alignment: no path");
#if defined(STATX_DIOALIGN)
    {
        struct statx sx;
        unsigned mask = STATX_DIOALIGN;
#if defined(STATX_DIO_READ_ALIGN)
        mask |= STATX_DIO_READ_ALIGN;
#endif
        memset(&sx, 0, sizeof sx);
        if (statx(AT_FDCWD, path, 0, mask, &sx) != 0) {
            int e = errno;
            if (e != ENOSYS)
                return dio_fail(err, e, path, "statx %s: %s", path, strerror(e));
        } else if ((sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align != 0) {
            /* 0 means the file system refuses O_DIRECT: keep the fallback and let
             * dio_probe_odirect say so */
            mem = sx.stx_dio_mem_align;
            off = sx.stx_dio_offset_align;
#if defined(STATX_DIO_READ_ALIGN)
            if ((sx.stx_mask & STATX_DIO_READ_ALIGN) && sx.stx_dio_read_offset_align != 0)
                off = sx.stx_dio_read_offset_align;
#endif
        }
    }
#else
    {
        struct stat st;
        if (stat(path, &st) != 0) {
            int e = errno;
            return dio_fail(err, e, path, "stat %s: %s", path, strerror(e));
        }
    }
#endif
    if (mem_align)
        *mem_align = mem;
    if (offset_align)
        *offset_align = off;
    return 0;
}

int dio_probe_odirect(const char *path, dio_error *err)
{
    uint32_t mem = FALLBACK_ALIGN, off = FALLBACK_ALIGN, len;
    void *buf = NULL;
    ssize_t n;
    int fd, rc;
    dio_clear_error(err);
    if (!path)
        return dio_fail(err, EINVAL, "", "probe_odirect: no path");
    fd = dio_open_regular(path, 1, err);
    if (fd < 0)
        return fd;
#if defined(STATX_DIOALIGN)
    {
        struct statx sx;
        memset(&sx, 0, sizeof sx);
        if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
            (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align == 0) {
            close(fd);
            return dio_fail_odirect(err, EINVAL, path, "statx reports no direct I/O support");
        }
    }
#endif
    rc = dio_odirect_alignment(path, &mem, &off, NULL);
    len = off > FALLBACK_ALIGN ? off : FALLBACK_ALIGN;
    if (rc != 0 || posix_memalign(&buf, len, len) != 0) {
        close(fd);
        if (rc == 0)
            return dio_fail(err, ENOMEM, path, "probe_odirect %s: out of memory", path);
        return dio_fail(err, -rc, path, "probe_odirect %s: cannot query alignment", path);
    }
    do {
        n = pread(fd, buf, len, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        int e = errno;
        free(buf);
        close(fd);
        if (e == EINVAL)
            return dio_fail_odirect(err, e, path, NULL);
        return dio_fail(err, e, path, "pread %s with O_DIRECT at offset 0: %s", path,
                        strerror(e));
    }
    free(buf);
    close(fd);
    return 0;
}
