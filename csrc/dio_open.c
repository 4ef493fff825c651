/*
 * dio_open.c - opening a data file that someone else put there, without ever blocking on it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "dio_internal.h"

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif
#ifndef RAMFS_MAGIC
#define RAMFS_MAGIC 0x858458f6
#endif

int dio_odirect_fs_check(int fd)
{
    struct statfs fs;
    if (fstatfs(fd, &fs) != 0)
        return 0; /* cannot tell: let the reads decide */
    if ((unsigned long)fs.f_type == (unsigned long)TMPFS_MAGIC ||
        (unsigned long)fs.f_type == (unsigned long)RAMFS_MAGIC)
        return -EINVAL;
    return 0;
}

/* What a file that is not a regular one is, for messages. */
static const char *kind_of(mode_t mode)
{
    return S_ISDIR(mode)    ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISSOCK(mode) ? "a socket"
                            : "of an unknown type";
}

static int not_regular(dio_error *err, const char *path, mode_t mode)
{
    return dio_fail(err, S_ISDIR(mode) ? EISDIR : EINVAL, path, "%s is %s, not a regular file",
                    path, kind_of(mode));
}

int64_t dio_regular_size(const char *path, dio_error *err)
{
    struct stat st;
    dio_clear_error(err);
    if (!path)
        return dio_fail(err, EINVAL, "", "stat: no path");
    if (stat(path, &st) != 0) {
        int e = errno;
        return dio_fail(err, e, path, "stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode))
        return not_regular(err, path, st.st_mode);
    return (int64_t)st.st_size;
}

int dio_open_regular(const char *path, int odirect, dio_error *err)
{
    /* O_NONBLOCK: opening a FIFO (or a device) blocks until a writer comes; on a regular file
     * Linux ignores the flag, so reads keep their usual semantics */
    int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (odirect ? O_DIRECT : 0), fd;
    struct stat st;
    dio_clear_error(err);
    if (!path)
        return dio_fail(err, EINVAL, "", "open: no path");
    do {
        fd = open(path, flags);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        int e = errno;
        if (odirect && e == EINVAL) {
            /* also what O_DIRECT on a FIFO gives: say what the file is rather than blame the
             * file system (stat cannot block) */
            if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
                return not_regular(err, path, st.st_mode);
            return dio_fail_odirect(err, e, path, NULL);
        }
        return dio_fail(err, e, path, "open %s: %s", path, strerror(e));
    }
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dio_fail(err, e, path, "fstat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return not_regular(err, path, st.st_mode);
    }
    if (odirect && dio_odirect_fs_check(fd) != 0) {
        close(fd);
        return dio_fail_odirect(err, EINVAL, path, DIO_WHY_EMULATED);
    }
    return fd;
}
