/*
 * bench_lease: what a read's destination memory costs — registering a fresh segment for it
 * (register, use, unregister) against leasing a slice of the pre-registered pool (acquire,
 * release) — through the real gRPC API with the C client library, one persistent h2c
 * connection, one call at a time; plus the in-process cost of a pool acquire + release.
 *
 *   bench_lease --target ADDR [--prefault] [--busy-poll US]   (a daemon with a pool runs there)
 *   bench_lease --target ADDR --contention [--clients N] [--seconds S]
 *
 * Prints, for each read shape (keys x bytes), the p50/p99 of both paths and their ratio, and as
 * the floor any acquire + release pair pays, the median of two plain round trips over the same
 * kind of socket (an epoll echo child, 100-byte messages) measured in the same run. With
 * --contention: N clients (connections) on one loop acquire (blocking) and release leases of
 * random sizes as fast as they can against the daemon's pool — meant to be small — and it prints
 * the pairs per second, how often the pool made an acquire wait, and the acquire latencies.
 */
#include "mg_client.h"

#include "moongate/pool.h"
#include "moongate/segment.h"
#include "moongate/v1/memory.pb-c.h"
#include "moongate/v1/pool.pb-c.h"

#include <errno.h>
#include <event2/event.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int status;
    uint8_t *resp;
    size_t len;
    char message[256];
} call_rec;

/* One unary call on the persistent connection; exits on failure. */
static void call(mg_client *c, const char *path, const ProtobufCMessage *req, call_rec *r)
{
    uint8_t buf[512];
    size_t n = protobuf_c_message_pack(req, buf);
    if (mg_client_call(c, path, buf, n, 60000, &r->resp, &r->len, &r->status, r->message,
                       sizeof(r->message)) != 0 ||
        r->status != 0) {
        fprintf(stderr, "bench_lease: %s: status %d: %s\n", path, r->status, r->message);
        exit(1);
    }
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    size_t i = (size_t)(p * (double)n);
    return v[i < n ? i : n - 1];
}

/* (a) register a segment of `size`, unregister it: `count` times. Fills us[] per read. */
/* The floor: median round trip of 100 bytes to an echo child over the target's kind of socket
 * (TCP loopback, or a Unix socket pair for "unix:" targets). Both ends wait in epoll_wait as
 * the daemon and the client library do, or with `poll` they spin on non-blocking reads as
 * --busy-poll-us and mg_client_options.busy_poll_us do. */
