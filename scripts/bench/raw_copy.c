/*
 * raw_copy - the reference for the `stagein` benchmark: a plain C read+write copy loop, no
 * dlio-mpi code.
 *
 *   raw_copy [-j jobs] [-b bytes] [-d] LISTFILE DSTDIR
 *
 * LISTFILE has one file per line: "source-path<TAB>relative-destination".  The files are dealt
 * round-robin to `jobs` threads; each copies its files with pread/pwrite through one buffer of
 * `bytes` (default 64 MiB), creating each destination with O_EXCL (folders must exist), with -d
 * O_DIRECT on both sides (a destination's unaligned tail written after clearing O_DIRECT), then
 * calls syncfs once.  Prints one line:
 *
 *   files=N bytes=B seconds=S MiB_per_s=X
 *
 * Build: cc -O2 -pthread -o raw_copy raw_copy.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ALIGN 4096

typedef struct entry {
    char *src, *dst;
} entry;

typedef struct job {
    pthread_t tid;
    int index, jobs;
    long long bytes;
} job;

static entry *entries;
static size_t nentries;
static size_t bufsize = 64 << 20;
static int odirect;
static const char *dstdir;
static pthread_barrier_t start_line;

static void die(const char *what, const char *path)
{
    fprintf(stderr, "raw_copy: %s %s: %s\n", what, path ? path : "", strerror(errno));
    exit(1);
}

static long long copy_one(const entry *e, char *buf)
{
    int flags = odirect ? O_DIRECT : 0;
    int src = open(e->src, O_RDONLY | flags);
    if (src < 0)
        die("open", e->src);
    int dst = open(e->dst, O_WRONLY | O_CREAT | O_EXCL | flags, 0644);
    if (dst < 0)
        die("create", e->dst);
    long long off = 0;
    for (;;) {
        ssize_t r = pread(src, buf, bufsize, off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die("pread", e->src);
        }
        if (r == 0)
            break;
        if (odirect && r % ALIGN) {
            int fl = fcntl(dst, F_GETFL);
            fcntl(dst, F_SETFL, fl & ~O_DIRECT);
        }
        ssize_t put = 0;
        while (put < r) {
            ssize_t w = pwrite(dst, buf + put, (size_t)(r - put), off + put);
            if (w < 0) {
                if (errno == EINTR)
                    continue;
                die("pwrite", e->dst);
            }
            put += w;
        }
        off += r;
        if ((size_t)r < bufsize)
            break;
    }
    close(src);
    close(dst);
    return off;
}

static void *run(void *arg)
{
    job *j = arg;
    char *buf;
    if (posix_memalign((void **)&buf, ALIGN, bufsize))
        die("posix_memalign", NULL);
    memset(buf, 0, bufsize);  /* fault the buffer in before the clock */
    pthread_barrier_wait(&start_line);
    for (size_t i = (size_t)j->index; i < nentries; i += (size_t)j->jobs)
        j->bytes += copy_one(&entries[i], buf);
    int fd = open(dstdir, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || syncfs(fd) != 0)
        die("syncfs", dstdir);
    close(fd);
    free(buf);
    return NULL;
}

int main(int argc, char **argv)
{
    int jobs = 1, opt;
    while ((opt = getopt(argc, argv, "j:b:d")) != -1) {
        switch (opt) {
        case 'j': jobs = atoi(optarg); break;
        case 'b': bufsize = (size_t)atoll(optarg); break;
        case 'd': odirect = 1; break;
        default:
            fprintf(stderr, "usage: raw_copy [-j jobs] [-b bytes] [-d] LISTFILE DSTDIR\n");
            return 2;
        }
    }
    if (optind + 2 != argc || jobs < 1 || bufsize < ALIGN || bufsize % ALIGN) {
        fprintf(stderr, "usage: raw_copy [-j jobs] [-b bytes] [-d] LISTFILE DSTDIR\n");
        return 2;
    }
    dstdir = argv[optind + 1];
    FILE *list = fopen(argv[optind], "r");
    if (!list)
        die("open", argv[optind]);
    char line[8192];
    size_t cap = 0;
    while (fgets(line, sizeof line, list)) {
        line[strcspn(line, "\n")] = 0;
        char *tab = strchr(line, '\t');
        if (!tab)
            continue;
        *tab = 0;
        if (nentries == cap) {
            cap = cap ? 2 * cap : 1024;
            entries = realloc(entries, cap * sizeof *entries);
        }
        char *dst = malloc(strlen(dstdir) + strlen(tab + 1) + 2);
        sprintf(dst, "%s/%s", dstdir, tab + 1);
        entries[nentries].src = strdup(line);
        entries[nentries++].dst = dst;
    }
    fclose(list);
    job *js = calloc((size_t)jobs, sizeof *js);
    pthread_barrier_init(&start_line, NULL, (unsigned)jobs + 1);
    for (int i = 0; i < jobs; i++) {
        js[i].index = i;
        js[i].jobs = jobs;
        pthread_create(&js[i].tid, NULL, run, &js[i]);
    }
    struct timespec t0, t1;
    pthread_barrier_wait(&start_line);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long long bytes = 0;
    for (int i = 0; i < jobs; i++) {
        pthread_join(js[i].tid, NULL);
        bytes += js[i].bytes;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("files=%zu bytes=%lld seconds=%.6f MiB_per_s=%.1f\n", nentries, bytes, s,
           (double)bytes / 1048576.0 / s);
    return 0;
}
