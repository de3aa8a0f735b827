/*
 * mg_client: a gRPC client over HTTP/2, in C. TLS with ALPN h2 (and client certificates), h2c
 * with prior knowledge over TCP, or h2c over a Unix-domain socket. Unary and streaming calls,
 * deadlines (sent as grpc-timeout and enforced locally), metadata and cancellation. The framing
 * is the server's (mg_grpc.h).
 *
 * Threads: a client and its calls belong to the libevent base given to mg_client_new() and are
 * used only from that base's thread. Callbacks run on it. Name resolution uses getaddrinfo();
 * give numeric addresses where the loop must never wait. Writes to a connection the server
 * closed raise SIGPIPE: programs using the library ignore it (signal(SIGPIPE, SIG_IGN)).
 *
 * Lifecycle: mg_rpc_start() returns a call; its on_close callback runs exactly once, with the
 * final status, after which the library frees the call. mg_client_del() closes the connection;
 * calls still open end with CANCELLED. The connection's last resources are released by the
 * base's deferred callbacks: run the base once more (EVLOOP_NONBLOCK) before freeing it.
 */
#ifndef MG_CLIENT_H
#define MG_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "mg_grpc.h"

struct event_base;

typedef struct mg_client mg_client;
typedef struct mg_rpc mg_rpc;

typedef struct mg_client_options {
    const char *target;          /* "host:port", "[v6]:port" or "unix:/path" */
    int tls;                     /* 1: TLS + ALPN h2; 0: h2c prior knowledge */
    const char *ca_file;         /* CA to verify the server with; NULL: the system store */
    const char *cert_file;       /* client certificate for mTLS, or NULL */
    const char *key_file;        /* its key */
    const char *server_name;     /* SNI and name checked in the certificate; default: host */
    int insecure;                /* TLS without verifying the server (development only) */
    uint32_t connect_timeout_ms; /* 0: 10 s */
    uint32_t max_message_bytes;  /* largest response message accepted; 0: 4 MiB */
    const char *token;           /* bearer token sent with every call, or NULL (at most 1024) */
    /* mg_client_call() on h2c or a Unix socket: after sending, poll the socket without sleeping
     * for up to this long before waiting in the loop. It saves the wake-up of a sleeping thread
     * on each call (tens of microseconds on virtual machines) at the cost of a busy core while
     * waiting; meant for callers on a hot path with short calls (lease acquire and release). 0:
     * never (the default). */
    uint32_t busy_poll_us;
    /* Called once, on the client's base, when its connection breaks (the server closed it, an
     * I/O, TLS or protocol error), after its open calls ended with UNAVAILABLE; never because
     * of mg_client_del. The client is of no more use: make another. Optional. */
    void (*on_broken)(void *arg, const char *why);
    void *broken_arg;
} mg_client_options;

typedef struct mg_metadata {
    const char *name; /* lower case */
    const char *value;
} mg_metadata;

typedef struct mg_rpc_handlers {
    /* One response message; the buffer is valid during the call only. Optional. */
    void (*on_message)(mg_rpc *rpc, const uint8_t *msg, size_t len, void *arg);
    /* Final status, exactly once; `message` is decoded and never NULL. */
    void (*on_close)(mg_rpc *rpc, int status, const char *message, void *arg);
} mg_rpc_handlers;

/* Starts connecting. Returns 0, or -1 with the reason in err (bad target, TLS files). */
int mg_client_new(mg_client **out, struct event_base *base, const mg_client_options *opts,
                  char *err, size_t errcap);
/* Closes the connection; open calls end with CANCELLED. Accepts NULL. */
void mg_client_del(mg_client *c);

/* Starts a call on `path` ("/pkg.Service/Method"). timeout_ms 0 means none. Returns the call, or
 * NULL when out of memory or the connection already failed (on_close is then not called). */
mg_rpc *mg_rpc_start(mg_client *c, const char *path, const mg_metadata *md, size_t n_md,
                     uint64_t timeout_ms, const mg_rpc_handlers *h, void *arg);
/* Queues one request message. Returns 0, or -1 after close_send or when the call ended. */
int mg_rpc_send(mg_rpc *rpc, const uint8_t *msg, size_t len);
/* Half-closes: no more request messages. */
int mg_rpc_close_send(mg_rpc *rpc);
/* Cancels the call (RST_STREAM CANCEL); on_close runs with CANCELLED. */
void mg_rpc_cancel(mg_rpc *rpc);
/* A response header or trailer value seen so far, or NULL. */
const char *mg_rpc_header(const mg_rpc *rpc, const char *name);

