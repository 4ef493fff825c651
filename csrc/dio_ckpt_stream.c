/*
 * dio_ckpt_stream.c - the bytes of checkpoints: a fresh pseudo-random stream per (seed) that
 * no storage can shortcut (no two 4 KiB granules equal, nothing compresses), or, asked for,
 * bytes that compress and deduplicate at given ratios (checkpoint.content).
 *
 * The stream of a seed is made of granules of DIO_GRANULE (4096) bytes. Granule g is 512
 * 64-bit words, little-endian: word 8 * i + j is step i of lane j, for 8 xoshiro256** lanes
 * whose states are 32 consecutive splitmix64 outputs from a base that is a bijective mix of
 * (seed, g). So any granule is made without the ones before it (a restore checks the first
 * words of every granule it reads, ranks of a shared file make their own parts), the 8 lanes
 * run as one vector (AVX-512 / AVX2 where the CPU has them, chosen at load time), and two
 * granules are equal only where the content asks for it.
 *
 * With a content {random_bytes, unique}: granule g holds the first random_bytes bytes of
 * granule (g % unique) of the stream (g itself when unique is 0) followed by zeros: a
 * compressor keeps about random_bytes of every 4096 (R = 4096 / random_bytes), and granules
 * `unique` apart are equal (D = granules / unique), far apart so that a compressor's window
 * does not see them as a repeat.
 */
#define _GNU_SOURCE
#include <string.h>

#include "dio_internal.h"

#define LANES 8
#define WORDS (DIO_GRANULE / 8)
#define STEPS (WORDS / LANES)
#define GAMMA 0x9E3779B97F4A7C15ull

typedef uint64_t lanes __attribute__((vector_size(LANES * 8)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define DIO_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DIO_CLONES
#endif

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Vector helpers as macros: a function taking vectors has an ABI that depends on the
 * target, and each clone of granule_words must inline them for its own. */
#define ROTL_LANES(x, k) (((x) << (k)) | ((x) >> (64 - (k))))
#define MIX_LANES(z)                                                                      \
    do {                                                                                  \
        (z) = ((z) ^ ((z) >> 30)) * 0xBF58476D1CE4E5B9ull;                                \
        (z) = ((z) ^ ((z) >> 27)) * 0x94D049BB133111EBull;                                \
        (z) = (z) ^ ((z) >> 31);                                                          \
    } while (0)
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define LE_LANES(v)                                                                       \
    do {                                                                                  \
        for (int j_ = 0; j_ < LANES; j_++)                                                \
            (v)[j_] = __builtin_bswap64((v)[j_]);                                         \
    } while (0)
#else
#define LE_LANES(v) ((void)0)
#endif

/* The first `steps` steps (8 words each) of granule g of the stream keyed `key`, into out. */
DIO_CLONES static void granule_words(unsigned char *out, uint64_t key, uint64_t g, int steps)
{
    const lanes step = {1, 2, 3, 4, 5, 6, 7, 8};
    uint64_t base = mix64(key + g * GAMMA);
    lanes s[4];
    for (int i = 0; i < 4; i++) { /* lane j, word i: splitmix64 output 4 * j + i + 1 of base */
        s[i] = base + (step * 4 + (i - 3)) * GAMMA;
        MIX_LANES(s[i]);
    }
    lanes s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3];
    for (int i = 0; i < steps; i++) {
        lanes m = s1 + (s1 << 2); /* s1 * 5 */
        lanes r = ROTL_LANES(m, 7);
        lanes t = s1 << 17, word = r + (r << 3); /* * 9 */
        LE_LANES(word);
        memcpy(out + (size_t)i * LANES * 8, &word, sizeof word);
        s2 ^= s0;
        s3 ^= s1;
        s1 ^= s2;
        s0 ^= s3;
        s2 ^= t;
        s3 = ROTL_LANES(s3, 45);
    }
}

static inline uint64_t stream_key(uint64_t seed) { return mix64(seed ^ 0x6A09E667F3BCC909ull); }

/* The granule the content puts at g, and how many of its bytes are random (the rest zero). */
static inline uint64_t source_granule(const dio_content *c, uint64_t g)
{
    return c && c->unique ? g % c->unique : g;
}

static inline size_t random_bytes(const dio_content *c)
{
    return c && c->random_bytes && c->random_bytes < DIO_GRANULE ? c->random_bytes
                                                                  : DIO_GRANULE;
}

/* Bytes [from, from + n) of granule g (from + n <= DIO_GRANULE) into out. */
static void granule_part(unsigned char *out, uint64_t key, uint64_t g, size_t from, size_t n,
                         const dio_content *c)
{
    size_t keep = random_bytes(c), end = from + n;
    size_t made = end < keep ? end : keep; /* granule bytes to generate */
    if (from == 0 && made == DIO_GRANULE) {
        granule_words(out, key, source_granule(c, g), STEPS);
        return;
    }
    unsigned char whole[DIO_GRANULE] __attribute__((aligned(64)));
    if (made > from)
        granule_words(whole, key, source_granule(c, g), (int)((made + 63) / 64));
    if (made < end)
        memset(whole + (made > from ? made : from), 0, end - (made > from ? made : from));
    memcpy(out, whole + from, n);
}

void dio_ckpt_fill(void *buf, size_t n, uint64_t seed, uint64_t start, const dio_content *c)
{
    unsigned char *p = buf;
    uint64_t key = stream_key(seed);
    while (n > 0) {
        uint64_t g = start / DIO_GRANULE;
        size_t from = (size_t)(start % DIO_GRANULE);
        size_t k = DIO_GRANULE - from < n ? DIO_GRANULE - from : n;
        granule_part(p, key, g, from, k, c);
        p += k;
        n -= k;
        start += k;
    }
}

int64_t dio_ckpt_check(const void *buf, size_t n, uint64_t seed, uint64_t start,
                       const dio_content *c, uint64_t whole_every, int64_t *compared)
{
    const unsigned char *p = buf;
    unsigned char expected[DIO_GRANULE] __attribute__((aligned(64)));
    uint64_t key = stream_key(seed), at = start;
    while (n > 0) {
        uint64_t g = at / DIO_GRANULE;
        size_t from = (size_t)(at % DIO_GRANULE);
        size_t k = DIO_GRANULE - from < n ? DIO_GRANULE - from : n;
        int whole = whole_every && g % whole_every == 0;
        size_t look = whole ? k : (k < DIO_CHECK_HEAD ? k : DIO_CHECK_HEAD);
        granule_part(expected, key, g, from, look, c);
        if (memcmp(p, expected, look) != 0)
            return (int64_t)(at - start);
        if (compared)
            *compared += (int64_t)look;
        p += k;
        n -= k;
        at += k;
    }
    return -1;
}
