/*
 * Fuzz target: the data-plane frame header decoder. Byte 0 picks the payload limit; the rest
 * is decoded as a stream of frames. An accepted header must re-encode to the same 48 bytes,
 * respect the limits it was given and never claim a range that wraps; a rejected one must say
 * why with a known code.
 */
#include "moongate/dataframe.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t max;
    if (size < 1)
        return 0;
    max = 1u << (data[0] % 25);
    data++;
    size--;
    while (size > 0) {
        mg_df_header h;
        uint8_t again[MG_DF_HEADER_BYTES];
        uint32_t payload;
        int rc = mg_df_decode(data, size, max, &h);
        if (rc == MG_DF_NEED_MORE)
            break;
        if (rc != MG_DF_OK) {
            if (rc < MG_DF_BAD_RANGE || strcmp(mg_df_strerror(rc), "unknown frame error") == 0)
                abort();
            break;
        }
        mg_df_encode(&h, again);
        if (memcmp(again, data, MG_DF_HEADER_BYTES) != 0)
            abort();
        payload = mg_df_payload_bytes(&h);
        if (payload > max && payload > 1024 && payload != MG_DF_TOKEN_BYTES)
            abort();
        if (h.offset > UINT64_MAX - h.length)
            abort();
        if (MG_DF_HEADER_BYTES + (size_t)payload > size)
            break;
        (void)mg_crc32c(0, data + MG_DF_HEADER_BYTES, payload);
        data += MG_DF_HEADER_BYTES + payload;
        size -= MG_DF_HEADER_BYTES + payload;
    }
    return 0;
}
