/*
 * dio_engine_cache.c - the cache tier: a file copied whole to its copy under a temporary
 * renamed into place without replacing (DIO_REQ_FILL), copies evicted as the plan says.
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

#include "dio_engine_internal.h"

/* A fill that failed with rc: out of room (ENOSPC, EDQUOT) is no error of the job (the copy
 * is not there, so the request reads the file itself, a fallback), only counted. */
static int fill_failed(dio_engine *e, int rc, dio_error *err)
{
    if (rc != -ENOSPC && rc != -EDQUOT)
        return rc;
    __atomic_fetch_add(&e->cache_fill_failures, 1, __ATOMIC_RELAXED);
    dio_clear_error(err);
    return 0;
}

/* DIO_REQ_FILL: copy file `file` whole into the cache tier, under a temporary renamed into
 * place without replacing a copy already there (then the temporary is dropped). */
int eng_fill_cache(dio_engine *e, worker *w, int64_t file, dio_error *err)
{
    const char *src = eng_file_path(&e->files, file, w->path);
    const char *dst = eng_file_path(&e->cache, file, w->cpath);
    dio_copy_times times = {0, 0};
    struct stat st;
    int64_t t0 = dio_now_ns();
    int in, out, rc;
    int stale = fd_cache_remove(&w->cache, file | CACHE_KEY);
    if (stale >= 0) /* the file itself, kept where its copy was gone: read the new copy */
        eng_close_counted(stale, e);
    if (!w->fill_buf && posix_memalign(&w->fill_buf, 4096, FILL_BUF) != 0) {
        w->fill_buf = NULL;
        return dio_fail(err, ENOMEM, dst, "cache fill of %s: out of memory", dst);
    }
    snprintf(w->tpath, sizeof w->tpath, "%s%s", dst, e->tmp_suffix);
    in = eng_open_file(e, w, file, 0, err);
    if (in < 0)
        return in;
    if (fstat(in, &st) != 0) {
        rc = dio_fail(err, errno, src, "cache fill: fstat %s: %s", src, strerror(errno));
        eng_close_counted(in, e);
        return rc;
    }
    out = open(w->tpath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC |
               (e->cfg.odirect ? O_DIRECT : 0), 0644);
    if (out < 0) {
        rc = dio_fail(err, errno, w->tpath, "cache fill: create %s: %s", w->tpath,
                      strerror(errno));
        eng_close_counted(in, e);
        return fill_failed(e, rc, err);
    }
    /* not stoppable: a stop ends the epoch at its next step, and the batch needs the file */
    rc = dio_copy_range(in, out, 0, (int64_t)st.st_size, w->fill_buf, FILL_BUF,
                        e->cfg.odirect ? e->cfg.align : 4096, 0, &times, src, w->tpath, err);
    eng_close_counted(in, e);
    if (close(out) != 0 && rc == 0) /* NFS may tell of a full server only here */
        rc = dio_fail(err, errno, w->tpath, "cache fill: close %s: %s", w->tpath,
                      strerror(errno));
    if (rc == 0 && dio_rename_noreplace(w->tpath, dst) != 0) {
        int er = errno;
        if (er != EEXIST)
            rc = dio_fail(err, er, dst, "cache fill: rename %s to %s: %s", w->tpath, dst,
                          strerror(er));
    }
    unlink(w->tpath); /* after a failure, or a copy that was there first; else gone already */
    if (rc < 0)
        return fill_failed(e, rc, err);
    __atomic_fetch_add(&e->cache_fills, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&e->cache_fill_bytes, (int64_t)st.st_size, __ATOMIC_RELAXED);
    __atomic_fetch_add(&e->cache_fill_ns, dio_now_ns() - t0, __ATOMIC_RELAXED);
    return 0;
}

/* Remove the cache tier's copies the plan evicts before request i (gone already: fine). */
void eng_evict_before(dio_engine *e, worker *w, int64_t i)
{
    for (int64_t k = e->evict_at[i]; k < e->evict_at[i + 1]; k++) {
        int64_t f = e->evict_file[k];
        int fd = fd_cache_remove(&w->cache, f | CACHE_KEY);
        if (fd >= 0) /* a descriptor this thread keeps on the copy would hold its space */
            eng_close_counted(fd, e);
        if (unlink(eng_file_path(&e->cache, f, w->cpath)) == 0)
            __atomic_fetch_add(&e->cache_evictions, 1, __ATOMIC_RELAXED);
    }
}
