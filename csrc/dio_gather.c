/* dio_gather.c - byte ranges of one buffer copied, in order, end to end into another: a
 * batch assembled from a copy of the dataset held in memory (reader.staging's replicated
 * batches and read_once's exchange), at memcpy's speed whatever the batch's sample count. */
#include <errno.h>
#include <string.h>

#include "dio.h"

int64_t dio_gather(void *dst, int64_t dst_len, const void *src, int64_t src_len,
                   const int64_t *at, const int64_t *length, int64_t count)
{
    int64_t put = 0;
    for (int64_t i = 0; i < count; i++) /* checked whole first: a failure copies nothing */
        if (at[i] < 0 || length[i] < 0 || at[i] > src_len - length[i]
            || length[i] > dst_len - put)
            return -EINVAL;
        else
            put += length[i];
    put = 0;
    for (int64_t i = 0; i < count; i++) {
        memcpy((char *)dst + put, (const char *)src + at[i], (size_t)length[i]);
        put += length[i];
    }
    return put;
}
