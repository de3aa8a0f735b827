/*
 * Fuzz target: the offset allocator, driven by operation sequences and checked at every step
 * against the reference model (tests/common/alloc_model.h), which abort()s on any broken rule.
 * Input: byte 0 picks the region (size, granule, allocation limit); then 4-byte operations:
 * op % 3 == 0 gives back a live range, else takes a size (2 bytes, scaled by the third byte's
 * low bits) with an alignment from its high bits.
 */
#include "../common/alloc_model.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    alloc_model m;
    uint64_t granule, capacity;
    uint32_t max;
    if (size < 1)
        return 0;
    granule = data[0] & 1 ? 64 : 4096;
    capacity = granule * (1 + ((data[0] >> 1) & 15) * 64); /* 1 .. 961 granules */
    max = 1 + (uint32_t)(data[0] >> 5) * 16;
    if (model_open(&m, capacity, granule, max) != 0)
        abort();
    for (size_t i = 1; i + 4 <= size; i += 4) {
        const uint8_t *op = data + i;
        if (op[0] % 3 == 0) {
            if (m.live)
                model_give(&m, op[1] % m.live);
        } else {
            uint64_t want = ((uint64_t)op[1] << 8 | op[2]) << (op[3] & 7);
            uint64_t align = op[3] >> 6 ? granule << (op[3] >> 6) * 2 : 0;
            model_take(&m, want, align);
        }
    }
    model_close(&m);
    return 0;
}
