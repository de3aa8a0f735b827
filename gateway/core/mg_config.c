/* mg_config: see mg_config.h. */
#include "mg_config.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum { T_STR, T_UINT, T_SIZE, T_BOOL, T_MODE } opt_type;

typedef struct {
    const char *name;
    opt_type type;
    size_t offset;
    const char *def;
    uint64_t min, max;
    const char *help;
} opt_def;

#define O(f) offsetof(mg_config, f)
#define KiB  1024ULL
#define MiB  (1024ULL * 1024ULL)
#define GiB  (1024ULL * 1024ULL * 1024ULL)

static const opt_def opts[] = {
    {"config", T_STR, O(config), "", 0, 0, "config file of `name = value` lines"},
    {"listen", T_STR, O(listen), "[::]:7443", 0, 0,
     "TLS HTTP/2 control listeners (comma-separated host:port); without --tls-cert the daemon "
     "serves h2c on 127.0.0.1 at the first listener's port instead"},
    {"h2c-listen", T_STR, O(h2c_listen), "", 0, 0,
     "plaintext h2c (prior knowledge) TCP listeners; loopback only unless --allow-h2c-any"},
    {"allow-h2c-any", T_BOOL, O(allow_h2c_any), "false", 0, 1,
     "permit --h2c-listen on non-loopback addresses"},
    {"unix-socket", T_STR, O(unix_socket), "/run/moongate/moongate.sock", 0, 0,
     "h2c on a Unix-domain socket for local clients; empty disables"},
    {"unix-socket-mode", T_MODE, O(unix_socket_mode), "0660", 0, 0777,
     "permissions of the Unix socket (octal); 0666 lets every local user connect"},
    {"unix-socket-group", T_STR, O(unix_socket_group), "", 0, 0,
     "group (name or number) the Unix socket is given to, so that its members may connect with "
     "mode 0660; empty keeps the daemon's group"},
    {"fd-socket", T_STR, O(fd_socket), "auto", 0, 0,
     "SOCK_SEQPACKET Unix socket where local clients pass file descriptors (memfd, tmpfs files) "
     "to register them (docs/api.md); auto: --unix-socket with \".fd\" appended, same mode and "
     "group; empty disables"},
    {"max-unclaimed-fds", T_UINT, O(max_unclaimed_fds), "16", 1, 4096,
     "descriptors one fd-socket connection may have passed that no registration has named yet"},
    {"max-fd-handles", T_UINT, O(max_fd_handles), "1024", 1, 65536,
     "descriptors the daemon holds for registrations at once, from all connections"},
    {"fd-handle-ttl", T_UINT, O(fd_handle_ttl), "10000", 10, 600000,
     "milliseconds a passed descriptor waits for the RegisterSegment that names it; then it is "
     "closed"},
    {"ops-listen", T_STR, O(ops_listen), "[::]:7080", 0, 0,
     "plaintext HTTP/1.1 ops listeners (/livez /readyz /metrics /); empty disables"},
    {"ops-header-timeout", T_UINT, O(ops_header_timeout), "10", 1, 600,
     "seconds an ops-port request has, from accept (or the previous answer), to arrive whole, "
     "however slowly its bytes come"},
    {"ops-max-connections", T_UINT, O(ops_max_connections), "128", 1, 65536,
     "ops-port connections open at once; more are closed at accept"},
    {"tls-cert", T_STR, O(tls_cert), "", 0, 0, "server certificate chain (PEM)"},
    {"tls-key", T_STR, O(tls_key), "", 0, 0, "server private key (PEM)"},
    {"client-ca", T_STR, O(client_ca), "", 0, 0,
     "CA of client certificates: a client whose certificate chains to it is known by the "
     "certificate's CN, DNS or URI name (mapped to a tenant by --auth-file); kept apart from "
     "--peer-ca"},
    {"auth-file", T_STR, O(auth_file), "", 0, 0,
     "principals: lines `token sha256:HEX TENANT [admin]`, `cert IDENTITY TENANT [admin]`, "
     "`uid UID TENANT [admin]`; re-read when it changes"},
    {"allow-anonymous", T_BOOL, O(allow_anonymous), "false", 0, 1,
     "serve callers without credentials as tenant \"default\" (development and loopback only; "
     "otherwise they get UNAUTHENTICATED)"},
    {"reload-interval", T_UINT, O(reload_interval), "5", 0, 3600,
     "seconds between checks of --auth-file and the TLS files for changes (0: never re-read)"},
    {"shm-dir", T_STR, O(shm_dir), "/dev/shm/moongate", 0, 0,
     "directory of segment files (created if missing); local clients map files here"},
    {"shm-mode", T_MODE, O(shm_mode), "0600", 0, 0777,
     "permissions of the segment files the daemon creates (octal)"},
    {"shm-group", T_STR, O(shm_group), "", 0, 0,
     "group (name or number) given the shm directory (setgid, group-writable) and the segment "
     "files, so that its members can map them and make shm files; empty keeps the daemon's"},
    {"memlock", T_STR, O(memlock), "off", 0, 0,
     "what a registration's MEMLOCK_DEFAULT means: off, try (lock if RLIMIT_MEMLOCK allows) or "
     "require (fail otherwise)"},
    {"process-memory", T_BOOL, O(process_memory), "true", 0, 1,
     "let local clients register memory they allocated themselves by address (process memory, "
     "reached with process_vm; the daemon needs the clients' uid or CAP_SYS_PTRACE, and to see "
     "their pids); false refuses such registrations, naming this setting"},
    {"max-segments", T_UINT, O(max_segments), "65536", 1, 16777216, "registered segments at most"},
    {"max-tenant-segments", T_UINT, O(max_tenant_segments), "4096", 1, 16777216,
     "registered segments of one tenant at most"},
    {"max-tenant-bytes", T_SIZE, O(max_tenant_bytes), "0", 0, 1ULL << 50,
     "bytes one tenant may have registered (segments and overflow leases); 0: no quota"},
    {"max-tenant-leases", T_UINT, O(max_tenant_leases), "0", 0, 16777216,
     "live leases one tenant may hold in a pool; 0: no quota"},
    {"max-tenant-batches", T_UINT, O(max_tenant_batches), "0", 0, 1 << 20,
     "transfer batches of one tenant running at once; 0: no quota"},
    {"tenant-rate", T_UINT, O(tenant_rate), "0", 0, 10000000,
     "calls per second one tenant may make (bursts of one second's worth); 0: no quota"},
    {"max-registered-bytes", T_SIZE, O(max_registered_bytes), "16G", 4096, 1ULL << 50,
     "sum of registered segment sizes at most"},
    {"max-batch", T_UINT, O(max_batch), "1024", 1, 65536,
     "items in one batch call (RegisterSegments, UnregisterSegments) at most"},
    {"pool-bytes", T_SIZE, O(pool_bytes), "256M", 0, 1ULL << 43,
     "the default buffer pool's lease area, registered at start-up; 0 disables the pool"},
    {"pool-reserve-bytes", T_SIZE, O(pool_reserve_bytes), "16M", 0, 1ULL << 40,
     "pool headroom after the lease area that leases never take (staging, inline copies)"},
    {"tenant-pool", T_STR, O(tenant_pool), "", 0, 0,
     "pools of their own for tenants, TENANT=BYTES[,TENANT=BYTES...] (at most 16); their leases "
     "come from there instead of the default pool"},
    {"pool-overflow", T_STR, O(pool_overflow), "refuse", 0, 0,
     "when the pool cannot serve a lease: refuse (RESOURCE_EXHAUSTED, or wait with block) or "
     "register (the lease gets its own registered region, counted and logged)"},
    {"pool-overflow-max-bytes", T_SIZE, O(pool_overflow_max_bytes), "1G", 0, 1ULL << 43,
     "bytes of overflow leases alive at once at most"},
    {"max-leases", T_UINT, O(max_leases), "65536", 1, 1 << 24, "live leases at most"},
    {"lease-ttl", T_UINT, O(lease_ttl), "60", 1, 86400,
     "seconds a lease lives when its acquire gives no ttl"},
    {"max-lease-ttl", T_UINT, O(max_lease_ttl), "3600", 1, 604800,
     "longest lease ttl in seconds a client may ask for"},
    {"max-wait", T_UINT, O(max_wait), "30", 1, 3600,
     "seconds a blocking acquire without a deadline waits for room at most"},
    {"data-listen", T_STR, O(data_listen), "[::]:7446", 0, 0,
     "TCP data-plane listener (host:port) other daemons move bytes through; empty disables"},
    {"data-max-slice", T_SIZE, O(data_max_slice), "4M", 4096, 1 * GiB,
     "largest data-plane slice accepted"},
    {"data-max-conns", T_UINT, O(data_max_conns), "64", 1, 4096,
     "data-plane connections at once at most"},
    {"data-io-timeout", T_UINT, O(data_io_timeout), "10", 1, 3600,
     "seconds a data-plane slice may stall before its connection is dropped"},
    {"session-ttl", T_UINT, O(session_ttl), "3600", 1, 604800,
     "seconds a data-plane session token stays valid"},
    {"peer-port", T_UINT, O(peer_port), "7443", 1, 65535,
     "the control port of peer daemons: the one-string form \"host:port\" of an agent names "
     "the agent with that port on the daemon at host and this port (docs/api.md)"},
    {"advertise", T_STR, O(advertise), "", 0, 0,
     "host:port where peers reach this daemon's control port, as agent descriptors carry it; "
     "$(VAR) is the environment variable VAR and $(VAR:dashed) the same with '.' and ':' as "
     "'-' (a pod's IP as its DNS label: $(POD_IP:dashed).PEERS.NS.svc:7443); empty: this "
     "host's name and --peer-port"},
    {"agent-ports", T_STR, O(agent_ports), "20000-29999", 0, 0,
     "the range LO-HI of the ports the daemon assigns agents that ask for none"},
    {"max-agents", T_UINT, O(max_agents), "4096", 1, 65536, "agents alive at once at most"},
    {"agent-port-hold", T_UINT, O(agent_port_hold), "60", 0, 86400,
     "seconds after a start during which the ports of the agents the daemon before this one had "
     "(<shm-dir>/.moongate.agents) stay theirs: each agent gets its port back when it registers "
     "again, nobody else may have it meanwhile; 0: nothing is held"},
    {"peer-tls", T_BOOL, O(peer_tls), "true", 0, 1,
     "call peer daemons' control endpoints over TLS (false: h2c, for loopback and tests)"},
    {"peer-ca", T_STR, O(peer_ca), "", 0, 0,
     "CA of peer daemons: their server certificates when this daemon calls them (empty: the "
     "system store) and their client certificates when they call the peer API"},
    {"peer-cert", T_STR, O(peer_cert), "", 0, 0,
     "client certificate (PEM) this daemon presents to peers; empty: --tls-cert"},
    {"peer-key", T_STR, O(peer_key), "", 0, 0, "its private key; empty: --tls-key"},
    {"peer-allow", T_STR, O(peer_allow), "", 0, 0,
     "peer identities (certificate CN, DNS or URI names, comma-separated) that may call the "
     "peer API; empty: any certificate from --peer-ca"},
    {"peer-anonymous", T_BOOL, O(peer_anonymous), "false", 0, 1,
     "let callers without a peer certificate (h2c, Unix socket, any TLS client) use the peer "
     "API: for development and tests on loopback only"},
    {"max-transfer-requests", T_UINT, O(max_transfer_requests), "4096", 1, 1 << 20,
     "requests in one transfer batch at most"},
    {"tcp-conns-per-peer", T_UINT, O(tcp_conns_per_peer), "2", 1, 8,
     "data-plane connections one large request is spread over (parts of 16 MiB at least)"},
    {"tcp-congestion", T_STR, O(tcp_congestion), "", 0, 0,
     "TCP congestion control of the data plane's connections, e.g. cubic (as "
     "net.ipv4.tcp_congestion_control names them); empty: the system's. BBR paces every "
     "connection, which on low-latency links costs throughput (docs/operations.md)"},
    {"tcp-send-buffer", T_SIZE, O(tcp_send_buffer), "auto", 0, 1 * GiB,
     "bytes each data-plane connection may hold queued to send (SO_SNDBUF as the kernel counts "
     "it); 0: the kernel's autotuning; auto: on connections BBR paces, twice what 100 Gbit/s "
     "fills over the connection's RTT and at least 512K (docs/operations.md), else autotuning"},
    {"slice-bytes", T_SIZE, O(slice_bytes), "1M", 4096, 1 * GiB,
     "bytes per data-plane slice this daemon sends"},
    {"data-crc", T_BOOL, O(data_crc), "false", 0, 1, "CRC32C on every data-plane slice"},
    {"transfer-timeout", T_UINT, O(transfer_timeout), "300", 1, 86400,
     "seconds a transfer batch may take unless it asks for its own timeout"},
    {"notify-line", T_UINT, O(notify_line), "1024", 1, 1 << 20,
     "Send calls one connection may have waiting in line for one peer and topic (behind "
     "earlier notifications); more get RESOURCE_EXHAUSTED"},
    {"notify-queue", T_UINT, O(notify_queue), "1024", 1, 1 << 20,
     "notifications a topic holds for its readers at most"},
    {"notify-max-bytes", T_SIZE, O(notify_max_bytes), "64M", 65536, 64 * GiB,
     "payload bytes of notifications held for readers, all topics together"},
    {"max-expectations", T_UINT, O(max_expectations), "16384", 1, 1 << 20,
     "receivers' expectations (Notify/Expect) waiting at once at most"},
    {"peer-liveness-timeout", T_UINT, O(peer_liveness_timeout), "10000", 100, 3600000,
     "milliseconds a sender an expectation names may leave its probes unanswered before the "
     "expectation fails (SENDER_UNREACHABLE); probes go every quarter of it, 1 s apart at most"},
    {"trace-spans", T_UINT, O(trace_spans), "4096", 0, 1 << 20,
     "spans of sampled traces (W3C traceparent) kept for GET /traces on the ops port, newest "
     "replacing oldest; 0 keeps none (the log lines stay)"},
    {"batch-retention", T_UINT, O(batch_retention), "600", 1, 7 * 86400,
     "seconds a finished transfer batch stays readable"},
    {"max-batches", T_UINT, O(max_batches), "1024", 1, 1 << 20,
     "transfer batches kept (finished ones go oldest first)"},
    {"workers", T_UINT, O(workers), "4", 1, 256, "engine worker threads for blocking jobs"},
    {"io-threads", T_UINT, O(io_threads), "4", 1, 256,
     "transport threads: they move the slices of transfers to and from peers, apart from the "
     "workers (a large transfer does not hold up registrations and copies)"},
    {"ibverbs-lib", T_STR, O(ibverbs_lib), "libibverbs.so.1", 0, 0,
     "the verbs library loaded at start for RDMA (the daemon does not link it); empty: RDMA off"},
    {"rdma-devices", T_STR, O(rdma_devices), "", 0, 0,
     "RDMA devices to use, comma-separated (each must be present and have an active port); "
     "empty: every usable one"},
    {"rdma-gid-index", T_UINT, O(rdma_gid_index), "0", 0, 255,
     "GID table index for RoCE (the RoCE v2 entry of the node's address)"},
    {"rdma-qps-per-peer", T_UINT, O(rdma_qps_per_peer), "2", 1, 8,
     "RC queue pairs to each peer; a transfer's slices are spread over them"},
    {"require-rdma", T_BOOL, O(require_rdma), "false", 0, 1,
     "refuse to start without a usable RDMA device (otherwise TCP carries the bytes)"},
    {"queue-depth", T_UINT, O(queue_depth), "1024", 1, 1048576,
     "engine jobs queued or running at most; beyond it calls get RESOURCE_EXHAUSTED"},
    {"max-message-bytes", T_SIZE, O(max_message_bytes), "4M", 1024, 1 * GiB,
     "largest gRPC message accepted or sent (RESOURCE_EXHAUSTED beyond)"},
    {"max-concurrent-streams", T_UINT, O(max_concurrent_streams), "100", 1, 65536,
     "HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS per connection"},
    {"max-header-list-bytes", T_SIZE, O(max_header_list_bytes), "16K", 1024, 1 * MiB,
     "largest request header list (name + value + 32 per field)"},
    {"max-conn-output-bytes", T_SIZE, O(max_conn_output_bytes), "4M", 64 * KiB, 1 * GiB,
     "output buffered per connection before the daemon stops reading from it"},
    {"stream-window-bytes", T_SIZE, O(stream_window_bytes), "1M", 64 * KiB, 2 * GiB - 1,
     "HTTP/2 initial stream flow-control window"},
    {"conn-window-bytes", T_SIZE, O(conn_window_bytes), "16M", 64 * KiB, 2 * GiB - 1,
     "HTTP/2 connection flow-control window"},
    {"idle-timeout", T_UINT, O(idle_timeout), "300", 1, 86400,
     "seconds a connection without streams may stay open"},
    {"write-timeout", T_UINT, O(write_timeout), "30", 1, 3600,
     "seconds a connection may hold unsent bytes without the client reading any: then it is "
     "closed (a client that stops reading holds nothing longer)"},
    {"busy-poll-us", T_UINT, O(busy_poll_us), "0", 0, 100000,
     "after a connection delivers bytes, keep the loop polling without sleeping until this many "
     "microseconds pass without any: lower call latency for back-to-back calls (the thread's "
     "wake-up is saved) for a busy core while they come; 0: off"},
    {"handshake-timeout", T_UINT, O(handshake_timeout), "10", 1, 600,
     "seconds for the TLS handshake and the HTTP/2 preface"},
    {"grace", T_UINT, O(grace), "30", 0, 3600,
     "seconds SIGTERM/SIGINT waits for in-flight calls before closing connections"},
    {"max-continuations", T_UINT, O(max_continuations), "8", 1, 1024,
     "CONTINUATION frames allowed per header block (flood limit)"},
    {"reset-burst", T_UINT, O(reset_burst), "1000", 1, 1000000,
     "client RST_STREAM burst allowed before GOAWAY (rapid-reset limit)"},
    {"reset-rate", T_UINT, O(reset_rate), "33", 1, 1000000,
     "client RST_STREAM per second refilled into the burst"},
    {"max-watchers", T_UINT, O(max_watchers), "1024", 1, 1000000,
     "open Health/Watch streams at most"},
    {"log-level", T_STR, O(log_level), "info", 0, 0, "debug, info, warn or error"},
    {"access-log", T_BOOL, O(access_log), "true", 0, 1, "one log line per call"},
    {"debug-service", T_BOOL, O(debug_service), "false", 0, 1,
     "serve moongate.v1.Debug to admitted callers on every control listener, for tests and "
     "diagnosis only: Sleep, Echo and the streaming shapes, HoldRegistrations (holds "
     "registrations on their workers) and CorruptSlices (the data plane flips a byte of the "
     "next checksummed slices it serves); never on a daemon that serves real data"},
};
#define NOPTS (sizeof(opts) / sizeof(opts[0]))

