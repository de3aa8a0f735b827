/*
 * libtransfer_engine's header against Mooncake's, type by type: one translation unit includes
 * Mooncake's header (tests/te/mooncake/transfer_engine_c.h) with every name it declares moved
 * aside (mc_...), then ours (client/te/transfer_engine_c.h, or the installed one), and compares
 * them at build time:
 *   - every macro Mooncake defines is one of ours with the same value (types: the same type);
 *   - every struct: the same size and alignment, every one of Mooncake's fields at the same
 *     offset with the same type (an incomplete struct of ours does not compile);
 *   - every function whose prototype names no struct: the same function type (its return type
 *     included).
 * The functions that take or return Mooncake's structs are compared as the compiler prints
 * their prototypes (gcc -aux-info) by tests/integration/test_mooncake_c.py, with the list of
 * functions itself. Run as a test, it prints what it checked.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- Mooncake's header, its names moved aside ---- */
#define transfer_request           mc_transfer_request
#define transfer_request_t         mc_transfer_request_t
#define notify_msg                 mc_notify_msg
#define notify_msg_t               mc_notify_msg_t
#define transfer_status            mc_transfer_status
#define transfer_status_t          mc_transfer_status_t
#define segment_desc               mc_segment_desc
#define segment_desc_t             mc_segment_desc_t
#define buffer_entry               mc_buffer_entry
#define buffer_entry_t             mc_buffer_entry_t
#define nic_load_stat              mc_nic_load_stat
#define nic_load_stat_t            mc_nic_load_stat_t
#define transfer_engine_t          mc_transfer_engine_t
#define transport_t                mc_transport_t
#define createTransferEngine       mc_createTransferEngine
#define destroyTransferEngine      mc_destroyTransferEngine
#define discoverTopology           mc_discoverTopology
#define getLocalIpAndPort          mc_getLocalIpAndPort
#define installTransport           mc_installTransport
#define uninstallTransport         mc_uninstallTransport
#define openSegment                mc_openSegment
#define openSegmentNoCache         mc_openSegmentNoCache
#define closeSegment               mc_closeSegment
#define warmupEfaSegment           mc_warmupEfaSegment
#define removeLocalSegment         mc_removeLocalSegment
#define registerLocalMemory        mc_registerLocalMemory
#define unregisterLocalMemory      mc_unregisterLocalMemory
#define registerLocalMemoryBatch   mc_registerLocalMemoryBatch
#define unregisterLocalMemoryBatch mc_unregisterLocalMemoryBatch
#define allocateBatchID            mc_allocateBatchID
#define submitTransfer             mc_submitTransfer
#define submitTransferWithNotify   mc_submitTransferWithNotify
#define getNotifsFromEngine        mc_getNotifsFromEngine
#define freeNotifsMsgBuf           mc_freeNotifsMsgBuf
#define genNotifyInEngine          mc_genNotifyInEngine
#define getTransferStatus          mc_getTransferStatus
#define freeBatchID                mc_freeBatchID
#define syncSegmentCache           mc_syncSegmentCache
#define getNicLoadStats            mc_getNicLoadStats
#define enableGracefulShutdown     mc_enableGracefulShutdown
#define showLinks                  mc_showLinks
#include "mooncake/transfer_engine_c.h"
#undef transfer_request
#undef transfer_request_t
#undef notify_msg
#undef notify_msg_t
#undef transfer_status
#undef transfer_status_t
#undef segment_desc
#undef segment_desc_t
#undef buffer_entry
#undef buffer_entry_t
#undef nic_load_stat
#undef nic_load_stat_t
#undef transfer_engine_t
#undef transport_t
#undef createTransferEngine
#undef destroyTransferEngine
#undef discoverTopology
#undef getLocalIpAndPort
#undef installTransport
#undef uninstallTransport
#undef openSegment
#undef openSegmentNoCache
#undef closeSegment
#undef warmupEfaSegment
#undef removeLocalSegment
#undef registerLocalMemory
#undef unregisterLocalMemory
#undef registerLocalMemoryBatch
#undef unregisterLocalMemoryBatch
#undef allocateBatchID
#undef submitTransfer
#undef submitTransferWithNotify
#undef getNotifsFromEngine
#undef freeNotifsMsgBuf
#undef genNotifyInEngine
#undef getTransferStatus
#undef freeBatchID
#undef syncSegmentCache
#undef getNicLoadStats
#undef enableGracefulShutdown
#undef showLinks

