/*
 * mgbench: a load generator for moongate built on the C client library. It keeps `--streams`
 * unary calls in flight on each of `--conns` connections until `--requests` calls finished, then
 * prints requests/s, latency percentiles and the status codes it saw. One thread, one event
 * loop: the library's calls multiplexed on HTTP/2 connections.
 *
 *   mgbench [--target ADDR] [--tls|--plaintext] [--ca FILE] [--conns C] [--streams M]
 *           [--requests N] [--method /pkg.Service/Method] [--json]
 *   mgbench transfer ...   (transfers between two daemons: mgbench_transfer.c)
 *   mgbench vram ...       (GPU memory moved through moongate: mgbench_vram.c)
 *
 * The request is an empty message (Health/Check asks for the daemon's own status). Exit status
 * 0 when every call ended OK, 1 otherwise, 64 for usage errors.
 */
#include "mgbench.h"

#include "mg_client.h"
#include "mg_time.h"

#include <event2/event.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXIT_USAGE 64

typedef struct bench bench;

typedef struct {
    bench *b;
    mg_client *client;
    unsigned in_flight;
} conn_state;

struct bench {
    struct event_base *base;
    const char *method;
    uint64_t requests, started, finished;
    unsigned streams;
    uint64_t codes[MG_GRPC_CODE_COUNT];
    double *latency_ms;
    conn_state *conns;
    unsigned nconns;
    char first_error[256];
};

typedef struct {
    conn_state *cs;
    struct timespec t0;
} call_ctx;

static double now_ms(void)
{
    return (double)mg_now_mono_ns() / 1e6;
}

static void start_calls(conn_state *cs);

static void on_close(mg_rpc *rpc, int status, const char *message, void *arg)
{
    call_ctx *c = arg;
    conn_state *cs = c->cs;
    bench *b = cs->b;
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (b->finished < b->requests)
        b->latency_ms[b->finished] =
            (double)(t1.tv_sec - c->t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - c->t0.tv_nsec) / 1e6;
    b->finished++;
    b->codes[status >= 0 && status < MG_GRPC_CODE_COUNT ? status : MG_GRPC_UNKNOWN]++;
    if (status != MG_GRPC_OK && b->first_error[0] == '\0')
        snprintf(b->first_error, sizeof(b->first_error), "%s: %s", mg_grpc_code_name(status),
                 message);
    cs->in_flight--;
    free(c);
    if (b->finished == b->requests)
        event_base_loopbreak(b->base);
    else
        start_calls(cs);
}

static const mg_rpc_handlers handlers = {NULL, on_close};