int mg_config_parse_size(const char *s, uint64_t *out)
{
    char *end;
    uint64_t v, mult = 1;
    if (!isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0)
        return -1;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        mult = KiB;
        end++;
        break;
    case 'm':
    case 'M':
        mult = MiB;
        end++;
        break;
    case 'g':
    case 'G':
        mult = GiB;
        end++;
        break;
    default:
        return -1;
    }
    if (*end == 'i' && (end[1] == 'B' || end[1] == 'b'))
        end += 2;
    else if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0' || (v != 0 && mult > UINT64_MAX / v))
        return -1;
    *out = v * mult;
    return 0;
}

static const opt_def *find_opt(const char *name, size_t len)
{
    for (size_t i = 0; i < NOPTS; i++) {
        if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0)
            return &opts[i];
    }
    return NULL;
}

static int set_opt(mg_config *cfg, const opt_def *o, const char *val, const char *src, char *err,
                   size_t errcap)
{
    char *base = (char *)cfg;
    uint64_t v;

    switch (o->type) {
    case T_STR: {
        char **p = (char **)(base + o->offset);
        char *copy = strdup(val);
        if (copy == NULL) {
            snprintf(err, errcap, "out of memory");
            return -1;
        }
        free(*p);
        *p = copy;
        return 0;
    }
    case T_BOOL: {
        int *p = (int *)(base + o->offset);
        if (!strcmp(val, "true") || !strcmp(val, "1") || !strcmp(val, "yes") || !strcmp(val, "on"))
            *p = 1;
        else if (!strcmp(val, "false") || !strcmp(val, "0") || !strcmp(val, "no") ||
                 !strcmp(val, "off"))
            *p = 0;
        else {
            snprintf(err, errcap, "%s: --%s takes true or false, not \"%s\"", src, o->name, val);
            return -1;
        }
        return 0;
    }
    case T_MODE: {
        char *end;
        errno = 0;
        v = strtoull(val, &end, 8);
        if (*val < '0' || *val > '7' || *end != '\0' || errno != 0 || v > o->max) {
            snprintf(err, errcap, "%s: --%s takes octal permissions such as 0660, not \"%s\"", src,
                     o->name, val);
            return -1;
        }
        *(uint64_t *)(base + o->offset) = v;
        return 0;
    }
    case T_UINT:
    case T_SIZE: {
        char *end;
        int autos = !strcmp(o->def, "auto"); /* a size whose default is auto also takes it */
        if (autos && !strcmp(val, "auto")) {
            *(uint64_t *)(base + o->offset) = MG_CONFIG_AUTO;
            return 0;
        }
        if (o->type == T_SIZE) {
            if (mg_config_parse_size(val, &v) != 0) {
                snprintf(err, errcap, "%s: --%s takes %sa size such as 4M or 65536, not \"%s\"",
                         src, o->name, autos ? "auto or " : "", val);
                return -1;
            }
        } else {
            errno = 0;
            v = strtoull(val, &end, 10);
            if (!isdigit((unsigned char)*val) || *end != '\0' || errno != 0) {
                snprintf(err, errcap, "%s: --%s takes a whole number, not \"%s\"", src, o->name,
                         val);
                return -1;
            }
        }
        if (v < o->min || v > o->max) {
            snprintf(err, errcap, "%s: --%s=%s is outside %" PRIu64 "..%" PRIu64, src, o->name, val,
                     o->min, o->max);
            return -1;
        }
        *(uint64_t *)(base + o->offset) = v;
        return 0;
    }
    }
    return -1;
}

