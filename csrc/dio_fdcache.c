/* dio_fdcache.c - a least-recently-used cache of open descriptors (see dio_fdcache.h).
 * Lookups hash the file index into an open-addressing table; eviction scans for the oldest
 * entry, which is O(capacity) but only happens on a miss with a full cache. Entries in use
 * are always ent[0 .. n). */
#include <errno.h>
#include <stdlib.h>

#include "dio_fdcache.h"

static inline uint32_t hash(int64_t file)
{
    uint64_t z = (uint64_t)file * 0x9e3779b97f4a7c15ULL;
    return (uint32_t)(z >> 32);
}

int fd_cache_init(fd_cache *c, int cap)
{
    uint32_t slots = 2;
    if (cap < 1)
        cap = 1;
    while (slots < 2u * (uint32_t)cap)
        slots <<= 1;
    c->cap = cap;
    c->n = 0;
    c->hmask = slots - 1;
    c->clock = 0;
    c->slot = malloc(sizeof *c->slot * slots);
    c->ent = malloc(sizeof *c->ent * (size_t)cap);
    if (!c->slot || !c->ent) {
        fd_cache_free(c);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < slots; i++)
        c->slot[i] = -1;
    for (int i = 0; i < cap; i++)
        c->ent[i].file = -1;
    return 0;
}

void fd_cache_free(fd_cache *c)
{
    free(c->slot);
    free(c->ent);
    c->slot = NULL;
    c->ent = NULL;
    c->n = 0;
}

static uint32_t slot_of(const fd_cache *c, int64_t file)
{
    uint32_t i = hash(file) & c->hmask;
    while (c->slot[i] >= 0 && c->ent[c->slot[i]].file != file)
        i = (i + 1) & c->hmask;
    return i;
}

fd_entry *fd_cache_find(fd_cache *c, int64_t file)
{
    int32_t k = c->slot[slot_of(c, file)];
    if (k < 0)
        return NULL;
    c->ent[k].used = ++c->clock;
    return &c->ent[k];
}

/* Remove table slot i, shifting later members of its probe run back (no tombstones). */
static void unlink_slot(fd_cache *c, uint32_t i)
{
    uint32_t j = i;
    c->slot[i] = -1;
    for (;;) {
        j = (j + 1) & c->hmask;
        if (c->slot[j] < 0)
            return;
        uint32_t home = hash(c->ent[c->slot[j]].file) & c->hmask;
        /* can the member at j move to the hole at i? only if its home is not in (i, j] */
        int movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            c->slot[i] = c->slot[j];
            c->slot[j] = -1;
            i = j;
        }
    }
}

static int oldest(const fd_cache *c)
{
    int best = -1;
    for (int k = 0; k < c->n; k++)
        if (best < 0 || c->ent[k].used < c->ent[best].used)
            best = k;
    return best;
}

/* Entries in use are always ent[0 .. n): insert fills ent[n], eviction swaps the last entry
 * into the hole. */
static int drop_entry(fd_cache *c, int k)
{
    int fd = c->ent[k].fd, last = c->n - 1;
    unlink_slot(c, slot_of(c, c->ent[k].file));
    if (k != last) {
        uint32_t s = slot_of(c, c->ent[last].file);
        c->ent[k] = c->ent[last];
        c->slot[s] = k;
    }
    c->ent[last].file = -1;
    c->n--;
    return fd;
}

int fd_cache_remove(fd_cache *c, int64_t file)
{
    int32_t k = c->slot[slot_of(c, file)];
    return k < 0 ? -1 : drop_entry(c, k);
}

int fd_cache_evict(fd_cache *c)
{
    int k = oldest(c);
    return k < 0 ? -1 : drop_entry(c, k);
}

fd_entry *fd_cache_insert(fd_cache *c, int64_t file, int *evicted_fd)
{
    int k;
    *evicted_fd = c->n == c->cap ? fd_cache_evict(c) : -1;
    k = c->n++;
    c->ent[k].file = file;
    c->ent[k].fd = -1;
    c->ent[k].fell_back = 0;
    c->ent[k].used = ++c->clock;
    c->slot[slot_of(c, file)] = k;
    return &c->ent[k];
}

void fd_cache_clear(fd_cache *c, void (*close_fd)(int fd, void *arg), void *arg)
{
    if (!c->ent)
        return;
    for (int k = 0; k < c->n; k++) {
        if (c->ent[k].fd >= 0)
            close_fd(c->ent[k].fd, arg);
        c->ent[k].file = -1;
    }
    for (uint32_t i = 0; i <= c->hmask; i++)
        c->slot[i] = -1;
    c->n = 0;
}
