/*
 * moongate RDMA: libibverbs opened at run time, its devices and their registrations.
 *
 * The daemon is built against the verbs headers only and never linked with libibverbs: at start
 * mg_rdma_open() loads the library with dlopen (`lib`, default "libibverbs.so.1"), resolves the
 * entry points it uses into a table (ibv_post_send, ibv_poll_cq and friends are inline calls
 * through the device context's ops and need none; ibv_reg_mr and ibv_query_port are macros over
 * exported functions, which are what is resolved), lists the devices and their first active
 * port, and opens a protection domain on each usable one. When anything is missing — the
 * library, a symbol, kernel support, a device, an active port — it says why and the daemon
 * moves bytes over TCP. The tests load a software verbs emulator through the same seam.
 *
 * Registrations cover every usable device: mg_rdma_reg() registers one range with each device's
 * protection domain (remote read and write only when asked) on the calling thread (a worker:
 * registration pins pages) and undoes the ones done if a later device fails.
 */
#ifndef MOONGATE_RDMA_H
#define MOONGATE_RDMA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MG_RDMA_MAX_DEVICES 8

typedef struct mg_rdma mg_rdma;
typedef struct mg_rdma_mr mg_rdma_mr;

typedef struct mg_rdma_config {
    const char *lib;     /* the library to dlopen; NULL or "": "libibverbs.so.1" */
    const char *devices; /* comma-separated device names to use; NULL or "": every usable one */
    int gid_index;       /* GID table entry for RoCE (0 by default) */
} mg_rdma_config;

typedef struct mg_rdma_device_info {
    char name[64];
    uint8_t port; /* the port used (the first active one) */
    unsigned mtu; /* active MTU in bytes */
    uint16_t lid; /* InfiniBand: the port's LID; RoCE: 0 */
    int roce;     /* link layer Ethernet */
    char gid[48]; /* the GID at gid_index, as an IPv6 address */
    uint64_t max_mr_size;
    uint32_t max_msg_size;
    int max_qp_wr;
} mg_rdma_device_info;

/* Loads the library and opens the usable devices. Returns 0 when at least one device is usable;
 * otherwise MG_ERR_UNAVAILABLE with the reason in why ("cannot load libibverbs.so.1: ...",
 * "no RDMA devices", "device mlx5_3 (--rdma-devices) not found", ...) and *out NULL. */
int mg_rdma_open(mg_rdma **out, const mg_rdma_config *cfg, char *why, size_t whycap);
/* Closes the devices and the library. The registrations must be gone. Accepts NULL. */
void mg_rdma_close(mg_rdma *r);

int mg_rdma_device_count(const mg_rdma *r);
void mg_rdma_device(const mg_rdma *r, int i, mg_rdma_device_info *out);
/* The library's name as loaded. */
const char *mg_rdma_lib(const mg_rdma *r);

/* Registers [addr, addr + len) with every device: local write always, remote read and write
 * when `remote`. Returns 0, or MG_ERR_SYSTEM / MG_ERR_PERMISSION (memlock) / MG_ERR_NOMEM with
 * the device and reason in why; nothing stays registered on error. Thread-safe. */
int mg_rdma_reg(mg_rdma *r, void *addr, size_t len, int remote, mg_rdma_mr **out, char *why,
                size_t whycap);
/* Whether the library has ibv_reg_dmabuf_mr (an optional symbol: rdma-core 34 and later). */
int mg_rdma_has_dmabuf(const mg_rdma *r);
/* Registers `len` bytes of a dma-buf (fd, from `offset` in it) with every device, named by
 * `iova` in work requests (the memory is never mapped here: a GPU's). Returns 0, or
 * MG_ERR_UNSUPPORTED (no ibv_reg_dmabuf_mr, or a device's provider refused dma-bufs) and the
 * errors of mg_rdma_reg; nothing stays registered on error, and why then says what each device
 * answered ("device mlx5_0: took it; device mlx5_1: ibv_reg_dmabuf_mr ...: ..."). */
int mg_rdma_reg_dmabuf(mg_rdma *r, int fd, uint64_t offset, size_t len, uint64_t iova, int remote,
                       mg_rdma_mr **out, char *why, size_t whycap);
