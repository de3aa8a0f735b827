/*
 * transfer_engine_c.h: Mooncake Transfer Engine's C API, served by moongate
 * (libtransfer_engine.so). The declarations, types, constants and struct layouts are those of
 * Mooncake's header at commit 3b5a594, so that code built against Mooncake's header (TensorRT-LLM's
 * transfer agent, NIXL's Mooncake plugin) loads this library unchanged. docs/migrating.md says
 * what each function does on moongate and what differs.
 *
 * An engine is an agent of this process on the node's moongate daemon, reached at
 * unix:$MOONGATE_SOCKET (default /run/moongate/moongate.sock) with the bearer token of
 * $MOONGATE_TOKEN or of the file $MOONGATE_TOKEN_FILE. Its name for peers is "host:port"
 * (getLocalIpAndPort): what a peer passes to openSegment. Every function may be called from any
 * thread. Strings passed in are not kept after the call returns.
 *
 * Two conventions, as Mooncake's: functions returning a count or an id answer a negative ERR_*
 * value on failure (-1 bad argument, -3 address not registered, -7 overlapping registration);
 * submitTransfer, getTransferStatus and freeBatchID answer a positive status code (1 bad
 * argument, 2 more tasks than the batch holds, 3 address not registered, 4 batch busy).
 */
#ifndef TRANSFER_ENGINE_C
#define TRANSFER_ENGINE_C

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define segment_handle_t int32_t
#define segment_id_t     int32_t
#define batch_id_t       uint64_t
#define LOCAL_SEGMENT    (0)
#define INVALID_BATCH    UINT64_MAX

#define OPCODE_READ  (0)
#define OPCODE_WRITE (1)

/* One task: `length` bytes between `source` in this process and `target_offset` (an address in
 * the target's process) of segment `target_id` (openSegment; LOCAL_SEGMENT: this engine). */
struct transfer_request {
    int opcode;
    void *source;
    segment_id_t target_id;
    uint64_t target_offset;
    uint64_t length;
};
typedef struct transfer_request transfer_request_t;

struct notify_msg {
    char *name;
    char *msg;
};
typedef struct notify_msg notify_msg_t;

#define STATUS_WAITING   (0)
#define STATUS_PENDING   (1)
#define STATUS_INVALID   (2)
#define STATUS_CANCELED  (3)
#define STATUS_COMPLETED (4)
#define STATUS_TIMEOUT   (5)
#define STATUS_FAILED    (6)

struct transfer_status {
    int status;
    uint64_t transferred_bytes;
};
typedef struct transfer_status transfer_status_t;

struct segment_desc {
    int type;
    union {
        struct {
            void *addr;
            uint64_t size;
            const char *location;
        } rdma;
        struct {
            const char *file_path;
            const char *subsystem_name;
            const char *proto;
            const char *ip;
            uint64_t port;
        } nvmeof;
    } desc_;
};
typedef struct segment_desc segment_desc_t;

struct buffer_entry {
    void *addr;
    size_t length;
};
typedef struct buffer_entry buffer_entry_t;

/* A NIC's load (getNicLoadStats): 80 bytes. moongate's daemon owns the devices: never filled
 * here. */
struct nic_load_stat {
    char device_name[64];
    uint64_t inflight_bytes;
    double ewma_bandwidth_bps;
};
typedef struct nic_load_stat nic_load_stat_t;

typedef void *transfer_engine_t;
typedef void *transport_t;

transfer_engine_t createTransferEngine(const char *metadata_conn_string,
                                       const char *local_server_name, const char *ip_or_host_name,
                                       uint64_t rpc_port, int auto_discover);
void destroyTransferEngine(transfer_engine_t engine);
int discoverTopology(transfer_engine_t engine);
int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len);

transport_t installTransport(transfer_engine_t engine, const char *proto, void **args);
int uninstallTransport(transfer_engine_t engine, const char *proto);

segment_id_t openSegment(transfer_engine_t engine, const char *segment_name);
segment_id_t openSegmentNoCache(transfer_engine_t engine, const char *segment_name);
int closeSegment(transfer_engine_t engine, segment_id_t segment_id);
int removeLocalSegment(transfer_engine_t engine, const char *segment_name);
int syncSegmentCache(transfer_engine_t engine);

int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length, const char *location,
                        int remote_accessible);
int unregisterLocalMemory(transfer_engine_t engine, void *addr);
int registerLocalMemoryBatch(transfer_engine_t engine, buffer_entry_t *buffer_list,
                             size_t buffer_len, const char *location);
int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list, size_t addr_len);

batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size);
int submitTransfer(transfer_engine_t engine, batch_id_t batch_id, struct transfer_request *entries,
                   size_t count);
int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id,
                             struct transfer_request *entries, size_t count,
                             notify_msg_t notify_msg);
int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id, size_t task_id,
                      struct transfer_status *status);
int freeBatchID(transfer_engine_t engine, batch_id_t batch_id);

notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size);
int freeNotifsMsgBuf(notify_msg_t *msg, int size);
int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id, notify_msg_t notify_msg);

int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats, size_t *count);
void enableGracefulShutdown(transfer_engine_t engine);
int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len, int json);
int warmupEfaSegment(transfer_engine_t engine, const char *segment_name);

#ifdef __cplusplus
}
#endif

#endif
