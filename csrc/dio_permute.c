/* dio_permute.c - a seeded pseudo-random permutation of [0, n) evaluated pointwise.
 *
 * A balanced Feistel network over the smallest even-bit domain 2^(2h) >= n, with cycle walking
 * (re-encrypt until the value falls below n; the domain is < 4n, so < 4 rounds of walking on
 * average).  Every rank can compute its own slice of an epoch's shuffled order in O(slice)
 * time and memory, without anyone holding the whole order. */
#include "dio.h"

#define FEISTEL_ROUNDS 6

static inline uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL; /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t feistel(uint64_t x, uint64_t seed, int half, uint64_t mask)
{
    uint64_t left = x >> half, right = x & mask;
    for (int r = 0; r < FEISTEL_ROUNDS; r++) {
        uint64_t next = left ^ (mix64(right ^ mix64(seed + (uint64_t)r)) & mask);
        left = right;
        right = next;
    }
    return (left << half) | right;
}

int dio_permute(uint64_t n, uint64_t seed, const int64_t *in, int64_t count, int64_t *out)
{
    int half = 1;
    uint64_t mask;
    if (count < 0 || (count > 0 && (!in || !out)))
        return -22; /* -EINVAL */
    for (int64_t i = 0; i < count; i++)
        if (in[i] < 0 || (uint64_t)in[i] >= n)
            return -22;
    while (half < 32 && ((uint64_t)1 << (2 * half)) < n)
        half++;
    mask = ((uint64_t)1 << half) - 1;
    for (int64_t i = 0; i < count; i++) {
        uint64_t x = (uint64_t)in[i];
        do
            x = feistel(x, seed, half, mask);
        while (x >= n);
        out[i] = (int64_t)x;
    }
    return 0;
}
