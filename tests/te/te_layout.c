/*
 * libtransfer_engine's header against the layouts Mooncake documents (x86-64 and aarch64 LP64):
 * a build-time check, run as a test that prints what it checked.
 */
#include "transfer_engine_c.h"

#include <stddef.h>
#include <stdio.h>

_Static_assert(sizeof(transfer_request_t) == 40, "transfer_request");
_Static_assert(offsetof(transfer_request_t, opcode) == 0, "opcode");
_Static_assert(offsetof(transfer_request_t, source) == 8, "source");
_Static_assert(offsetof(transfer_request_t, target_id) == 16, "target_id");
_Static_assert(offsetof(transfer_request_t, target_offset) == 24, "target_offset");
_Static_assert(offsetof(transfer_request_t, length) == 32, "length");
_Static_assert(sizeof(transfer_status_t) == 16, "transfer_status");
_Static_assert(offsetof(transfer_status_t, transferred_bytes) == 8, "transferred_bytes");
_Static_assert(sizeof(notify_msg_t) == 16 && offsetof(notify_msg_t, msg) == 8, "notify_msg");
_Static_assert(sizeof(buffer_entry_t) == 16 && offsetof(buffer_entry_t, length) == 8,
               "buffer_entry");
_Static_assert(sizeof(segment_desc_t) == 48 && offsetof(segment_desc_t, desc_) == 8,
               "segment_desc");
_Static_assert(sizeof(nic_load_stat_t) == 80 && offsetof(nic_load_stat_t, inflight_bytes) == 64 &&
                   offsetof(nic_load_stat_t, ewma_bandwidth_bps) == 72,
               "nic_load_stat");
_Static_assert(STATUS_WAITING == 0 && STATUS_PENDING == 1 && STATUS_INVALID == 2 &&
                   STATUS_CANCELED == 3 && STATUS_COMPLETED == 4 && STATUS_TIMEOUT == 5 &&
                   STATUS_FAILED == 6,
               "status values");
_Static_assert(OPCODE_READ == 0 && OPCODE_WRITE == 1 && LOCAL_SEGMENT == 0, "constants");
_Static_assert(sizeof(segment_id_t) == 4 && sizeof(batch_id_t) == 8, "ids");

int main(void)
{
    printf("transfer_engine_c.h: layouts and constants as Mooncake's\n");
    return 0;
}
