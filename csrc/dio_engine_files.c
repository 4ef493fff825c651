/*
 * dio_engine_files.c - the engine's file tables (a list of paths, or DLIO's naming formula) and
 * descriptors: each reader's LRU cache, the access in progress, counted opens and closes.
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

/* ------------------------------------------------------------------ file table */

void eng_table_free(file_table *t)
{
    if (t->paths)
        for (int64_t i = 0; i < t->nfiles; i++)
            free(t->paths[i]);
    free(t->paths);
    free(t->folder);
    free(t->stem);
    free(t->tail);
    memset(t, 0, sizeof *t);
}

/* The path of file `file`; pattern names are formatted into buf (PATH_MAX_LEN bytes). */
const char *eng_file_path(const file_table *t, int64_t file, char *buf)
{
    if (t->paths)
        return t->paths[file];
    if (t->subfolders > 1)
        snprintf(buf, PATH_MAX_LEN, "%s/%0*lld/%s%0*lld%s", t->folder, t->sub_digits,
                 (long long)(file % t->subfolders), t->stem, t->digits, (long long)file,
                 t->tail);
    else
        snprintf(buf, PATH_MAX_LEN, "%s/%s%0*lld%s", t->folder, t->stem, t->digits,
                 (long long)file, t->tail);
    return buf;
}

/* ------------------------------------------------------------------ descriptors */

void eng_close_counted(int fd, void *arg)
{
    dio_engine *e = arg;
    close(fd);
    __atomic_fetch_add(&e->closes, 1, __ATOMIC_RELAXED);
}

void eng_flush_worker(dio_engine *e, worker *w)
{
    fd_cache_clear(&w->cache, eng_close_counted, e);
    if (w->access_fd >= 0)
        eng_close_counted(w->access_fd, e);
    w->access_fd = -1;
}

int eng_worker_init(dio_engine *e, worker *w, int cache_cap)
{
    w->e = e;
    w->access_fd = -1;
    return fd_cache_init(&w->cache, cache_cap);
}

/* Open file `file` as this engine reads (dio_open_regular: never blocks on a FIFO or device,
 * refuses anything but a regular file, checks O_DIRECT's file system), in the thread's watch
 * slot.  On EMFILE the thread gives back its least recently used cached descriptors and tries
 * again.  `cached`: its copy, or where that is gone the file itself (w->fell_back set). */
int eng_open_file(dio_engine *e, worker *w, int64_t file, int cached, dio_error *err)
{
    const char *path = cached ? eng_file_path(&e->cache, file, w->cpath)
                              : eng_file_path(&e->files, file, w->path);
    int fd, victim;
    w->fell_back = 0;
    watch_begin(&w->watch, WATCH_OPEN, file, dio_now_ns());
    if (DIO_UNLIKELY(e->stall_ns > 0))
        eng_stall_if_chosen(e, w, WATCH_OPEN, file);
    while ((fd = dio_open_regular(path, e->cfg.odirect, err)) == -EMFILE || fd == -ENFILE) {
        if ((victim = fd_cache_evict(&w->cache)) < 0)
            break;
        eng_close_counted(victim, e);
    }
    watch_end(&w->watch);
    if (fd >= 0) {
        __atomic_fetch_add(&e->opens, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&e->stats, 1, __ATOMIC_RELAXED); /* dio_open_regular's fstat */
    } else if (cached && fd == -ENOENT) { /* the copy is gone: read the file itself */
        __atomic_fetch_add(&e->cache_fallbacks, 1, __ATOMIC_RELAXED);
        dio_clear_error(err);
        fd = eng_open_file(e, w, file, 0, err);
        w->fell_back = fd >= 0; /* its reads are counted as the file's, not the copy's */
    }
    return fd;
}

/* The descriptor for a request outside an access: from the thread's cache, else opened;
 * *fell_back: it is the file itself where its copy was asked for (the copy was gone). */
int eng_cached_fd(dio_engine *e, worker *w, int64_t file, int cached, int *fell_back,
                  dio_error *err)
{
    int64_t key = cached ? file | CACHE_KEY : file;
    fd_entry *ent = fd_cache_find(&w->cache, key);
    int fd, victim;
    if (DIO_LIKELY(ent != NULL)) {
        *fell_back = ent->fell_back;
        return ent->fd;
    }
    fd = eng_open_file(e, w, file, cached, err);
    if (fd < 0)
        return fd;
    ent = fd_cache_insert(&w->cache, key, &victim);
    if (victim >= 0)
        eng_close_counted(victim, e);
    ent->fd = fd;
    ent->fell_back = *fell_back = w->fell_back;
    return fd;
}

/* Abandon the epoch and close every descriptor the threads hold. */
static void close_all(dio_engine *e)
{
    eng_abandon_epoch(e);
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->nworkers; i++)
        eng_flush_worker(e, &e->workers[i]);
    eng_flush_worker(e, &e->self);
    pthread_mutex_unlock(&e->mu);
}