static char *trim(char *s)
{
    char *e;
    while (isspace((unsigned char)*s))
        s++;
    e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

static int load_file(mg_config *cfg, const char *path, char *err, size_t errcap)
{
    char line[4096];
    unsigned lineno = 0;
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errcap, "--config %s: %s", path, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof(line), f)) {
        char src[512], *s, *eq, *key, *val;
        const opt_def *o;
        lineno++;
        s = trim(line);
        if (*s == '\0' || *s == '#')
            continue;
        eq = strchr(s, '=');
        snprintf(src, sizeof(src), "%s line %u", path, lineno);
        if (eq == NULL) {
            snprintf(err, errcap, "%s: expected `name = value`", src);
            goto fail;
        }
        *eq = '\0';
        key = trim(s);
        val = trim(eq + 1);
        if (strlen(val) >= 2 && val[0] == '"' && val[strlen(val) - 1] == '"') {
            val[strlen(val) - 1] = '\0';
            val++;
        }
        o = find_opt(key, strlen(key));
        if (o == NULL || !strcmp(key, "config")) {
            snprintf(err, errcap, "%s: unknown option \"%s\"", src, key);
            goto fail;
        }
        if (set_opt(cfg, o, val, src, err, errcap) != 0)
            goto fail;
    }
    fclose(f);
    return 0;