/* Mooncake's macros, kept by value, then undefined: ours must define each of them */
typedef segment_handle_t mc_segment_handle_m;
typedef segment_id_t mc_segment_id_m;
typedef batch_id_t mc_batch_id_m;
static const uint64_t mc_values[] = {LOCAL_SEGMENT,  INVALID_BATCH,   OPCODE_READ,
                                     OPCODE_WRITE,   STATUS_WAITING,  STATUS_PENDING,
                                     STATUS_INVALID, STATUS_CANCELED, STATUS_COMPLETED,
                                     STATUS_TIMEOUT, STATUS_FAILED};
#undef segment_handle_t
#undef segment_id_t
#undef batch_id_t
#undef LOCAL_SEGMENT
#undef INVALID_BATCH
#undef OPCODE_READ
#undef OPCODE_WRITE
#undef STATUS_WAITING
#undef STATUS_PENDING
#undef STATUS_INVALID
#undef STATUS_CANCELED
#undef STATUS_COMPLETED
#undef STATUS_TIMEOUT
#undef STATUS_FAILED
#undef TRANSFER_ENGINE_C

/* ---- ours ---- */
#include "transfer_engine_c.h"

#define SAME_TYPE(a, b) __builtin_types_compatible_p(__typeof__(a), __typeof__(b))

/* constants */
#if !defined(segment_handle_t) || !defined(segment_id_t) || !defined(batch_id_t)
#error "segment_handle_t, segment_id_t and batch_id_t are macros in Mooncake's header"
#endif
_Static_assert(SAME_TYPE(mc_segment_handle_m, segment_handle_t), "segment_handle_t");
_Static_assert(SAME_TYPE(mc_segment_id_m, segment_id_t), "segment_id_t");
_Static_assert(SAME_TYPE(mc_batch_id_m, batch_id_t), "batch_id_t");
static const uint64_t our_values[] = {LOCAL_SEGMENT,  INVALID_BATCH,   OPCODE_READ,
                                      OPCODE_WRITE,   STATUS_WAITING,  STATUS_PENDING,
                                      STATUS_INVALID, STATUS_CANCELED, STATUS_COMPLETED,
                                      STATUS_TIMEOUT, STATUS_FAILED};
static const char *const value_names[] = {"LOCAL_SEGMENT",  "INVALID_BATCH",   "OPCODE_READ",
                                          "OPCODE_WRITE",   "STATUS_WAITING",  "STATUS_PENDING",
                                          "STATUS_INVALID", "STATUS_CANCELED", "STATUS_COMPLETED",
                                          "STATUS_TIMEOUT", "STATUS_FAILED"};

/* types: the typedefs name the same types as Mooncake's (structs by layout, below) */
_Static_assert(SAME_TYPE(mc_transfer_engine_t, transfer_engine_t), "transfer_engine_t");
_Static_assert(SAME_TYPE(mc_transport_t, transport_t), "transport_t");

