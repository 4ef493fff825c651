/*
 * dio_copy.c - copying a byte range from one file to another in large calls (stage-in).
 *
 * Either descriptor may be O_DIRECT: reads are then asked for whole alignment units (a read
 * at the end of the file returns what is left), and a destination's last, unaligned piece is
 * written after clearing O_DIRECT on its descriptor (fcntl), as direct I/O cannot write it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dio_internal.h"

static int pread_full(int fd, char *buf, size_t want, int64_t offset, size_t need,
                      const char *path, dio_error *err)
{
    size_t got = 0;
    while (got < need) {
        ssize_t r = pread(fd, buf + got, want - got, (off_t)(offset + (int64_t)got));
        if (r < 0) {
            int e = errno;
            if (e == EINTR)
                continue;
            return dio_fail(err, e, path, "pread %s at offset %lld (%zu bytes): %s", path,
                            (long long)(offset + (int64_t)got), want - got, strerror(e));
        }
        if (r == 0)
            return dio_fail(err, EIO, path, "%s ends at %lld, before the %zu bytes to copy "
                            "from offset %lld: it changed since its size was taken", path,
                            (long long)(offset + (int64_t)got), need, (long long)offset);
        got += (size_t)r;
    }
    return 0;
}

int dio_copy_range(int src, int dst, int64_t offset, int64_t length, void *buf,
                   size_t buf_size, size_t align, int stoppable, dio_copy_times *times,
                   const char *src_path, const char *dst_path, dio_error *err)
{
    int src_direct = fcntl(src, F_GETFL) & O_DIRECT;
    int64_t done = 0;

    if (align == 0 || buf_size < align || buf_size % align)
        return dio_fail(err, EINVAL, NULL, "copy buffer of %zu bytes for alignment %zu",
                        buf_size, align);
    while (done < length) {
        size_t n = (size_t)(length - done < (int64_t)buf_size ? length - done : (int64_t)buf_size);
        size_t want = src_direct ? (n + align - 1) / align * align : n;
        int64_t t0 = dio_now_ns(), t1;
        int rc = stoppable ? dio_stopped(err, dst_path) : 0;
        if (rc < 0)
            return rc;
        rc = pread_full(src, buf, want, offset + done, n, src_path, err);
        if (rc < 0)
            return rc;
        t1 = dio_now_ns();
        times->read_ns += t1 - t0;
        if (n % align) {
            int flags = fcntl(dst, F_GETFL);
            if (flags >= 0 && (flags & O_DIRECT))
                fcntl(dst, F_SETFL, flags & ~O_DIRECT);
        }
        rc = dio_pwrite_all(dst, buf, n, offset + done, dst_path, err);
        if (rc < 0)
            return rc;
        times->write_ns += dio_now_ns() - t1;
        done += (int64_t)n;
    }
    return 0;
}

int dio_rename_noreplace(const char *from, const char *to)
{
#ifdef SYS_renameat2
    if (syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, 1 /* RENAME_NOREPLACE */) == 0)
        return 0;
    if (errno != ENOSYS && errno != EINVAL)
        return -1;
#endif
    /* a file system without renameat2's flag: link never replaces either */
    if (link(from, to) != 0)
        return -1;
    unlink(from);
    return 0;
}