fail:
    fclose(f);
    return -1;
}

static void env_name(char *dst, size_t cap, const char *name)
{
    size_t o = (size_t)snprintf(dst, cap, "MOONGATE_");
    for (; *name && o + 1 < cap; name++)
        dst[o++] = *name == '-' ? '_' : (char)toupper((unsigned char)*name);
    dst[o] = '\0';
}

void mg_config_help(FILE *out)
{
    fprintf(out, "Usage: moongate [OPTIONS]\n\n"
                 "moongate is a node-local memory-transfer gateway: clients call it over HTTP/2\n"
                 "(gRPC, or JSON with curl) to register memory, lease buffers and move bytes\n"
                 "between nodes.\n\n"
                 "Every option is also read from the environment (MOONGATE_NAME) and from the\n"
                 "config file (`name = value`); flags win over the environment, which wins over\n"
                 "the file. Sizes take K, M or G (binary) suffixes.\n\n");
    for (size_t i = 0; i < NOPTS; i++) {
        char env[64];
        const char *kind = opts[i].type == T_BOOL   ? ""
                           : opts[i].type == T_MODE ? " MODE"
                           : opts[i].type == T_SIZE ? " SIZE"
                           : opts[i].type == T_UINT ? " N"
                                                    : " VALUE";
        env_name(env, sizeof(env), opts[i].name);
        fprintf(out, "  --%s%s\n      %s\n      env %s; default \"%s\"", opts[i].name, kind,
                opts[i].help, env, opts[i].def);
        if (opts[i].type == T_UINT || opts[i].type == T_SIZE)
            fprintf(out, "; range %" PRIu64 "..%" PRIu64, opts[i].min, opts[i].max);
        fputc('\n', out);
    }
    fprintf(out, "  --help     print this help and exit\n  --version  print the version and "
                 "exit\n\nSignals: SIGTERM or SIGINT drain gracefully within --grace seconds.\n");
}