/* Install a new file table (the old epoch's file indices mean nothing with it). */
static void install_files(dio_engine *e, file_table *t)
{
    close_all(e);
    pthread_mutex_lock(&e->mu);
    eng_table_free(&e->files);
    e->files = *t;
    pthread_mutex_unlock(&e->mu);
}

static int list_table(file_table *tp, int64_t nfiles, const char *const *paths,
                      dio_error *err)
{
    file_table t = {0};
    if (nfiles < 0 || (nfiles > 0 && !paths))
        return dio_fail(err, EINVAL, "", "set_files: invalid arguments");
    t.nfiles = nfiles;
    t.paths = calloc((size_t)(nfiles > 0 ? nfiles : 1), sizeof *t.paths);
    if (!t.paths)
        return dio_fail(err, ENOMEM, "", "set_files: out of memory (%lld files)",
                        (long long)nfiles);
    for (int64_t i = 0; i < nfiles; i++) {
        if (!paths[i]) {
            eng_table_free(&t);
            return dio_fail(err, EINVAL, "", "set_files: path %lld is NULL", (long long)i);
        }
        if (!(t.paths[i] = strdup(paths[i]))) {
            eng_table_free(&t);
            return dio_fail(err, ENOMEM, "", "set_files: out of memory");
        }
    }
    *tp = t;
    return 0;
}

static int pattern_table(file_table *tp, const dio_file_pattern *p, dio_error *err)
{
    file_table t = {0};
    if (!p || p->nfiles < 0 || !p->folder || !p->stem || !p->tail || p->digits < 1 ||
        p->digits > 20 || p->sub_digits < 1 || p->sub_digits > 20)
        return dio_fail(err, EINVAL, "", "set_file_pattern: invalid arguments");
    t.nfiles = p->nfiles;
    t.subfolders = p->subfolders;
    t.sub_digits = p->sub_digits;
    t.digits = p->digits;
    t.folder = strdup(p->folder);
    t.stem = strdup(p->stem);
    t.tail = strdup(p->tail);
    if (!t.folder || !t.stem || !t.tail) {
        eng_table_free(&t);
        return dio_fail(err, ENOMEM, "", "set_file_pattern: out of memory");
    }
    *tp = t;
    return 0;
}

int dio_engine_set_files(dio_engine *e, int64_t nfiles, const char *const *paths, dio_error *err)
{
    file_table t;
    int rc;
    dio_clear_error(err);
    if (!e)
        return dio_fail(err, EINVAL, "", "set_files: invalid arguments");
    if ((rc = list_table(&t, nfiles, paths, err)) < 0)
        return rc;
    install_files(e, &t);
    return 0;
}

int dio_engine_set_file_pattern(dio_engine *e, const dio_file_pattern *p, dio_error *err)
{
    file_table t;
    int rc;
    dio_clear_error(err);
    if (!e)
        return dio_fail(err, EINVAL, "", "set_file_pattern: invalid arguments");
    if ((rc = pattern_table(&t, p, err)) < 0)
        return rc;
    install_files(e, &t);
    return 0;
}

int dio_engine_set_cache(dio_engine *e, const dio_file_pattern *p, int64_t nfiles,
                         const char *const *paths, const char *tmp_suffix, dio_error *err)
{
    file_table t;
    char *suffix;
    int rc;
    dio_clear_error(err);
    if (!e || !tmp_suffix || !*tmp_suffix || strlen(tmp_suffix) > 60)
        return dio_fail(err, EINVAL, "", "set_cache: invalid arguments");
    rc = p ? pattern_table(&t, p, err) : list_table(&t, nfiles, paths, err);
    if (rc < 0)
        return rc;
    if (!(suffix = strdup(tmp_suffix))) {
        eng_table_free(&t);
        return dio_fail(err, ENOMEM, "", "set_cache: out of memory");
    }
    close_all(e);
    pthread_mutex_lock(&e->mu);
    eng_table_free(&e->cache);
    free(e->tmp_suffix);
    e->cache = t;
    e->tmp_suffix = suffix;
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void dio_engine_close_files(dio_engine *e)
{
    if (e)
        close_all(e);
}

int dio_engine_drop_cache(dio_engine *e, const int64_t *files, int64_t n, dio_error *err)
{
    char buf[PATH_MAX_LEN];
    dio_clear_error(err);
    if (!e || n < 0 || (n > 0 && !files))
        return dio_fail(err, EINVAL, "", "drop_cache: invalid arguments");
    eng_abandon_epoch(e);
    for (int64_t i = 0; i < n; i++) {
        const char *path;
        int fd, rc;
        if (files[i] < 0 || files[i] >= e->files.nfiles)
            return dio_fail(err, EINVAL, "", "drop_cache: file %lld is not in the table",
                            (long long)files[i]);
        path = eng_file_path(&e->files, files[i], buf);
        fd = dio_open_regular(path, 0, err);
        if (fd < 0)
            return fd;
        rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
        if (rc != 0)
            return dio_fail(err, rc, path, "posix_fadvise %s: %s", path, strerror(rc));
    }
    return 0;
}