/* Blocking call on an open client: starts it, writes the request at once and runs the client's
 * base (which must not be running: call from outside its callbacks) until the call ends. For
 * programs making one call at a time on a persistent connection. On return *status and message
 * (at most msgcap bytes) are set, and when the status is OK *resp (caller frees) holds the last
 * response message (the only one of a unary call). Returns 0, or -1 with the reason in message
 * when the call could not be started (the connection failed, out of memory). */
int mg_client_call(mg_client *c, const char *path, const uint8_t *req, size_t req_len,
                   uint64_t timeout_ms, uint8_t **resp, size_t *resp_len, int *status,
                   char *message, size_t msgcap);

struct ProtobufCMessage;
struct ProtobufCMessageDescriptor;
/* mg_client_call of a protobuf-c message: packs `req`, and on OK unpacks the answer (a
 * stream's last) as `resp`
 * (the caller frees it with protobuf_c_message_free_unpacked). NULL with *status (a gRPC code;
 * UNAVAILABLE when the call could not start, INTERNAL for an answer that is no `resp`) and err. */
void *mg_client_call_msg(mg_client *c, const char *path, const struct ProtobufCMessage *req,
                         const struct ProtobufCMessageDescriptor *resp, uint64_t timeout_ms,
                         int *status, char *err, size_t errcap);

/* Blocking unary call on a private loop and connection. On return *status and *message (caller
 * frees) are set; *resp (caller frees) holds the response when status is OK. Returns 0, or -1
 * with err set when the call could not be attempted at all. */
int mg_client_unary(const mg_client_options *opts, const char *path, const uint8_t *req,
                    size_t req_len, uint64_t timeout_ms, uint8_t **resp, size_t *resp_len,
                    int *status, char **message, char *err, size_t errcap);

/* ---- memory the program has, passed as a descriptor (docs/api.md) ---- */

/* The fd socket of a "unix:/path" target: "/path.fd" (the daemon's --fd-socket auto). Returns
 * 0, or -1 for another kind of target or a path longer than cap. */
int mg_fd_socket_of(const char *target, char *out, size_t cap);
/* Passes descriptor `fd` (a memfd, tmpfs file, any regular file open O_RDWR) to the daemon on
 * its fd socket and waits for the answer (a local socket: microseconds). On 0, *handle names
 * the descriptor for one RegisterSegment (source FD, fd_handle) made by this process, as the
 * same tenant (`token`: the bearer token its calls send, or NULL), within *ttl_ms. On -1,
 * *status is the gRPC code (UNAVAILABLE: no fd socket there) and err says why. The caller
 * keeps its descriptor; the daemon has its own. */
int mg_fd_pass(const char *fd_socket, int fd, const char *token, uint64_t *handle, uint64_t *ttl_ms,
               int *status, char *err, size_t errcap);

/* A client with a loop of its own, for blocking calls (mg_client_call, mg_vram_move) from one
 * thread at a time: for programs and bindings (Python's ctypes) without a libevent base. h2c or
 * "unix:" targets; token NULL for none. NULL with err set when it cannot connect. */
mg_client *mg_client_open(const char *target, const char *token, char *err, size_t errcap);
/* Closes a client of mg_client_open (its loop with it). Accepts NULL. */
void mg_client_close(mg_client *c);

/* The target a client was made for ("unix:/path", "host:port"), and its bearer token or NULL. */
const char *mg_client_target(const mg_client *c);
const char *mg_client_token(const mg_client *c);

/* ---- Outliving the daemon ----
 * A client of mg_client_open comes back with its daemon when the daemon is restarted, upgraded
 * or killed. A call whose connection breaks under it ends UNAVAILABLE, once. The next call
 * connects again first — trying with a back-off up to MOONGATE_RECONNECT_BACKOFF_MS (default
 * 1000 ms) for at most MOONGATE_RECONNECT_S seconds (default 30; 0: never) — and makes again
 * what the client made there, in the order it was made:
 *   - agents registered with Agent/RegisterAgent: the same name and the same port;
 *   - process memory registered with Memory/RegisterSegment (source PROCESS): again by address;
 *   - buffers of mg_buffer_alloc (the library keeps a descriptor of each);
 *   - GPU memory of mg_vram_register: exported again and registered by address.
 * Segments the daemon made (ANON, SHM) and descriptors the program passed itself (FD) do not
 * come back: mg_client_segment_now() answers 0 for them. A daemon that does not come back in
 * time fails the call ("the daemon did not come back within MOONGATE_RECONNECT_S=30 s"); the
 * next call tries once more. One that comes back refusing the client's token, or as another
 * user's daemon on the same socket path, fails every call from then on, with that reason, and
 * is not tried again. All of it runs on the calling thread, inside its call. */

