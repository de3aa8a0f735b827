/*
 * mgbench vram: GPU memory moved through moongate (mg_vram_move), beside the same transfer from
 * host memory and a plain device-to-pinned-host copy, measured in the same run.
 *
 *   mgbench vram --target unix:A.sock --peer B [--size 64M] [--rounds 3] [--ops write,read]
 *                [--path staged|auto|dmabuf] [--chunk SIZE] [--register] [--verify]
 *
 * A is the daemon on this node (its Unix socket: leases and GPU memory are passed there), B the
 * peer's control endpoint as A reaches it (h2c "127.0.0.1:7543"; also where mgbench registers
 * the target). mgbench allocates SIZE bytes of device memory on device 0 (the CUDA driver, or
 * $MOONGATE_CUDA_LIB), registers a host segment of SIZE on A and a remote-accessible one on B,
 * and for each op times, over --rounds rounds, alternately:
 *   host    one request of SIZE between A's host segment and B's (Submit with wait)
 *   vram    mg_vram_move of the device memory to/from B's segment by --path
 * then cuMemcpyDtoH of SIZE into pinned host memory. A first move, timed apart, maps and pins
 * the pool's file (once per process). It prints the medians as GB/s and the
 * ratios vram/host. --register registers the device memory by its dma-buf first (the dma-buf
 * path needs it). --verify writes a pattern from the device, reads it back into a second device
 * buffer and compares it there. Exit status 0 when every move ended OK (and verified).
 */
#include "mg_client.h"
#include "mg_cuda.h"
#include "mg_time.h"
#include "mg_vram.h"
#include "mgbench.h"

#include "moongate/v1/transfer.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_ROUNDS 15
#define PIECE      (64u << 20) /* bytes per host<->device copy when filling and checking */

typedef struct bench {
    const char *target, *peer, *ops;
    uint64_t size, chunk;
    int rounds, path, reg, verify;
    mg_client *c;
    const mg_cuda *cu;
    mg_cu_ptr dev, dev2;
    uint64_t local_seg, remote_seg;
    mg_vram_move_result last;
} bench;