static void start_calls(conn_state *cs)
{
    bench *b = cs->b;
    while (cs->in_flight < b->streams && b->started < b->requests) {
        call_ctx *c = malloc(sizeof(*c));
        mg_rpc *rpc;
        if (c == NULL)
            return;
        c->cs = cs;
        clock_gettime(CLOCK_MONOTONIC, &c->t0);
        rpc = mg_rpc_start(cs->client, b->method, NULL, 0, 30000, &handlers, c);
        if (rpc == NULL) {
            free(c);
            /* The connection failed: count the calls it can no longer make. */
            while (b->started < b->requests && cs->in_flight == 0) {
                b->started++;
                b->finished++;
                b->codes[MG_GRPC_UNAVAILABLE]++;
            }
            if (b->finished == b->requests)
                event_base_loopbreak(b->base);
            return;
        }
        b->started++;
        cs->in_flight++;
        mg_rpc_send(rpc, (const uint8_t *)"", 0);
        mg_rpc_close_send(rpc);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage(FILE *f)
{
    fprintf(f, "Usage: mgbench [--target ADDR] [--tls|--plaintext] [--ca FILE] [--conns C]\n"
               "               [--streams M] [--requests N] [--method PATH] [--json]\n"
               "Defaults: unix:/run/moongate/moongate.sock, 4 connections, 32 streams each,\n"
               "100000 requests, /grpc.health.v1.Health/Check.\n"
               "       mgbench transfer --help   (transfers between two daemons)\n"
               "       mgbench vram --help       (GPU memory moved through moongate)\n");
}

int main(int argc, char **argv)
{
    bench b;
    mg_client_options o;
    int tls = -1, json = 0;
    double t0, secs;
    char err[256];

    signal(SIGPIPE, SIG_IGN);
    if (argc > 1 && !strcmp(argv[1], "transfer"))
        return mgbench_transfer_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "vram"))
        return mgbench_vram_main(argc - 1, argv + 1);
    memset(&b, 0, sizeof(b));
    memset(&o, 0, sizeof(o));
    o.target =
        getenv("MOONGATE_TARGET") ? getenv("MOONGATE_TARGET") : "unix:/run/moongate/moongate.sock";
    o.ca_file = getenv("MOONGATE_CA");
    b.method = "/grpc.health.v1.Health/Check";
    b.requests = 100000;
    b.streams = 32;
    b.nconns = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tls")) {
            tls = 1;
        } else if (!strcmp(a, "--plaintext")) {
            tls = 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (v && !strcmp(a, "--target")) {
            o.target = v, i++;
        } else if (v && !strcmp(a, "--ca")) {
            o.ca_file = v, i++;
        } else if (v && !strcmp(a, "--method")) {
            b.method = v, i++;
        } else if (v && !strcmp(a, "--conns")) {
            b.nconns = (unsigned)strtoul(v, NULL, 10), i++;
        } else if (v && !strcmp(a, "--streams")) {
            b.streams = (unsigned)strtoul(v, NULL, 10), i++;
        } else if (v && !strcmp(a, "--requests")) {
            b.requests = strtoull(v, NULL, 10), i++;
        } else {
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (b.nconns < 1 || b.nconns > 1024 || b.streams < 1 || b.streams > 10000 || b.requests < 1 ||
        b.requests > 100000000) {
        fprintf(stderr, "mgbench: --conns 1..1024, --streams 1..10000, --requests 1..1e8\n");
        return EXIT_USAGE;
    }
    o.tls = tls >= 0 ? tls : strncmp(o.target, "unix:", 5) != 0;
    b.base = event_base_new();
    b.latency_ms = calloc(b.requests, sizeof(double));
    b.conns = calloc(b.nconns, sizeof(conn_state));
    if (b.base == NULL || b.latency_ms == NULL || b.conns == NULL) {
        fprintf(stderr, "mgbench: out of memory\n");
        return 1;
    }
    for (unsigned i = 0; i < b.nconns; i++) {
        b.conns[i].b = &b;
        if (mg_client_new(&b.conns[i].client, b.base, &o, err, sizeof(err)) != 0) {
            fprintf(stderr, "mgbench: %s\n", err);
            return 14;
        }
    }
    t0 = now_ms();
    for (unsigned i = 0; i < b.nconns; i++)
        start_calls(&b.conns[i]);
    if (b.finished < b.requests)
        event_base_dispatch(b.base);
    secs = (now_ms() - t0) / 1e3;
    for (unsigned i = 0; i < b.nconns; i++)
        mg_client_del(b.conns[i].client);
    event_base_loop(b.base, EVLOOP_NONBLOCK);

    qsort(b.latency_ms, b.finished < b.requests ? b.finished : b.requests, sizeof(double),
          cmp_double);
    {
        uint64_t n = b.finished < b.requests ? b.finished : b.requests;
        double p50 = n ? b.latency_ms[n / 2] : 0, p99 = n ? b.latency_ms[n * 99 / 100] : 0;
        double max = n ? b.latency_ms[n - 1] : 0;
        if (json) {
            printf("{\"requests\":%" PRIu64 ",\"seconds\":%.3f,\"requests_per_second\":%.0f,"
                   "\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f,\"ok\":%" PRIu64 "}\n",
                   b.finished, secs, (double)b.finished / secs, p50, p99, max, b.codes[MG_GRPC_OK]);
        } else {
            printf("%" PRIu64 " calls to %s on %u connections x %u streams in %.3f s\n", b.finished,
                   b.method, b.nconns, b.streams, secs);
            printf("requests/s  %.0f\nlatency ms  p50 %.3f  p99 %.3f  max %.3f\n",
                   (double)b.finished / secs, p50, p99, max);
            for (int c = 0; c < MG_GRPC_CODE_COUNT; c++) {
                if (b.codes[c])
                    printf("status      %-18s %" PRIu64 "\n", mg_grpc_code_name(c), b.codes[c]);
            }
            if (b.first_error[0])
                printf("first error %s\n", b.first_error);
        }
    }
    {
        int ok = b.codes[MG_GRPC_OK] == b.requests;
        free(b.latency_ms);
        free(b.conns);
        event_base_free(b.base);
        return ok ? 0 : 1;
    }
}