/* structs: size, alignment, and each of Mooncake's fields at its offset with its type */
#define SAME_STRUCT(tag, td)                                                               \
    _Static_assert(sizeof(struct mc_##tag) == sizeof(struct tag), #tag ": size");          \
    _Static_assert(_Alignof(struct mc_##tag) == _Alignof(struct tag), #tag ": alignment"); \
    _Static_assert(SAME_TYPE(struct tag, td), #td " names struct " #tag);                  \
    _Static_assert(SAME_TYPE(struct mc_##tag, mc_##td), "Mooncake's " #td " names struct " #tag)
#define SAME_FIELD(tag, f)                                                                      \
    _Static_assert(offsetof(struct mc_##tag, f) == offsetof(struct tag, f),                     \
                   #tag "." #f ": offset");                                                     \
    _Static_assert(SAME_TYPE(((struct mc_##tag *)0)->f, ((struct tag *)0)->f), #tag "." #f ": " \
                                                                                    "type")

SAME_STRUCT(transfer_request, transfer_request_t);
SAME_FIELD(transfer_request, opcode);
SAME_FIELD(transfer_request, source);
SAME_FIELD(transfer_request, target_id);
SAME_FIELD(transfer_request, target_offset);
SAME_FIELD(transfer_request, length);
SAME_STRUCT(notify_msg, notify_msg_t);
SAME_FIELD(notify_msg, name);
SAME_FIELD(notify_msg, msg);
SAME_STRUCT(transfer_status, transfer_status_t);
SAME_FIELD(transfer_status, status);
SAME_FIELD(transfer_status, transferred_bytes);
SAME_STRUCT(segment_desc, segment_desc_t);
SAME_FIELD(segment_desc, type);
_Static_assert(offsetof(struct mc_segment_desc, desc_) == offsetof(struct segment_desc, desc_),
               "segment_desc.desc_: offset"); /* an unnamed union: its members below */
SAME_FIELD(segment_desc, desc_.rdma.addr);
SAME_FIELD(segment_desc, desc_.rdma.size);
SAME_FIELD(segment_desc, desc_.rdma.location);
SAME_FIELD(segment_desc, desc_.nvmeof.file_path);
SAME_FIELD(segment_desc, desc_.nvmeof.subsystem_name);
SAME_FIELD(segment_desc, desc_.nvmeof.proto);
SAME_FIELD(segment_desc, desc_.nvmeof.ip);
SAME_FIELD(segment_desc, desc_.nvmeof.port);
SAME_STRUCT(buffer_entry, buffer_entry_t);
SAME_FIELD(buffer_entry, addr);
SAME_FIELD(buffer_entry, length);
SAME_STRUCT(nic_load_stat, nic_load_stat_t);
SAME_FIELD(nic_load_stat, device_name);
SAME_FIELD(nic_load_stat, inflight_bytes);
SAME_FIELD(nic_load_stat, ewma_bandwidth_bps);

/* functions that name no struct: the same type */
#define SAME_FN(f) _Static_assert(SAME_TYPE(mc_##f, f), #f ": not Mooncake's prototype")
SAME_FN(createTransferEngine);
SAME_FN(destroyTransferEngine);
SAME_FN(discoverTopology);
SAME_FN(getLocalIpAndPort);
SAME_FN(installTransport);
SAME_FN(uninstallTransport);
SAME_FN(openSegment);
SAME_FN(openSegmentNoCache);
SAME_FN(closeSegment);
SAME_FN(warmupEfaSegment);
SAME_FN(removeLocalSegment);
SAME_FN(registerLocalMemory);
SAME_FN(unregisterLocalMemory);
SAME_FN(unregisterLocalMemoryBatch);
SAME_FN(allocateBatchID);
SAME_FN(freeBatchID);
SAME_FN(syncSegmentCache);
SAME_FN(enableGracefulShutdown);
SAME_FN(showLinks);

int main(void)
{
    int bad = 0;
    for (size_t i = 0; i < sizeof(mc_values) / sizeof(mc_values[0]); i++)
        if (mc_values[i] != our_values[i]) {
            printf("%s: Mooncake's is %llu, ours %llu\n", value_names[i],
                   (unsigned long long)mc_values[i], (unsigned long long)our_values[i]);
            bad = 1;
        }
    if (!bad)
        printf("transfer_engine_c.h: constants, types, struct layouts and struct-free "
               "prototypes as Mooncake's\n");
    return bad;
}