int mg_config_tenant_pools(const char *s, mg_tenant_pool *out, int max, char *err, size_t errcap)
{
    char buf[4096], *save = NULL, *tok;
    int n = 0;
    if (s == NULL || *s == '\0')
        return 0;
    if (strlen(s) >= sizeof(buf)) {
        snprintf(err, errcap, "too long");
        return -1;
    }
    snprintf(buf, sizeof(buf), "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        size_t tl = eq ? (size_t)(eq - tok) : 0;
        if (eq == NULL || tl == 0 || tl >= sizeof(out[0].tenant)) {
            snprintf(err, errcap, "\"%.64s\" is not TENANT=BYTES", tok);
            return -1;
        }
        for (size_t i = 0; i < tl; i++) {
            char c = tok[i];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-' || c == ':')) {
                snprintf(err, errcap, "tenant \"%.*s\" is not [A-Za-z0-9._:-]", (int)tl, tok);
                return -1;
            }
        }
        if (n >= max) {
            snprintf(err, errcap, "more than %d tenant pools", max);
            return -1;
        }
        memcpy(out[n].tenant, tok, tl);
        out[n].tenant[tl] = '\0';
        for (int k = 0; k < n; k++) {
            if (strcmp(out[k].tenant, out[n].tenant) == 0) {
                snprintf(err, errcap, "tenant \"%s\" has two pools", out[n].tenant);
                return -1;
            }
        }
        if (mg_config_parse_size(eq + 1, &out[n].bytes) != 0 || out[n].bytes == 0 ||
            out[n].bytes % 4096 || out[n].bytes > (1ULL << 43)) {
            snprintf(err, errcap, "\"%.64s\": bytes must be a multiple of 4096, 4K..8T", eq + 1);
            return -1;
        }
        n++;
    }
    return n;
}