static double round_trip_us(int unix_socket, int poll)
{
    enum { N = 20000 };
    int sv[2], one = 1, ep;
    double *us = calloc(N, sizeof(double)), p50;
    char buf[100] = {0};
    pid_t child;
    struct epoll_event ev = {.events = EPOLLIN};

    if (unix_socket) {
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
            return -1;
    } else {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
        socklen_t al = sizeof(a);
        int l = socket(AF_INET, SOCK_STREAM, 0);
        if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(l, 1) != 0 ||
            getsockname(l, (struct sockaddr *)&a, &al) != 0)
            return -1;
        sv[0] = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(sv[0], (struct sockaddr *)&a, sizeof(a)) != 0)
            return -1;
        sv[1] = accept(l, NULL, NULL);
        close(l);
        setsockopt(sv[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        setsockopt(sv[1], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    child = fork();
    if (child == 0) { /* echo */
        int cep = epoll_create1(0);
        close(sv[0]);
        epoll_ctl(cep, EPOLL_CTL_ADD, sv[1], &ev);
        for (;;) {
            ssize_t n;
            if (!poll)
                epoll_wait(cep, &ev, 1, -1);
            n = recv(sv[1], buf, sizeof(buf), MSG_DONTWAIT);
            if (n < 0 && errno == EAGAIN)
                continue;
            if (n <= 0 || write(sv[1], buf, (size_t)n) != n)
                _exit(0);
        }
    }
    close(sv[1]);
    ep = epoll_create1(0);
    epoll_ctl(ep, EPOLL_CTL_ADD, sv[0], &ev);
    for (int i = 0; i < N; i++) {
        double t0 = now_us();
        size_t got = 0;
        if (write(sv[0], buf, sizeof(buf)) != (ssize_t)sizeof(buf))
            break;
        while (got < sizeof(buf)) {
            ssize_t n;
            if (!poll)
                epoll_wait(ep, &ev, 1, -1);
            n = recv(sv[0], buf, sizeof(buf) - got, MSG_DONTWAIT);
            if (n < 0 && errno == EAGAIN)
                continue;
            if (n <= 0)
                break;
            got += (size_t)n;
        }
        us[i] = now_us() - t0;
    }
    close(sv[0]);
    close(ep);
    waitpid(child, NULL, 0);
    qsort(us, N, sizeof(double), cmp_double);
    p50 = pct(us, N, 0.5);
    free(us);
    return p50;
}

static void register_per_read(mg_client *c, uint64_t size, size_t count, int prefault, double *us)
{
    for (size_t i = 0; i < count; i++) {
        Moongate__V1__RegisterRequest rr = MOONGATE__V1__REGISTER_REQUEST__INIT;
        Moongate__V1__UnregisterRequest ur = MOONGATE__V1__UNREGISTER_REQUEST__INIT;
        Moongate__V1__RegisterResponse *resp;
        call_rec r;
        char name[32];
        double t0 = now_us();
        snprintf(name, sizeof(name), "read-%zu", i);
        rr.name = name;
        rr.size = size;
        rr.prefault = prefault;
        call(c, "/moongate.v1.Memory/RegisterSegment", &rr.base, &r);
        resp = moongate__v1__register_response__unpack(NULL, r.len, r.resp);
        ur.id = resp->segment->id;
        moongate__v1__register_response__free_unpacked(resp, NULL);
        free(r.resp);
        call(c, "/moongate.v1.Memory/UnregisterSegment", &ur.base, &r);
        free(r.resp);
        us[i] = now_us() - t0;
    }
}

/* (b) acquire a lease of `size`, release it: `count` times. */
static void lease_per_read(mg_client *c, uint64_t size, size_t count, double *us)
{
    for (size_t i = 0; i < count; i++) {
        Moongate__V1__AcquireLeaseRequest ar = MOONGATE__V1__ACQUIRE_LEASE_REQUEST__INIT;
        Moongate__V1__ReleaseLeaseRequest rl = MOONGATE__V1__RELEASE_LEASE_REQUEST__INIT;
        Moongate__V1__Lease *lease;
        call_rec r;
        double t0 = now_us();
        ar.size = size;
        call(c, "/moongate.v1.Pool/AcquireLease", &ar.base, &r);
        lease = moongate__v1__lease__unpack(NULL, r.len, r.resp);
        rl.id = lease->id;
        moongate__v1__lease__free_unpacked(lease, NULL);
        free(r.resp);
        call(c, "/moongate.v1.Pool/ReleaseLease", &rl.base, &r);
        free(r.resp);
        us[i] = now_us() - t0;
    }
}

/* (c) the pool alone, in this process: acquire + release, ns per pair. */
static double in_process_ns(const char *shm_dir, uint64_t size, size_t iterations)
{
    mg_registry_config rc = {.shm_dir = shm_dir, .file_mode = 0600, .max_segments = 4};
    mg_segment_spec spec = {
        .tenant = "bench", .name = "pool", .source = MG_SEG_ANON, .size = 64ULL << 20};
    mg_pool_config pc = {
        .name = "bench", .lease_bytes = 64ULL << 20, .max_leases = 1024, .max_ttl_ms = 60000};
    mg_registry *reg;
    mg_segment *seg, *held;
    mg_segment_info info;
    mg_pool *pool;
    mg_lease *l;
    char err[MG_SEG_ERROR_MAX];
    double t0, t1;
    if (mg_registry_new(&reg, &rc) != 0 || mg_registry_reserve(reg, &spec, &seg, err) != 0) {
        fprintf(stderr, "bench_lease: cannot open a registry in %s\n", shm_dir);
        exit(1);
    }
    mg_registry_commit(reg, seg, mg_segment_map(seg));
    mg_segment_get_info(reg, seg, &info);
    if (mg_registry_acquire(reg, "bench", info.id, "bench", &held) != 0 ||
        mg_pool_new(&pool, reg, held, &pc) != 0) {
        fprintf(stderr, "bench_lease: cannot make a pool\n");
        exit(1);
    }
    t0 = now_us();
    for (size_t i = 0; i < iterations; i++) {
        if (mg_pool_acquire(pool, "bench", size, 0, 1000, 0, NULL, &l, err) != 0)
            exit(1);
        mg_pool_release(pool, l);
    }
    t1 = now_us();
    mg_pool_del(pool);
    mg_registry_del(reg);
    return (t1 - t0) * 1e3 / (double)iterations;
}

/* ---- contention: N clients, each acquire (blocking) -> release -> acquire ... ---- */

typedef struct contender {
    mg_client *c;
    struct event_base *base;
    uint64_t rng;
    double t0;
    double *lat_us;
    size_t nlat, cap;
    uint64_t pairs;
    int *stop;
    int failed;
    uint8_t *resp;
    size_t len;
} contender;

static void contender_next(contender *k);

static void contender_msg(mg_rpc *rpc, const uint8_t *m, size_t len, void *arg)
{
    contender *k = arg;
    free(k->resp);
    k->resp = malloc(len ? len : 1);
    memcpy(k->resp, m, len);
    k->len = len;
}

static void release_closed(mg_rpc *rpc, int status, const char *message, void *arg)
{
    contender *k = arg;
    if (status != 0) {
        fprintf(stderr, "bench_lease: release: %s\n", message);
        k->failed = 1;
    }
    k->pairs++;
    contender_next(k);
}

static void acquire_closed(mg_rpc *rpc, int status, const char *message, void *arg)
{
    static const mg_rpc_handlers rel = {contender_msg, release_closed};
    contender *k = arg;
    Moongate__V1__Lease *lease;
    Moongate__V1__ReleaseLeaseRequest rl = MOONGATE__V1__RELEASE_LEASE_REQUEST__INIT;
    uint8_t buf[64];
    mg_rpc *r;
    if (status != 0 || (lease = moongate__v1__lease__unpack(NULL, k->len, k->resp)) == NULL) {
        fprintf(stderr, "bench_lease: acquire: %s\n", message);
        k->failed = 1;
        return;
    }
    if (k->nlat < k->cap)
        k->lat_us[k->nlat++] = now_us() - k->t0;
    rl.id = lease->id;
    moongate__v1__lease__free_unpacked(lease, NULL);
    r = mg_rpc_start(k->c, "/moongate.v1.Pool/ReleaseLease", NULL, 0, 60000, &rel, k);
    if (r == NULL || mg_rpc_send(r, buf, protobuf_c_message_pack(&rl.base, buf)) != 0 ||
        mg_rpc_close_send(r) != 0)
        k->failed = 1;
}

static void contender_next(contender *k)
{
    static const mg_rpc_handlers acq = {contender_msg, acquire_closed};
    Moongate__V1__AcquireLeaseRequest ar = MOONGATE__V1__ACQUIRE_LEASE_REQUEST__INIT;
    uint8_t buf[64];
    mg_rpc *r;
    if (*k->stop || k->failed)
        return;
    k->rng ^= k->rng << 13;
    k->rng ^= k->rng >> 7;
    k->rng ^= k->rng << 17;
    ar.size = (64u << 10) + k->rng % (4u << 20); /* 64 KiB .. 4 MiB + 64 KiB */
    ar.block = 1;
    k->t0 = now_us();
    r = mg_rpc_start(k->c, "/moongate.v1.Pool/AcquireLease", NULL, 0, 60000, &acq, k);
    if (r == NULL || mg_rpc_send(r, buf, protobuf_c_message_pack(&ar.base, buf)) != 0 ||
        mg_rpc_close_send(r) != 0)
        k->failed = 1;
}

static void stop_cb(evutil_socket_t fd, short what, void *arg)
{
    *(int *)arg = 1;
}

static void finish_cb(evutil_socket_t fd, short what, void *arg)
{
    event_base_loopbreak(arg);
}

static int contention(const char *target, unsigned clients, unsigned seconds)
{
    struct event_base *base = event_base_new();
    contender *ks = calloc(clients, sizeof(*ks));
    mg_client_options o = {.target = target};
    struct timeval run = {(time_t)seconds, 0}, settle = {(time_t)seconds + 5, 0};
    int stop = 0, failed = 0;
    uint64_t pairs = 0;
    size_t total = 0;
    double *all, t0;
    char err[256];
    call_rec r;
    Moongate__V1__PoolStatsRequest sr = MOONGATE__V1__POOL_STATS_REQUEST__INIT;
    Moongate__V1__PoolStatsResponse *before, *after;
    mg_client *probe;

    if (mg_client_new(&probe, base, &o, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench_lease: %s\n", err);
        return 1;
    }
    call(probe, "/moongate.v1.Pool/PoolStats", &sr.base, &r);
    before = moongate__v1__pool_stats_response__unpack(NULL, r.len, r.resp);
    free(r.resp);
    for (unsigned i = 0; i < clients; i++) {
        ks[i].base = base;
        ks[i].rng = 0x9e3779b97f4a7c15ULL * (i + 1);
        ks[i].cap = 1u << 22;
        ks[i].lat_us = malloc(ks[i].cap * sizeof(double));
        ks[i].stop = &stop;
        if (mg_client_new(&ks[i].c, base, &o, err, sizeof(err)) != 0) {
            fprintf(stderr, "bench_lease: %s\n", err);
            return 1;
        }
    }
    t0 = now_us();
    for (unsigned i = 0; i < clients; i++)
        contender_next(&ks[i]);
    event_base_once(base, -1, EV_TIMEOUT, stop_cb, &stop, &run);
    event_base_once(base, -1, EV_TIMEOUT, finish_cb, base, &settle);
    event_base_dispatch(base); /* the calls in flight at the stop end within the settle time */
    call(probe, "/moongate.v1.Pool/PoolStats", &sr.base, &r);
    after = moongate__v1__pool_stats_response__unpack(NULL, r.len, r.resp);
    free(r.resp);
    for (unsigned i = 0; i < clients; i++) {
        pairs += ks[i].pairs;
        total += ks[i].nlat;
        failed |= ks[i].failed;
    }
    all = malloc((total ? total : 1) * sizeof(double));
    total = 0;
    for (unsigned i = 0; i < clients; i++) {
        memcpy(all + total, ks[i].lat_us, ks[i].nlat * sizeof(double));
        total += ks[i].nlat;
        mg_client_del(ks[i].c);
        free(ks[i].lat_us);
        free(ks[i].resp);
    }
    qsort(all, total, sizeof(double), cmp_double);
    printf("Contention: %u clients acquiring (block) and releasing 64 KiB..4 MiB leases for %u s "
           "against a pool of %" PRIu64 " bytes\n",
           clients, seconds, after->pools[0]->capacity);
    printf("pairs/s %.0f   acquires that waited %" PRIu64 " of %zu   acquire latency us: p50 %.1f "
           "p90 %.1f p99 %.1f max %.1f\n",
           (double)pairs / ((now_us() - t0) / 1e6 < seconds ? (now_us() - t0) / 1e6 : seconds),
           after->pools[0]->exhausted_total - before->pools[0]->exhausted_total, total,
           pct(all, total, 0.5), pct(all, total, 0.9), pct(all, total, 0.99),
           total ? all[total - 1] : 0.0);
    moongate__v1__pool_stats_response__free_unpacked(before, NULL);
    moongate__v1__pool_stats_response__free_unpacked(after, NULL);
    mg_client_del(probe);
    free(all);
    free(ks);
    event_base_free(base);
    return failed;
}

int main(int argc, char **argv)
{
    static const struct {
        size_t keys;
        uint64_t bytes;
    } shapes[] = {{1024, 1u << 20}, {64, 16u << 20}, {16384, 64u << 10}};
    const char *target = "127.0.0.1:7444";
    char shm_dir[64] = "/dev/shm/mg-bench-lease-XXXXXX";
    int prefault = 0, contend = 0, lease_only = 0;
    size_t pairs = 0; /* --pairs N: that many 64 KiB pairs alone (for profiling the path) */
    double floor_us;
    unsigned clients = 4, seconds = 10;
    struct event_base *base = event_base_new();
    mg_client_options o = {0};
    mg_client *c;
    char err[256];

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--target") && i + 1 < argc)
            target = argv[++i];
        else if (!strcmp(argv[i], "--prefault"))
            prefault = 1;
        else if (!strcmp(argv[i], "--contention"))
            contend = 1;
        else if (!strcmp(argv[i], "--lease-only"))
            lease_only = 1;
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            lease_only = 1, pairs = (size_t)strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--busy-poll") && i + 1 < argc)
            o.busy_poll_us = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--clients") && i + 1 < argc)
            clients = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = (unsigned)atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: bench_lease --target ADDR [--prefault | --lease-only | "
                    "--pairs N] [--busy-poll US] | --contention [--clients N] [--seconds S]\n");
            return 64;
        }
    }
    if (contend)
        return contention(target, clients ? clients : 4, seconds ? seconds : 10);
    if (mkdtemp(shm_dir) == NULL) { /* a private directory for the in-process pool */
        perror("bench_lease: mkdtemp");
        return 1;
    }
    o.target = target;
    if (mg_client_new(&c, base, &o, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench_lease: %s\n", err);
        return 1;
    }
    floor_us = 2 * round_trip_us(strncmp(target, "unix:", 5) == 0, o.busy_poll_us > 0);
    printf("Destination memory for a read, through gRPC (C client, one connection to %s, one call "
           "at a time%s)\n",
           target, o.busy_poll_us ? ", busy-polling the reply" : "");
    printf("register = RegisterSegment%s + UnregisterSegment; lease = AcquireLease + "
           "ReleaseLease (microseconds per read)\n",
           prefault ? " (prefault)" : "");
    printf("floor = two plain 100-byte round trips over the same kind of socket%s, same run: "
           "%.1f us\n\n",
           o.busy_poll_us ? ", both ends polling" : "", floor_us);
    if (lease_only) { /* the gRPC path alone: quick to re-run while tuning it */
        for (size_t s = pairs ? 2 : 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            size_t n = pairs ? pairs : shapes[s].keys;
            double *lease_us = calloc(n, sizeof(double));
            lease_per_read(c, shapes[s].bytes, n, lease_us);
            qsort(lease_us, n, sizeof(double), cmp_double);
            printf("%zu x %" PRIu64 " KiB: lease p50 %.1f us (%.2fx floor), p99 %.1f us\n", n,
                   shapes[s].bytes >> 10, pct(lease_us, n, 0.5), pct(lease_us, n, 0.5) / floor_us,
                   pct(lease_us, n, 0.99));
            free(lease_us);
        }
        mg_client_del(c);
        event_base_loop(base, EVLOOP_NONBLOCK);
        event_base_free(base);
        rmdir(shm_dir);
        return 0;
    }
    printf("%-18s %12s %12s %12s %12s %10s %12s %14s\n", "read", "register p50", "register p99",
           "lease p50", "lease p99", "p50 ratio", "lease/floor", "in-process ns");
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        size_t n = shapes[s].keys;
        double *reg_us = calloc(n, sizeof(double)), *lease_us = calloc(n, sizeof(double));
        double ns;
        char label[64];
        register_per_read(c, shapes[s].bytes, n, prefault, reg_us);
        lease_per_read(c, shapes[s].bytes, n, lease_us);
        ns = in_process_ns(shm_dir, shapes[s].bytes, 1000000);
        qsort(reg_us, n, sizeof(double), cmp_double);
        qsort(lease_us, n, sizeof(double), cmp_double);
        snprintf(label, sizeof(label), "%zu x %" PRIu64 " KiB", n, shapes[s].bytes >> 10);
        printf("%-18s %12.1f %12.1f %12.1f %12.1f %9.1fx %11.2fx %14.1f\n", label,
               pct(reg_us, n, 0.5), pct(reg_us, n, 0.99), pct(lease_us, n, 0.5),
               pct(lease_us, n, 0.99), pct(reg_us, n, 0.5) / pct(lease_us, n, 0.5),
               pct(lease_us, n, 0.5) / floor_us, ns);
        fflush(stdout);
        free(reg_us);
        free(lease_us);
    }
    mg_client_del(c);
    event_base_free(base);
    rmdir(shm_dir);
    return 0;
}
