/*
 * Fuzz target: a submission ring's entries as the ring thread takes them (mg_ring_sqe_copy).
 * Byte 0 picks the ring's size (8..4096 slots, a power of two), byte 1 how many slots are
 * published; the rest is the submission queue, wrapping as the ring does. Each entry taken must
 * take 1..published slots, a refused one exactly one with a reason; one taken must be of a
 * known op and kind, with its pairs (an MG_RING_PAIRS entry) or note (MG_RING_NOTIFY) copied
 * out whole.
 */
#include "moongate/ring.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t entries, avail, head = 0;
    uint8_t *sq;
    if (size < 2)
        return 0;
    entries = 8u << (data[0] % 10);
    avail = 1 + data[1] % entries;
    data += 2;
    size -= 2;
    if ((sq = calloc(entries, MG_RING_SQE_SIZE)) == NULL)
        return 0;
    memcpy(sq, data,
           size < (size_t)entries * MG_RING_SQE_SIZE ? size : (size_t)entries * MG_RING_SQE_SIZE);
    head = size ? data[0] * 7u : 0; /* any starting counter: slots wrap */
    while (avail > 0) {
        mg_ring_sub s;
        uint32_t took;
        memset(&s, 0, sizeof(s));
        took = mg_ring_sqe_copy(sq, entries, head, avail, &s);
        if (took == 0 || took > avail)
            abort();
        if (s.bad[0]) {
            if (took != 1 || s.local || s.remote || s.note ||
                memchr(s.bad, 0, sizeof(s.bad)) == NULL)
                abort();
        } else {
            if (s.e.op > MG_RING_WRITE ||
                (s.e.kind != MG_RING_PAIRS && s.e.kind != MG_RING_STRIDED) || s.e.count == 0)
                abort();
            if (s.e.kind == MG_RING_PAIRS) { /* every pair is there (ASan checks) */
                uint32_t sum = 0;
                for (uint32_t k = 0; k < s.e.count; k++)
                    sum += s.local[k] ^ s.remote[k];
                if (sum == 0x5a5a5a5a && s.e.count == 0) /* never: keeps the reads */
                    abort();
            }
            if ((s.e.flags & MG_RING_NOTIFY) && (s.note == NULL || s.e.note_len < 2))
                abort();
            if (s.note)
                (void)((volatile char *)s.note)[s.e.note_len - 1];
        }
        free(s.local);
        free(s.remote);
        free(s.note);
        head += took;
        avail -= took;
    }
    free(sq);
    return 0;
}