int mg_config_group(const char *name, unsigned *gid)
{
    char buf[4096], *end;
    struct group gr, *found = NULL;
    unsigned long n = strtoul(name, &end, 10);
    if (*name && *end == '\0' && n < 0xffffffffUL) {
        *gid = (unsigned)n;
        return 0;
    }
    if (getgrnam_r(name, &gr, buf, sizeof(buf), &found) != 0 || found == NULL)
        return -1;
    *gid = (unsigned)gr.gr_gid;
    return 0;
}

int mg_config_memlock(const char *s)
{
    static const char *const names[] = {"off", "try", "require"};
    for (int i = 0; i < 3; i++) {
        if (strcmp(s, names[i]) == 0)
            return i;
    }
    return -1;
}

void mg_config_free(mg_config *cfg)
{
    char *base = (char *)cfg;
    for (size_t i = 0; i < NOPTS; i++) {
        if (opts[i].type == T_STR) {
            free(*(char **)(base + opts[i].offset));
            *(char **)(base + opts[i].offset) = NULL;
        }
    }
}

/* --advertise with each $(VAR) replaced by the environment variable VAR, and each
 * $(VAR:dashed) by the same with '.' and ':' turned into '-' (how cluster DNS names a pod's
 * address: 10.1.2.3 -> 10-1-2-3). A variable that is not set, or an unclosed $(, is an error. */
