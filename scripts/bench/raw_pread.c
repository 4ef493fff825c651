/*
 * raw_pread - the reference for the `small` benchmark: a plain C pread loop, no dlio-mpi code.
 *
 *   raw_pread [-t threads] [-r repeats] [-d] [-H] LISTFILE
 *
 * LISTFILE has one request per line: "path offset length" (the path may contain spaces; the
 * last two fields are the numbers).  Every file is opened once up front (O_RDONLY, plus
 * O_DIRECT with -d).  The list is split into `threads` contiguous chunks; each thread reads its
 * chunk `repeats` times with pread into one reused buffer.  With -d each extent is widened to
 * 4096-byte boundaries and the buffer is 4096-aligned; -H makes the buffer 2 MiB-aligned with
 * MADV_HUGEPAGE (transparent huge pages: O_DIRECT pins 512x fewer pages per request).  Prints one line:
 *
 *   requests=N bytes=B seconds=S req_per_s=X MiB_per_s=Y
 *
 * Build: cc -O2 -pthread -o raw_pread raw_pread.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#define DALIGN 4096

typedef struct request {
    int fd;
    long long offset, length;
} request;

typedef struct job {
    pthread_t tid;
    const request *reqs;
    size_t n;
    int repeats;
    long long maxlen;
    long long bytes;
    int failed;
} job;

static pthread_barrier_t start_line;
static int odirect;
static int hugepages; /* -H: 2 MiB-aligned buffers with MADV_HUGEPAGE */

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* path -> fd, a small open-addressing hash table */
typedef struct fentry {
    char *path;
    int fd;
} fentry;
static fentry *ftab;
static size_t fcap, fcount;

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

static int file_fd(const char *path)
{
    size_t i;
    if (fcount * 2 >= fcap) {
        size_t ncap = fcap ? fcap * 2 : 1024;
        fentry *n = calloc(ncap, sizeof *n);
        if (!n)
            die("calloc");
        for (size_t k = 0; k < fcap; k++) {
            if (!ftab[k].path)
                continue;
            for (i = hash(ftab[k].path) & (ncap - 1); n[i].path; i = (i + 1) & (ncap - 1))
                ;
            n[i] = ftab[k];
        }
        free(ftab);
        ftab = n;
        fcap = ncap;
    }
    for (i = hash(path) & (fcap - 1); ftab[i].path; i = (i + 1) & (fcap - 1))
        if (strcmp(ftab[i].path, path) == 0)
            return ftab[i].fd;
    int fd = open(path, O_RDONLY | O_CLOEXEC | (odirect ? O_DIRECT : 0));
    if (fd < 0) {
        fprintf(stderr, "raw_pread: open %s: %s\n", path, strerror(errno));
        exit(1);
    }
    ftab[i].path = strdup(path);
    ftab[i].fd = fd;
    fcount++;
    return fd;
}

static void *reader(void *arg)
{
    job *j = arg;
    void *buf;
    size_t cap = (size_t)j->maxlen + 2 * DALIGN;
    size_t align = hugepages ? ((size_t)2 << 20) : DALIGN;
    if (hugepages)
        cap = (cap + align - 1) / align * align;
    if (posix_memalign(&buf, align, cap ? cap : DALIGN) != 0)
        die("posix_memalign");
#ifdef MADV_HUGEPAGE
    if (hugepages)
        madvise(buf, cap, MADV_HUGEPAGE);
#endif
    memset(buf, 0, cap);
    pthread_barrier_wait(&start_line);
    for (int r = 0; r < j->repeats; r++) {
        for (size_t k = 0; k < j->n; k++) {
            const request *q = &j->reqs[k];
            long long got = 0;
            while (got < q->length) {
                ssize_t n = pread(q->fd, (char *)buf + got, (size_t)(q->length - got),
                                  (off_t)(q->offset + got));
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0) {
                    perror("raw_pread: pread");
                    j->failed = 1;
                    break;
                }
                if (n == 0)
                    break;
                got += n;
            }
            j->bytes += got;
        }
    }
    free(buf);
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = 1, repeats = 1, opt;
    while ((opt = getopt(argc, argv, "t:r:dHh")) != -1) {
        switch (opt) {
        case 't': threads = atoi(optarg); break;
        case 'r': repeats = atoi(optarg); break;
        case 'd': odirect = 1; break;
        case 'H': hugepages = 1; break;
        default:
            fprintf(stderr, "usage: %s [-t threads] [-r repeats] [-d] [-H] LISTFILE\n", argv[0]);
            return 2;
        }
    }
    if (optind != argc - 1 || threads < 1 || repeats < 1) {
        fprintf(stderr, "usage: %s [-t threads] [-r repeats] [-d] [-H] LISTFILE\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[optind], "r");
    if (!f)
        die(argv[optind]);
    request *reqs = NULL;
    size_t n = 0, cap = 0;
    char *line = NULL;
    size_t linecap = 0;
    ssize_t len;
    while ((len = getline(&line, &linecap, f)) > 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            line[--len] = '\0';
        if (len == 0)
            continue;
        char *sp2 = strrchr(line, ' ');
        if (!sp2)
            goto bad;
        *sp2 = '\0';
        char *sp1 = strrchr(line, ' ');
        if (!sp1)
            goto bad;
        *sp1 = '\0';
        long long off = atoll(sp1 + 1), ln = atoll(sp2 + 1);
        if (off < 0 || ln < 0)
            goto bad;
        if (odirect && ln > 0) {
            long long lo = off / DALIGN * DALIGN;
            ln = (off + ln + DALIGN - 1) / DALIGN * DALIGN - lo;
            off = lo;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 4096;
            reqs = realloc(reqs, cap * sizeof *reqs);
            if (!reqs)
                die("realloc");
        }
        reqs[n].fd = file_fd(line);
        reqs[n].offset = off;
        reqs[n].length = ln;
        n++;
        continue;
    bad:
        fprintf(stderr, "raw_pread: bad line %zu in %s (want: path offset length)\n", n + 1,
                argv[optind]);
        return 2;
    }
    fclose(f);
    free(line);

    job *jobs = calloc((size_t)threads, sizeof *jobs);
    if (!jobs)
        die("calloc");
    pthread_barrier_init(&start_line, NULL, (unsigned)threads + 1);
    size_t per = n / (size_t)threads, extra = n % (size_t)threads, at = 0;
    for (int t = 0; t < threads; t++) {
        job *j = &jobs[t];
        j->reqs = reqs + at;
        j->n = per + ((size_t)t < extra ? 1 : 0);
        j->repeats = repeats;
        for (size_t k = 0; k < j->n; k++)
            if (j->reqs[k].length > j->maxlen)
                j->maxlen = j->reqs[k].length;
        at += j->n;
        if (pthread_create(&j->tid, NULL, reader, j) != 0)
            die("pthread_create");
    }
    struct timespec t0, t1;
    pthread_barrier_wait(&start_line);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long long bytes = 0;
    int failed = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(jobs[t].tid, NULL);
        bytes += jobs[t].bytes;
        failed |= jobs[t].failed;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    double total = (double)n * repeats;
    printf("requests=%.0f bytes=%lld seconds=%.6f req_per_s=%.1f MiB_per_s=%.1f\n", total, bytes,
           secs, secs > 0 ? total / secs : 0.0, secs > 0 ? (double)bytes / secs / 1048576.0 : 0.0);
    return failed ? 1 : 0;
}