static double now_s(void)
{
    return (double)mg_now_mono_ns() / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One request of the whole size between A's host segment and B's: seconds, or -1. */
static double host_move(bench *b, int write)
{
    Moongate__V1__SubmitRequest q = MOONGATE__V1__SUBMIT_REQUEST__INIT;
    Moongate__V1__TransferRequest t = MOONGATE__V1__TRANSFER_REQUEST__INIT, *tp = &t;
    Moongate__V1__SubmitResponse *resp;
    int status, ok;
    char msg[512];
    double t0;
    t.op = write ? MOONGATE__V1__TRANSFER_OP__WRITE : MOONGATE__V1__TRANSFER_OP__READ;
    t.local_segment = b->local_seg;
    t.peer = (char *)b->peer;
    t.remote_segment = b->remote_seg;
    t.length = b->size;
    q.requests = &tp;
    q.n_requests = 1;
    q.wait = 1;
    t0 = now_s();
    resp = mg_client_call_msg(b->c, "/moongate.v1.Transfer/Submit", &q.base,
                              &moongate__v1__submit_response__descriptor, 600000, &status, msg,
                              sizeof(msg));
    t0 = now_s() - t0;
    ok = resp && resp->batch && resp->batch->state == MOONGATE__V1__REQUEST_STATE__DONE;
    if (!ok)
        fprintf(stderr, "mgbench: host %s: %s\n", write ? "write" : "read",
                resp == NULL                             ? msg
                : resp->batch && resp->batch->n_requests ? resp->batch->requests[0]->message
                                                         : "no batch in the answer");
    if (resp)
        moongate__v1__submit_response__free_unpacked(resp, NULL);
    return ok ? t0 : -1;
}

/* mg_vram_move of `dev` to or from B's segment: seconds, or -1. */
static double vram_move(bench *b, int write, mg_cu_ptr dev)
{
    mg_vram_move_args a = {.write = write,
                           .ptr = (uintptr_t)dev,
                           .len = b->size,
                           .peer = b->peer,
                           .remote_segment = b->remote_seg,
                           .chunk = b->chunk,
                           .timeout_ms = 600000,
                           .path = b->path};
    int status;
    char err[1024];
    double t0 = now_s();
    if (mg_vram_move(b->c, &a, &b->last, &status, err, sizeof(err)) != 0) {
        fprintf(stderr, "mgbench: vram %s: %s (%s)\n", write ? "write" : "read", err,
                mg_grpc_code_name(status));
        return -1;
    }
    return now_s() - t0;
}

/* The verification pattern's byte at offset i. */
static uint8_t pattern(uint64_t i)
{
    uint64_t x = (i / 8 + 1) * 0x9e3779b97f4a7c15ull;
    return (uint8_t)(x >> (8 * (i % 8)));
}

/* Fills dev with the pattern (fill) or checks it there: 0, or -1 said. */
static int pattern_pass(bench *b, mg_cu_ptr dev, int fill, uint8_t *host)
{
    for (uint64_t off = 0; off < b->size; off += PIECE) {
        size_t n = b->size - off < PIECE ? (size_t)(b->size - off) : PIECE;
        mg_cu_result rc;
        if (fill) {
            for (size_t i = 0; i < n; i++)
                host[i] = pattern(off + i);
            rc = b->cu->cuMemcpyHtoD(dev + off, host, n);
        } else {
            rc = b->cu->cuMemcpyDtoH(host, dev + off, n);
        }
        if (rc != MG_CU_SUCCESS) {
            char text[256];
            fprintf(stderr, "mgbench: %s: %s\n", fill ? "cuMemcpyHtoD" : "cuMemcpyDtoH",
                    mg_cuda_strerror(b->cu, rc, text, sizeof(text)));
            return -1;
        }
        for (size_t i = 0; !fill && i < n; i++)
            if (host[i] != pattern(off + i)) {
                fprintf(stderr, "mgbench: verify: byte %llu on the device is 0x%02x, not 0x%02x\n",
                        (unsigned long long)(off + i), host[i], pattern(off + i));
                return -1;
            }
    }
    return 0;
}

/* Median seconds of cuMemcpyDtoH of the whole size into pinned host memory, or -1. */
static double dtoh_pinned(bench *b)
{
    double t[MAX_ROUNDS];
    char *host = NULL;
    int pinned;
    if (posix_memalign((void **)&host, 4096, b->size) != 0)
        return -1;
    memset(host, 0, b->size);
    pinned = b->cu->cuMemHostRegister(host, b->size, 0) == MG_CU_SUCCESS;
    for (int r = 0; r < b->rounds; r++) {
        double t0 = now_s();
        if (b->cu->cuMemcpyDtoH(host, b->dev, b->size) != MG_CU_SUCCESS) {
            free(host);
            return -1;
        }
        t[r] = now_s() - t0;
    }
    if (pinned)
        b->cu->cuMemHostUnregister(host);
    free(host);
    return median(t, b->rounds);
}

static int run(bench *b)
{
    static const char *const names[] = {"read", "write"};
    double gb = (double)b->size / 1e9, vram_write = 0, first;
    int failed = 0;
    /* the first moves: the peer's session opens, and the first staged move of a process maps
     * and pins the pool's file (once), apart from the rounds */
    if (host_move(b, 1) < 0 || (first = vram_move(b, strstr(b->ops, "write") != NULL, b->dev)) < 0)
        return 1;
    printf("first move %.1f ms (%s%s)\n", first * 1e3, b->last.path,
           strcmp(b->last.path, "staged")
               ? ""
               : ": maps and pins the pool's file, touches its pages first");
    for (int write = 1; write >= 0; write--) {
        double th[MAX_ROUNDS], tv[MAX_ROUNDS], h, v;
        if (strstr(b->ops, names[write]) == NULL)
            continue;
        for (int r = 0; r < b->rounds && !failed; r++) {
            th[r] = host_move(b, write);
            tv[r] = vram_move(b, write, b->dev);
            failed = th[r] < 0 || tv[r] < 0;
        }
        if (failed)
            return 1;
        h = median(th, b->rounds);
        v = median(tv, b->rounds);
        if (write)
            vram_write = gb / v;
        printf("%-5s %8.1f MiB  host memory %7.3f GB/s  vram (%s) %7.3f GB/s  ratio %.2f\n",
               names[write], (double)b->size / (1 << 20), gb / h, b->last.path, gb / v, h / v);
    }
    if (b->last.path && strcmp(b->last.path, "staged") == 0)
        printf("staged: chunk %.1f MiB, %d lease%s in turn, pool %s%s%s%s\n",
               (double)b->last.chunk / (1 << 20), b->last.buffers, b->last.buffers == 1 ? "" : "s",
               b->last.pool, b->last.bounce ? ", through a pinned bounce buffer" : "",
               b->last.why[0] ? "; not by dma-buf: " : "", b->last.why);
    {
        double d = dtoh_pinned(b);
        if (d > 0)
            printf("cuMemcpyDtoH into pinned host memory %7.3f GB/s%s", gb / d,
                   vram_write > 0 ? "" : "\n");
        if (d > 0 && vram_write > 0)
            printf("  (vram write is %.2f of it)\n", vram_write / (gb / d));
    }
    return 0;
}

static int verify(bench *b)
{
    uint8_t *host = malloc(PIECE);
    int rc = host == NULL || pattern_pass(b, b->dev, 1, host) != 0 || vram_move(b, 1, b->dev) < 0 ||
             vram_move(b, 0, b->dev2) < 0 || pattern_pass(b, b->dev2, 0, host) != 0;
    free(host);
    if (rc == 0)
        printf("verify: %llu bytes written from the device and read back onto it (%s): equal\n",
               (unsigned long long)b->size, b->last.path);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "Usage: mgbench vram --target unix:A.sock --peer B [--size 64M] [--rounds 3]\n"
               "           [--ops write,read] [--path staged|auto|dmabuf] [--chunk SIZE]\n"
               "           [--register] [--verify]\n"
               "A: this node's daemon (its Unix socket); B: the peer's control endpoint as A\n"
               "reaches it. Device memory from the CUDA driver ($MOONGATE_CUDA_LIB).\n");
}