static int expand_advertise(mg_config *cfg, char *err, size_t errcap)
{
    char out[512], name[128];
    const char *p = cfg->advertise;
    size_t o = 0;
    while (*p) {
        const char *end, *val, *colon;
        size_t len;
        int dashed = 0;
        if (p[0] != '$' || p[1] != '(') {
            if (o + 1 >= sizeof(out))
                goto too_long;
            out[o++] = *p++;
            continue;
        }
        end = strchr(p + 2, ')');
        len = end ? (size_t)(end - p - 2) : 0;
        if (end == NULL || len == 0 || len >= sizeof(name)) {
            snprintf(err, errcap, "--advertise: \"%s\" has a $( without a variable and a )",
                     cfg->advertise);
            return -1;
        }
        memcpy(name, p + 2, len);
        name[len] = '\0';
        if ((colon = strchr(name, ':')) != NULL) {
            if (strcmp(colon, ":dashed") != 0) {
                snprintf(err, errcap, "--advertise: $(%s): the only form after ':' is dashed",
                         name);
                return -1;
            }
            name[colon - name] = '\0';
            dashed = 1;
        }
        val = getenv(name);
        if (val == NULL || val[0] == '\0') {
            snprintf(err, errcap,
                     "--advertise: $(%s) names an environment variable that is not set "
                     "(Kubernetes: an env entry from fieldRef status.podIP)",
                     name);
            return -1;
        }
        for (; *val; val++) {
            if (o + 1 >= sizeof(out))
                goto too_long;
            out[o++] = dashed && (*val == '.' || *val == ':') ? '-' : *val;
        }
        p = end + 1;
    }
    out[o] = '\0';
    free(cfg->advertise);
    cfg->advertise = strdup(out);
    if (cfg->advertise == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    return 0;
too_long:
    snprintf(err, errcap, "--advertise: longer than %zu bytes once expanded", sizeof(out) - 1);
    return -1;
}

int mg_config_load(mg_config *cfg, int argc, char **argv, FILE *out, char *err, size_t errcap)
{
    const char *config_path = NULL;
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < NOPTS; i++) {
        if (set_opt(cfg, &opts[i], opts[i].def, "default", err, errcap) != 0)
            return MG_CONFIG_ERROR;
    }
    /* The config file's own path: command line, then environment. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            mg_config_help(out);
            return MG_CONFIG_EXIT;
        }
        if (!strcmp(argv[i], "--version")) {
            fprintf(out, "moongate %s\n", MG_VERSION);
            return MG_CONFIG_EXIT;
        }
        if (!strncmp(argv[i], "--config=", 9))
            config_path = argv[i] + 9;
        else if (!strcmp(argv[i], "--config") && i + 1 < argc)
            config_path = argv[i + 1];
    }
    if (config_path == NULL)
        config_path = getenv("MOONGATE_CONFIG");
    if (config_path && *config_path) {
        if (set_opt(cfg, &opts[0], config_path, "--config", err, errcap) != 0 ||
            load_file(cfg, config_path, err, errcap) != 0)
            return MG_CONFIG_ERROR;
    }
    for (size_t i = 0; i < NOPTS; i++) {
        char env[64], src[80];
        const char *v;
        env_name(env, sizeof(env), opts[i].name);
        v = getenv(env);
        snprintf(src, sizeof(src), "environment %s", env);
        if (v && set_opt(cfg, &opts[i], v, src, err, errcap) != 0)
            return MG_CONFIG_ERROR;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq, *val;
        const opt_def *o;
        size_t nlen;
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errcap, "unexpected argument \"%s\" (see --help)", a);
            return MG_CONFIG_ERROR;
        }
        a += 2;
        eq = strchr(a, '=');
        nlen = eq ? (size_t)(eq - a) : strlen(a);
        o = find_opt(a, nlen);
        if (o == NULL) {
            snprintf(err, errcap, "unknown option \"--%.*s\" (see --help)", (int)nlen, a);
            return MG_CONFIG_ERROR;
        }
        if (eq) {
            val = eq + 1;
        } else if (o->type == T_BOOL) {
            val = "true";
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            snprintf(err, errcap, "--%s needs a value", o->name);
            return MG_CONFIG_ERROR;
        }
        if (set_opt(cfg, o, val, "command line", err, errcap) != 0)
            return MG_CONFIG_ERROR;
    }
    if ((*cfg->tls_cert == '\0') != (*cfg->tls_key == '\0')) {
        snprintf(err, errcap, "--tls-cert and --tls-key go together");
        return MG_CONFIG_ERROR;
    }
    if ((*cfg->peer_cert == '\0') != (*cfg->peer_key == '\0')) {
        snprintf(err, errcap, "--peer-cert and --peer-key go together");
        return MG_CONFIG_ERROR;
    }
    if (strstr(cfg->advertise, "$(") && expand_advertise(cfg, err, errcap) != 0)
        return MG_CONFIG_ERROR;
    cfg->data_tcp.congestion = cfg->tcp_congestion;
    cfg->data_tcp.send_buffer = cfg->tcp_send_buffer == MG_CONFIG_AUTO
                                    ? MG_DP_SEND_BUFFER_AUTO
                                    : (uint32_t)cfg->tcp_send_buffer;
    return MG_CONFIG_OK;
}