/* The daemon's id now of segment `id`, one this client was handed (by RegisterSegment,
 * mg_client_register, mg_buffer_alloc or mg_vram_register): the same id until a restart made it
 * again under another, 0 if it did not come back. A connection that broke since the last call
 * is restored first, as a call would: map ids as the request that names them is built.
 * Requests that name this process's memory by address (TransferRequest.local_address) need no
 * mapping; mg_client_unregister and mg_buffer_free map by themselves. */
uint64_t mg_client_segment_now(mg_client *c, uint64_t id);
/* The daemon's epoch when last seen (0: not asked yet), and the restarts this client went
 * through (a new epoch after a reconnect). */
uint64_t mg_client_epoch(const mg_client *c);
unsigned mg_client_restarts(const mg_client *c);
/* MOONGATE_RECONNECT_S and MOONGATE_RECONNECT_BACKOFF_MS in milliseconds (defaults 30000 and
 * 1000; the back-off at least 10). -1 with err naming a value that is not a number (its default
 * is used), else 0. */
int mg_client_reconnect_env(uint64_t *bound_ms, uint64_t *backoff_ms, char *err, size_t errcap);
/* The uid owning the socket file of a "unix:" target, or -1. */
long mg_client_socket_owner(const char *target);

/* Memory for transfers that this library allocates and the daemon registers where it lies:
 * a memfd sealed against shrinking and growing (safe for RDMA), mapped here, passed on the fd
 * socket and registered with its address, in one call. Transfers name it by segment_id or,
 * from this process, by address (TransferRequest.local_address). */
typedef struct mg_buffer {
    void *addr; /* its first byte in this process */
    size_t size;
    uint64_t segment_id; /* the registered segment */
} mg_buffer;
/* Allocates and registers `size` bytes over c (a "unix:" target, used as mg_client_call does:
 * not from its callbacks) as segment `name` (NULL: "buffer-PID-N"), remote-accessible if asked.
 * Returns 0 with *out set, or -1 with *status (a gRPC code) and err set; nothing is left then. */
int mg_buffer_alloc(mg_client *c, size_t size, int remote_accessible, const char *name,
                    mg_buffer *out, int *status, char *err, size_t errcap);
struct Moongate__V1__RegisterRequest;
/* RegisterSegment on c, blocking (as mg_client_call: not from c's callbacks). Returns 0 with the
 * segment's *id, or -1 with *status (a gRPC code) and err. */
int mg_client_register(mg_client *c, const struct Moongate__V1__RegisterRequest *req, uint64_t *id,
                       int *status, char *err, size_t errcap);
/* UnregisterSegment of segment id on c, blocking. Returns 0, or -1 with *status and err. */
int mg_client_unregister(mg_client *c, uint64_t id, int *status, char *err, size_t errcap);
/* What mg_client_register_any made. */
typedef struct mg_registered {
    const char *kind; /* "process" (host memory) or "device" */
    const char *path; /* how peers reach it: "process_vm" (TCP), "dmabuf" (RDMA), "staged" (TCP,
                       * this library's copy thread moving it to and from the device), or ""
                       * (this process's own transfers only) */
    char why[640];    /* what refused a better path ("" when none did) */
} mg_registered;
/* Registers memory of this process by its address, whatever it is (malloc'd, mmap'd, pinned
 * host memory from the CUDA driver, GPU memory), over c (a "unix:" target) the way a path
 * serves it: host memory as process memory (source PROCESS: the daemon reaches it with
 * process_vm); memory the daemon cannot reach as this process's that the CUDA driver (loaded
 * only then) knows as a device's by its dma-bufs (mg_vram_register: peers reach it over RDMA),
 * and where that is refused (no RDMA device on the daemon, a GPU without dma-buf) staged
 * (mg_vram_register_staged: over TCP). Remote-accessible if asked and a path lets peers reach
 * it; else (no TCP data plane for peers) registered for this process's transfers only, and
 * out->why says why. Named name (NULL: "mem-PID-ADDR"); made again after a daemon restart.
 * Returns how many segments (ids[0..n), at most cap; one but by dma-buf, one per allocation the
 * range crosses) with *out, or -1 with *status and err: FAILED_PRECONDITION where no path serves
 * it at all (process memory off on the daemon: the error names the setting), INVALID_ARGUMENT
 * naming both ways tried for memory that is neither (freed, another process's). */
