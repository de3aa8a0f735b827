/*
 * mg_config: the daemon's options. One table gives each option's name, type, default, limits and
 * help; values come from, in rising precedence, the defaults, the config file (`--config PATH`,
 * lines `name = value`), the environment (`MOONGATE_NAME`) and the command line (`--name value`
 * or `--name=value`). The result is a read-only snapshot used by every thread.
 */
#ifndef MG_CONFIG_H
#define MG_CONFIG_H

#include "moongate/dataplane.h"

#include <stdint.h>
#include <stdio.h>

typedef struct mg_config {
    char *config;
    char *listen;                 /* TLS h2 control listeners, comma-separated host:port */
    char *h2c_listen;             /* plaintext h2c TCP listeners (loopback unless allow_h2c_any) */
    int allow_h2c_any;            /* permit h2c on non-loopback addresses */
    char *unix_socket;            /* h2c on a Unix-domain socket; "" disables */
    uint64_t unix_socket_mode;    /* permission bits of the socket */
    char *unix_socket_group;      /* group (name or number) the socket is given to; "" keeps ours */
    char *fd_socket;              /* where clients pass descriptors: "auto", a path, "" (none) */
    uint64_t max_unclaimed_fds;   /* descriptors one fd-socket connection holds unregistered */
    uint64_t max_fd_handles;      /* descriptors held unregistered in all */
    uint64_t fd_handle_ttl;       /* ms a passed descriptor waits for its registration */
    char *ops_listen;             /* plaintext HTTP/1.1 ops listeners; "" disables */
    uint64_t ops_header_timeout;  /* seconds for a whole request on the ops port */
    uint64_t ops_max_connections; /* ops-port connections at once */
    char *tls_cert;
    char *tls_key;
    char *client_ca;          /* CA of client certificates ("": none) */
    char *auth_file;          /* principals ("": none) */
    int allow_anonymous;      /* callers without credentials are tenant "default" */
    uint64_t reload_interval; /* seconds; 0: files are read once */
    char *shm_dir;
    uint64_t shm_mode;
    char *memlock;      /* off, try, require */
    int process_memory; /* clients may register their own memory by address */
    char *shm_group;    /* group (name or number) of the shm directory and the daemon's files */
    uint64_t max_segments;
    uint64_t max_tenant_segments;
    uint64_t max_tenant_bytes; /* quotas per tenant; 0: none */
    uint64_t max_tenant_leases;
    uint64_t max_tenant_batches;
    uint64_t tenant_rate; /* calls per second */
    uint64_t max_registered_bytes;
    uint64_t max_batch;
    uint64_t pool_bytes;
    uint64_t pool_reserve_bytes;
    char *tenant_pool;   /* "TENANT=BYTES,..." */
    char *pool_overflow; /* refuse, register */
    uint64_t pool_overflow_max_bytes;
    uint64_t max_leases;
    uint64_t lease_ttl;     /* seconds */
    uint64_t max_lease_ttl; /* seconds */
    uint64_t max_wait;      /* seconds */
    char *data_listen;
    uint64_t data_max_slice;
    uint64_t data_max_conns;
    uint64_t data_io_timeout; /* seconds */
    uint64_t session_ttl;     /* seconds */
    uint64_t peer_port;       /* peers' control port, in agents' one-string form */
    char *agent_ports;        /* "LO-HI" */
    char *advertise;          /* our control endpoint for peers, in agent descriptors */
    uint64_t max_agents;
    uint64_t agent_port_hold; /* seconds a restarted daemon holds its agents' ports (0: none) */
    int peer_tls;
    char *peer_ca;
    char *peer_cert; /* presented to peers ("": --tls-cert) */
    char *peer_key;
    char *peer_allow; /* peer identities allowed to call the peer API ("": any from peer_ca) */
    int peer_anonymous;
    uint64_t max_transfer_requests;
    uint64_t slice_bytes;
    int data_crc;
    uint64_t max_batches;
    uint64_t transfer_timeout; /* seconds */
    uint64_t tcp_conns_per_peer;
    char *tcp_congestion;     /* data-plane connections' ("": the system's) */
    uint64_t tcp_send_buffer; /* theirs, bytes (0: autotuning; MG_CONFIG_AUTO: auto) */
    /* The two above as the data plane takes them, made once by mg_config_load: the connections
     * this daemon opens and those it accepts (congestion points into tcp_congestion). */
    mg_dp_tcp data_tcp;
    uint64_t batch_retention; /* seconds */
    uint64_t notify_queue;
    uint64_t notify_line; /* Sends waiting per connection, peer and topic */
    uint64_t notify_max_bytes;
    uint64_t max_expectations;
    uint64_t peer_liveness_timeout; /* ms */
    uint64_t trace_spans;
    uint64_t workers;
    uint64_t io_threads;
    char *ibverbs_lib;  /* "": RDMA off */
    char *rdma_devices; /* "": every usable one */
    uint64_t rdma_gid_index;
    uint64_t rdma_qps_per_peer;
    int require_rdma;
    uint64_t queue_depth;
    uint64_t max_message_bytes;
    uint64_t max_concurrent_streams;
    uint64_t max_header_list_bytes;
    uint64_t max_conn_output_bytes;
    uint64_t stream_window_bytes;
    uint64_t conn_window_bytes;
    uint64_t idle_timeout;      /* seconds */
    uint64_t write_timeout;     /* seconds */
    uint64_t handshake_timeout; /* seconds */
    uint64_t busy_poll_us;      /* mg_gateway_run(): poll this long after the last read; 0 off */
    uint64_t grace;             /* seconds */
    uint64_t max_continuations;
    uint64_t reset_burst;
    uint64_t reset_rate;
    uint64_t max_watchers;
    char *log_level;
    int access_log;
    int debug_service;
} mg_config;

enum { MG_CONFIG_OK = 0, MG_CONFIG_EXIT = 1, MG_CONFIG_ERROR = -1 };
#define MG_CONFIG_AUTO UINT64_MAX /* a size option set to "auto" */

/* Fills cfg from defaults, file, environment and argv. Returns MG_CONFIG_OK, MG_CONFIG_EXIT
 * (help or version was printed to `out`) or MG_CONFIG_ERROR with a message naming the option
 * and where it came from in err. */
int mg_config_load(mg_config *cfg, int argc, char **argv, FILE *out, char *err, size_t errcap);
void mg_config_free(mg_config *cfg);
/* Prints the option table: flag, environment name, default, limits and help. */
void mg_config_help(FILE *out);
/* One entry of --tenant-pool. */
typedef struct mg_tenant_pool {
    char tenant[129];
    uint64_t bytes;
} mg_tenant_pool;
/* Parses --tenant-pool "TENANT=BYTES[,TENANT=BYTES...]" (empty: none) into at most max
 * entries. Returns how many, or -1 with the reason in err. */
int mg_config_tenant_pools(const char *s, mg_tenant_pool *out, int max, char *err, size_t errcap);
/* A group given by name or number (--shm-group, --unix-socket-group). Returns 0 and the gid,
 * or -1 when no such group exists. */
int mg_config_group(const char *name, unsigned *gid);
/* --memlock: 0 off, 1 try, 2 require (the values of mg_memlock), or -1. */
int mg_config_memlock(const char *s);
/* Parses "4M", "512k", "1G", "123" (binary units) into *out; returns 0 or -1. */
int mg_config_parse_size(const char *s, uint64_t *out);

#endif
