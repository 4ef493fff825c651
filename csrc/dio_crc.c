/*
 * dio_crc.c - CRC-32 (zlib/zip polynomial 0xEDB88320, reflected) and CRC-32C (Castagnoli,
 * 0x82F63B78, reflected), both with zlib's chaining convention: crc(crc(0, a), b) == crc(0, ab).
 * Portable slice-by-8 tables; CRC-32C uses the SSE4.2 crc32 instruction when the CPU has it.
 */
#include <pthread.h>
#include <string.h>

#include "dio.h"

static uint32_t crc32_tab[8][256];
static uint32_t crc32c_tab[8][256];
static int have_sse42;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void make_tables(uint32_t tab[8][256], uint32_t poly)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ poly : c >> 1;
        tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++)
            tab[k][i] = (tab[k - 1][i] >> 8) ^ tab[0][tab[k - 1][i] & 0xff];
}

static void crc_init(void)
{
    make_tables(crc32_tab, 0xEDB88320u);
    make_tables(crc32c_tab, 0x82F63B78u);
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}

/* Slice-by-8 over a reflected table set; crc is the raw (already inverted) register. */
static uint32_t crc_slice8(uint32_t tab[8][256], uint32_t crc, const unsigned char *p, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n && ((uintptr_t)p & 7)) {
        crc = tab[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = tab[7][w & 0xff] ^ tab[6][(w >> 8) & 0xff] ^ tab[5][(w >> 16) & 0xff] ^
              tab[4][(w >> 24) & 0xff] ^ tab[3][(w >> 32) & 0xff] ^ tab[2][(w >> 40) & 0xff] ^
              tab[1][(w >> 48) & 0xff] ^ tab[0][w >> 56];
        p += 8;
        n -= 8;
    }
#endif
    while (n--)
        crc = tab[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

uint32_t dio_crc32(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&crc_once, crc_init);
    return ~crc_slice8(crc32_tab, ~crc, (const unsigned char *)buf, n);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2")))
static uint32_t crc32c_sse42(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi((unsigned int)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = __builtin_ia32_crc32qi((unsigned int)c, *p++);
    return (uint32_t)c;
}
#endif

uint32_t dio_crc32c(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&crc_once, crc_init);
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_sse42)
        return ~crc32c_sse42(~crc, (const unsigned char *)buf, n);
#endif
    return ~crc_slice8(crc32c_tab, ~crc, (const unsigned char *)buf, n);
}
