/*
 * dio_fdcache.h - a least-recently-used cache of open descriptors, keyed by file index.
 * Not thread-safe: each reader thread owns one.  Internal to csrc/.
 */
#ifndef DIO_FDCACHE_H
#define DIO_FDCACHE_H

#include <stdint.h>

typedef struct fd_entry {
    int64_t  file;  /* file index; -1 = unused */
    int      fd;
    int      fell_back; /* the caller's: a cache-tier copy's key holding the file itself */
    uint64_t used;  /* last use (the cache's clock) */
} fd_entry;

typedef struct fd_cache {
    int       cap;    /* entries */
    int       n;      /* entries in use */
    uint32_t  hmask;  /* hash table slots - 1 (a power of two >= 2 * cap) */
    int32_t  *slot;   /* hash table of entry indices, -1 = empty (linear probing) */
    fd_entry *ent;
    uint64_t  clock;
} fd_cache;

int  fd_cache_init(fd_cache *c, int cap);  /* 0 or -ENOMEM */
void fd_cache_free(fd_cache *c);           /* the descriptors must have been closed */

/* The entry of `file` (marked used), or NULL. */
fd_entry *fd_cache_find(fd_cache *c, int64_t file);

/* An entry to fill for `file`, which must not be cached: a free one, else the least recently
 * used one, whose descriptor is returned in *evicted_fd for the caller to close (-1 if none). */
fd_entry *fd_cache_insert(fd_cache *c, int64_t file, int *evicted_fd);

/* Drop the entry of `file`, returning its descriptor (-1 if it has none). */
int fd_cache_remove(fd_cache *c, int64_t file);

/* Drop the least recently used entry, returning its descriptor (-1 if the cache is empty). */
int fd_cache_evict(fd_cache *c);

/* Drop every entry; close_fd(fd, arg) is called for each descriptor. */
void fd_cache_clear(fd_cache *c, void (*close_fd)(int fd, void *arg), void *arg);

#endif /* DIO_FDCACHE_H */