/* Deregisters on every device. Accepts NULL. Thread-safe. */
void mg_rdma_dereg(mg_rdma_mr *mr);
/* Device i's keys of a registration. */
uint32_t mg_rdma_mr_lkey(const mg_rdma_mr *mr, int i);
uint32_t mg_rdma_mr_rkey(const mg_rdma_mr *mr, int i);

/* ---- connections: RC queue pairs to one peer on one device ---- */

#define MG_RDMA_MAX_QPS 8

/* One side of a connection, as the QP handshake carries it. */
typedef struct mg_rdma_ep {
    uint8_t gid[16];
    uint16_t lid;
    uint32_t mtu; /* bytes */
    unsigned nqps;
    uint32_t qpn[MG_RDMA_MAX_QPS], psn[MG_RDMA_MAX_QPS];
} mg_rdma_ep;

typedef struct mg_rdma_conn mg_rdma_conn;

/* Creates nqps RC QPs on device `dev` sharing one completion queue, moved to INIT; *local
 * describes them for the peer. Runs verbs calls: a worker's job. Returns 0 or an MG_ERR_*. */
int mg_rdma_conn_new(mg_rdma *r, int dev, unsigned nqps, mg_rdma_conn **out, mg_rdma_ep *local,
                     char *why, size_t whycap);
/* Connects the QPs to the peer's (as many as ours): RTR then RTS, path MTU the smaller of the
 * two; the QP timeout and retry count make a dead peer an error within about half a second. */
int mg_rdma_conn_connect(mg_rdma_conn *c, const mg_rdma_ep *remote, char *why, size_t whycap);
void mg_rdma_conn_del(mg_rdma_conn *c); /* accepts NULL */
/* Non-zero once an operation failed on it: it must be deleted and set up anew. Any thread, also
 * while a mover on another fails it. */
int mg_rdma_conn_broken(const mg_rdma_conn *c);

typedef struct mg_rdma_op {
    int write;   /* RDMA WRITE local -> remote, else RDMA READ remote -> local */
    void *local; /* registered with the connection's device */
    uint32_t lkey;
    uint64_t remote_addr; /* the peer's registered address and key */
    uint32_t rkey;
    uint64_t len;
} mg_rdma_op;

/* Moves op in slices of `slice` bytes spread over the QPs, up to `window` in flight on each;
 * returns when every slice completed (0), a completion failed (MG_ERR_UNAVAILABLE for
 * retry-exceeded, MG_ERR_NOT_FOUND for a remote access error, MG_ERR_PROTOCOL otherwise; why
 * names the verbs status), *stop was set (that code) or nothing completed for wait_ms
 * (MG_ERR_UNAVAILABLE). Slices still posted are flushed before it returns, so the memory is
 * free to go. *progress (may be NULL) counts completed bytes atomically. One thread at a time. */
int mg_rdma_move(mg_rdma_conn *c, const mg_rdma_op *op, uint32_t slice, unsigned window,
                 const int *stop, uint64_t *progress, uint32_t wait_ms, char *why, size_t whycap);
/* The same over several connections (one per device), slices taking turns between them: op's
 * lkey and rkey are replaced by lkeys[k] and rkeys[k], the keys on connection k's devices. */
int mg_rdma_move_multi(mg_rdma_conn *const *cs, unsigned nc, const mg_rdma_op *op,
                       const uint32_t *lkeys, const uint32_t *rkeys, uint32_t slice,
                       unsigned window, const int *stop, uint64_t *progress, uint32_t wait_ms,
                       char *why, size_t whycap);

typedef struct mg_rdma_stats {
    uint64_t mrs;        /* registrations alive */
    uint64_t mr_bytes;   /* bytes they cover (each counted once, whatever the devices) */
    uint64_t reg_total;  /* mg_rdma_reg calls that worked */
    uint64_t reg_failed; /* and that failed */
    uint64_t conns;      /* connections alive */
    uint64_t wr_posted, wr_failed;
    uint64_t bytes_written, bytes_read;
} mg_rdma_stats;
void mg_rdma_get_stats(mg_rdma *r, mg_rdma_stats *out);

#ifdef __cplusplus
}
#endif

#endif