int mg_client_register_any(mg_client *c, uintptr_t ptr, size_t len, int remote_accessible,
                           const char *name, uint64_t *ids, int cap, mg_registered *out,
                           int *status, char *err, size_t errcap);
/* Unregisters and unmaps a buffer. Returns 0, or -1 with *status and err (the mapping is gone
 * either way; a segment the daemon still holds is unregistered by its id later). */
int mg_buffer_free(mg_client *c, mg_buffer *b, int *status, char *err, size_t errcap);

/* ---- prepared lists and submission rings (docs/api.md "Submission rings") ----
 * A ring is shared memory with the daemon where this process posts batches by index into its
 * connection's prepared lists and reads their ends, without a call each. Its layout, the
 * completion (struct mg_ring_cqe) and the flags are moongate/ringwire.h's. One thread posts
 * and reads a ring at a time. */

/* Keeps a list of ranges on the daemon for this client's connection (Transfer/PrepareList):
 * this process's own memory (peer and agent NULL or "") or an agent's (agent on peer). Returns
 * 0 with *id, or -1 with *status and err. */
int mg_client_prepare_list(mg_client *c, const uint64_t *addrs, const uint64_t *lens, size_t n,
                           const char *peer, const char *agent, uint64_t *id, int *status,
                           char *err, size_t errcap);

typedef struct mg_client_ring mg_client_ring;
struct mg_ring_cqe;
/* A ring of `entries` slots each way (a power of two, 8..4096; 0: 256) for c's connection (a
 * "unix:" target). Returns 0 with *out, or -1 with *status and err. */
int mg_client_ring_attach(mg_client *c, uint32_t entries, mg_client_ring **out, int *status,
                          char *err, size_t errcap);
uint64_t mg_client_ring_id(const mg_client_ring *r);
/* Posts n pairs by index (local_idx[k] of local_list with remote_idx[k] of remote_list), op 0
 * READ or 1 WRITE; flags MG_RING_ACCEPTED for a completion at acceptance too; topic (not NULL)
 * and payload: the notification for the remote list's peer. Returns 0, RESOURCE_EXHAUSTED (the
 * ring is full: read completions, post again), INVALID_ARGUMENT (no pairs, a note or a
 * submission larger than the ring), or the gRPC code the ring broke with. */
int mg_client_ring_post_pairs(mg_client_ring *r, int op, uint64_t local_list,
                              const uint32_t *local_idx, uint64_t remote_list,
                              const uint32_t *remote_idx, uint32_t n, uint64_t user_data,
                              unsigned flags, const char *topic, const void *payload,
                              uint32_t payload_len);
/* Posts count blocks of length bytes: block k at local_offset + k * local_stride of range
 * local_index of local_list, and at remote_offset + k * remote_stride of range remote_index of
 * remote_list. Returns as mg_client_ring_post_pairs. */
int mg_client_ring_post_strided(mg_client_ring *r, int op, uint64_t local_list,
                                uint32_t local_index, uint64_t local_offset, uint64_t local_stride,
                                uint64_t remote_list, uint32_t remote_index, uint64_t remote_offset,
                                uint64_t remote_stride, uint64_t length, uint32_t count,
                                uint64_t user_data, unsigned flags);
/* Up to max completions written so far, into out; no system call unless the daemon waits for
 * room. Returns how many. */
unsigned mg_client_ring_poll(mg_client_ring *r, struct mg_ring_cqe *out, unsigned max);
/* The same, waiting up to timeout_ms (-1: for ever; spinning spin_us first) for at least one.
 * Returns how many (0: the time passed), or minus a gRPC code: UNAVAILABLE when the daemon let
 * the ring go (its connection closed, the daemon stopped), the code the ring broke with. */
int mg_client_ring_wait(mg_client_ring *r, struct mg_ring_cqe *out, unsigned max, int timeout_ms,
                        unsigned spin_us);
/* Whether the daemon still serves the ring (one system call). */
int mg_client_ring_alive(mg_client_ring *r);
/* Lets go of the ring here (the daemon's goes with the connection). Accepts NULL. */
void mg_client_ring_detach(mg_client_ring *r);

#endif