static int setup(bench *b, char *err, size_t errcap)
{
    mg_cu_context ctx;
    uint64_t ids[64];
    int status;
    if ((b->cu = mg_cuda_get(err, errcap)) == NULL)
        return -1;
    printf("CUDA driver %d.%d: every symbol moongate's table uses resolved\n",
           b->cu->version / 1000, b->cu->version % 1000 / 10);
    if (b->cu->cuDevicePrimaryCtxRetain(&ctx, 0) || b->cu->cuCtxSetCurrent(ctx) ||
        b->cu->cuMemAlloc(&b->dev, b->size) ||
        (b->verify && b->cu->cuMemAlloc(&b->dev2, b->size))) {
        snprintf(err, errcap, "cannot allocate %llu bytes of device memory on cuda:0",
                 (unsigned long long)b->size);
        return -1;
    }
    if ((b->c = mg_client_open(b->target, getenv("MOONGATE_TOKEN"), err, errcap)) == NULL)
        return -1;
    if (b->reg && (mg_vram_register(b->c, (uintptr_t)b->dev, b->size, 0, "mgbench", ids, 64,
                                    &status, err, errcap) < 0 ||
                   (b->verify && mg_vram_register(b->c, (uintptr_t)b->dev2, b->size, 0, "mgbench2",
                                                  ids, 64, &status, err, errcap) < 0)))
        return -1;
    b->local_seg = mgbench_register_segment(b->target, "mgbench-vram-host", b->size, 0);
    b->remote_seg =
        b->local_seg ? mgbench_register_segment(b->peer, "mgbench-vram-target", b->size, 1) : 0;
    if (b->remote_seg == 0) {
        snprintf(err, errcap, "cannot register the host segments");
        return -1;
    }
    return 0;
}

int mgbench_vram_main(int argc, char **argv)
{
    bench b = {.ops = "write,read", .size = 64u << 20, .rounds = 3};
    char err[1024];
    int rc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--register")) {
            b.reg = 1;
        } else if (!strcmp(a, "--verify")) {
            b.verify = 1;
        } else if (v && !strcmp(a, "--target")) {
            b.target = v, i++;
        } else if (v && !strcmp(a, "--peer")) {
            b.peer = v, i++;
        } else if (v && !strcmp(a, "--ops")) {
            b.ops = v, i++;
        } else if (v && !strcmp(a, "--size") && mgbench_parse_size(v, &b.size) == 0) {
            i++;
        } else if (v && !strcmp(a, "--chunk") && mgbench_parse_size(v, &b.chunk) == 0) {
            i++;
        } else if (v && !strcmp(a, "--rounds") && atoi(v) > 0 && atoi(v) <= MAX_ROUNDS) {
            b.rounds = atoi(v), i++;
        } else if (v && !strcmp(a, "--path") &&
                   (!strcmp(v, "staged") || !strcmp(v, "auto") || !strcmp(v, "dmabuf"))) {
            b.path = !strcmp(v, "staged") ? MG_VRAM_STAGED
                     : !strcmp(v, "auto") ? MG_VRAM_AUTO
                                          : MG_VRAM_DMABUF;
            i++;
        } else {
            usage(stderr);
            return 64;
        }
    }
    if (b.target == NULL || b.peer == NULL) {
        usage(stderr);
        return 64;
    }
    if (setup(&b, err, sizeof(err)) != 0) {
        fprintf(stderr, "mgbench vram: %s\n", err);
        rc = 1;
    } else {
        rc = run(&b) || (b.verify && verify(&b)) ? 1 : 0;
    }
    if (b.local_seg)
        mgbench_unregister_segment(b.target, b.local_seg);
    if (b.remote_seg)
        mgbench_unregister_segment(b.peer, b.remote_seg);
    mg_client_close(b.c);
    if (b.dev)
        b.cu->cuMemFree(b.dev);
    if (b.dev2)
        b.cu->cuMemFree(b.dev2);
    return rc;
}
