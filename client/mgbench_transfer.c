/*
 * mgbench transfer: throughput and latency of moongate transfers between two daemons, driven
 * through the C client library the way an application would: Submit a batch to the local
 * daemon, Wait for it to end (brief: the outcome and any failed requests, not a status per
 * block, as an application that only needs the outcome asks).
 *
 *   mgbench transfer --target A --peer B [--blocks 4K,64K,1M,16M,64M] [--batches 1,16]
 *                    [--ops write,read] [--bytes 256M] [--threads N] [--inflight N]
 *                    [--scatter] [--big 1G] [--per-request] [--submit-wait]
 *                    [--print-layout] [--seconds S] [--start-at T] [--digest] [--cold]
 *                    [--json]
 *
 * A and B are the daemons' h2c control endpoints ("127.0.0.1:7543"); B is also what A is told
 * the peer is. mgbench registers a segment on A and a remote-accessible one on B (as large as
 * the largest configuration), then for each op, block size and batch size submits batches of
 * that many blocks — spread over the segments, each thread its own slice of them — until
 * --bytes moved (at least 20 batches, at most 2000), and prints one line: GB/s over the whole
 * run, the average and p99 time from Submit to the batch's end, and the average time Submit
 * itself took. Batches go in SubmitRequest's compact `blocks` form; --per-request sends a
 * TransferRequest message per block instead. --big adds one request of that size each way (the
 * 1 GiB case). --submit-wait asks Submit to answer at the batch's end (SubmitRequest.wait: one
 * call instead of Submit then Wait). --inflight N keeps N batches outstanding per thread (the
 * oldest is waited for before the next goes; each in flight has its own region of the slice).
 * --scatter lays a batch's blocks at a fixed permutation of every other block slot, a different
 * one on each side, so that no two blocks of a batch touch on either side (what a KV cache's
 * pages look like), instead of back to back. --json prints the same as one JSON object per
 * line. --peer "" moves between two segments of A (copies on its workers) and, with --big,
 * prints memcpy of that size on one thread beside them. --print-layout prints the offsets of each
 * thread's first --inflight batches instead of moving anything. --seconds S runs each
 * configuration for S seconds instead of --bytes; --start-at T waits until wall-clock time T
 * before the first, so that several mgbench processes (one per tenant or per peer) move at once.
 * --digest asks for end-to-end CRC32C (SubmitRequest.digest). Before the first configuration
 * one untimed WRITE and READ of the whole segments warm every page of both, as the references'
 * buffers are warm (a first pass over fresh pages costs a fault per page where the pages are
 * small); --cold leaves it out. MOONGATE_TOKEN, when set, is sent as
 * a bearer token to both daemons. Exit status 0 when every batch ended DONE.
 */
#include "mgbench.h"

#include "mg_client.h"
#include "mg_time.h"

#include "moongate/v1/memory.pb-c.h"
#include "moongate/v1/transfer.pb-c.h"

#include <event2/event.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_LIST 16

typedef struct {
    int status;
    uint8_t *resp;
    size_t len;
    char message[512];
} call_rec;

static double now_s(void)
{
    return (double)mg_now_mono_ns() / 1e9;
}

/* One call on c, run to its end. Returns the gRPC status (r holds the last message). */
static int call(mg_client *c, const char *path, const ProtobufCMessage *req, call_rec *r)
{
    size_t n = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(n ? n : 1);
    memset(r, 0, sizeof(*r));
    if (buf == NULL)
        return MG_GRPC_RESOURCE_EXHAUSTED;
    protobuf_c_message_pack(req, buf);
    if (mg_client_call(c, path, buf, n, 600000, &r->resp, &r->len, &r->status, r->message,
                       sizeof(r->message)) != 0)
        r->status = MG_GRPC_UNAVAILABLE;
    free(buf);
    return r->status;
}

/* A client with its own event loop (one per thread). */
typedef struct {
    struct event_base *base;
    mg_client *c;
} conn;

/* Returns 0, or -1 with err set. */
static int conn_open(conn *k, const char *target, char *err, size_t errcap)
{
    mg_client_options o = {.target = target, .token = getenv("MOONGATE_TOKEN")};
    k->c = NULL;
    k->base = event_base_new();
    if (k->base == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    return mg_client_new(&k->c, k->base, &o, err, errcap) == 0 ? 0 : -1;
}

static void conn_close(conn *k)
{
    mg_client_del(k->c);
    if (k->base) {
        event_base_loop(k->base, EVLOOP_NONBLOCK); /* the connection's last callbacks */
        event_base_free(k->base);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    const char *target, *peer;
    uint64_t local_id, remote_id;
    uint64_t seg_bytes;
    int write;
    uint64_t block;
    unsigned batch, batches;
    unsigned index, threads; /* this thread's slice of the segments */
    unsigned inflight;       /* batches outstanding at once */
    int scatter;             /* blocks at a permutation of offsets, none adjacent */
    int per_request;         /* a TransferRequest per block instead of the Blocks form */
    int submit_wait;         /* Submit answers at the end: no Wait */
    int digest;              /* SubmitRequest.digest */
    double deadline;         /* --seconds: no batch goes after this (monotonic seconds), or 0 */
    /* results */
    double *latency; /* seconds, one per batch */
    double submit_sum;
    int failed;
    char error[512];
} worker;

/* A multiplier coprime to n other than 1 (n >= 3), from `seed` up: j -> j * a mod n permutes. */
static uint64_t coprime(uint64_t n, uint64_t seed)
{
    uint64_t a = seed % n < 2 ? 2 : seed % n;
    for (;; a = a + 1 < n ? a + 1 : 2) {
        uint64_t x = a, y = n;
        while (y) {
            uint64_t t = x % y;
            x = y;
            y = t;
        }
        if (x == 1 && a + 1 != n) /* a = n - 1 would make neighbours neighbours again */
            return a;
    }
}

/* Block i of batch k's offset on one side: batch k uses region k % inflight of the thread's
 * slice; contiguous blocks, or (scatter) every other block slot in the order of a permutation
 * (`mul`), so that no two blocks of a batch touch. */
static uint64_t block_offset(const worker *w, unsigned k, unsigned i, uint64_t mul)
{
    uint64_t span = w->seg_bytes / w->threads, per = span / w->block ? span / w->block : 1;
    uint64_t region = per / w->inflight ? per / w->inflight : 1, slots = region / 2;
    uint64_t base = span * w->index + (k % w->inflight) * region * w->block;
    if (!w->scatter || slots < 3)
        return base + ((uint64_t)k / w->inflight * w->batch + i) % region * w->block;
    return base + 2 * ((uint64_t)i * mul % slots) * w->block;
}

/* The permutations of --scatter, local and remote (different, so that the sides differ). */
static void layout_muls(const worker *w, uint64_t mul[2])
{
    uint64_t slots = w->seg_bytes / w->threads / w->block / w->inflight / 2;
    mul[0] = mul[1] = 2;
    if (w->scatter && slots >= 3) {
        mul[0] = coprime(slots, slots / 3 + 1);
        mul[1] = coprime(slots, mul[0] + 2);
    }
}

/* The end of batch `id`, submitted at t0 (Wait, unless the Submit answered it): 0, or -1 with
 * w->error set. */
static int batch_end(worker *w, mg_client *c, uint64_t id, Moongate__V1__Batch *b, double t0,
                     unsigned k)
{
    Moongate__V1__GetBatchRequest gr = MOONGATE__V1__GET_BATCH_REQUEST__INIT;
    call_rec r = {0};
    gr.id = id;
    gr.brief = 1; /* the state and the failed requests: not a status per block */
    if (b == NULL && (call(c, "/moongate.v1.Transfer/Wait", &gr.base, &r) != MG_GRPC_OK ||
                      (b = moongate__v1__batch__unpack(NULL, r.len, r.resp)) == NULL)) {
        snprintf(w->error, sizeof(w->error), "Wait: %.400s", r.message);
        free(r.resp);
        return -1;
    }
    free(r.resp);
    w->latency[k] = now_s() - t0;
    if (b->state != MOONGATE__V1__REQUEST_STATE__DONE) {
        for (size_t i = 0; i < b->n_requests; i++) { /* brief: the failed ones */
            if (b->requests[i]->state == MOONGATE__V1__REQUEST_STATE__FAILED) {
                snprintf(w->error, sizeof(w->error), "request %u: %s", b->requests[i]->index,
                         b->requests[i]->message);
                break;
            }
        }
        moongate__v1__batch__free_unpacked(b, NULL);
        return -1;
    }
    moongate__v1__batch__free_unpacked(b, NULL);
    return 0;
}

/* Submits batch k: its id, and with --submit-wait the batch at its end in *b. 0, or -1. */
static int batch_submit(worker *w, mg_client *c, Moongate__V1__SubmitRequest *sr, uint64_t *id,
                        Moongate__V1__Batch **b)
{
    Moongate__V1__SubmitResponse *resp;
    call_rec r;
    double t0 = now_s();
    if (call(c, "/moongate.v1.Transfer/Submit", &sr->base, &r) != MG_GRPC_OK ||
        (resp = moongate__v1__submit_response__unpack(NULL, r.len, r.resp)) == NULL) {
        snprintf(w->error, sizeof(w->error), "Submit: %.400s", r.message);
        free(r.resp);
        return -1;
    }
    free(r.resp);
    w->submit_sum += now_s() - t0;
    *id = resp->batch_id;
    *b = resp->batch; /* with --submit-wait: the batch at its end */
    resp->batch = NULL;
    moongate__v1__submit_response__free_unpacked(resp, NULL);
    if (w->submit_wait && *b == NULL) {
        snprintf(w->error, sizeof(w->error), "Submit(wait) answered no batch");
        return -1;
    }
    return 0;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    conn cn;
    Moongate__V1__TransferRequest *reqs = calloc(w->batch, sizeof(*reqs));
    Moongate__V1__TransferRequest **ptrs = calloc(w->batch, sizeof(*ptrs));
    Moongate__V1__Blocks blocks = MOONGATE__V1__BLOCKS__INIT, *bptr = &blocks;
    uint64_t *loffs = calloc(w->batch, sizeof(*loffs)), *roffs = calloc(w->batch, sizeof(*roffs));
    uint64_t *lengths = calloc(w->batch, sizeof(*lengths));
    uint64_t *ids = calloc(w->inflight, sizeof(*ids)), mul[2];
    double *t0 = calloc(w->inflight, sizeof(*t0));
    unsigned done = 0, k = 0;
    char err[256];
    if (conn_open(&cn, w->target, err, sizeof(err)) != 0 || reqs == NULL || ptrs == NULL ||
        loffs == NULL || roffs == NULL || lengths == NULL || ids == NULL || t0 == NULL) {
        snprintf(w->error, sizeof(w->error), "cannot connect to %s", w->target);
        w->failed = 1;
        goto out;
    }
    layout_muls(w, mul);
    for (unsigned i = 0; i < w->batch; i++) {
        moongate__v1__transfer_request__init(&reqs[i]);
        reqs[i].op = w->write ? MOONGATE__V1__TRANSFER_OP__WRITE : MOONGATE__V1__TRANSFER_OP__READ;
        reqs[i].local_segment = w->local_id;
        reqs[i].remote_segment = w->remote_id;
        reqs[i].peer = (char *)w->peer;
        reqs[i].length = w->block;
        ptrs[i] = &reqs[i];
        lengths[i] = w->block;
    }
    /* The compact form: one group, offsets and lengths as packed arrays. */
    blocks.op = reqs[0].op;
    blocks.local_segment = w->local_id;
    blocks.remote_segment = w->remote_id;
    blocks.peer = (char *)w->peer;
    blocks.n_local_offsets = blocks.n_remote_offsets = blocks.n_lengths = w->batch;
    blocks.local_offsets = loffs;
    blocks.remote_offsets = roffs;
    blocks.lengths = lengths;
    /* Up to --inflight batches outstanding: the oldest is waited for before another goes. */
    for (; k < w->batches && !w->failed && !(w->deadline > 0 && now_s() >= w->deadline); k++) {
        Moongate__V1__SubmitRequest sr = MOONGATE__V1__SUBMIT_REQUEST__INIT;
        Moongate__V1__Batch *b = NULL;
        unsigned slot = k % w->inflight;
        if (ids[slot] && batch_end(w, cn.c, ids[slot], NULL, t0[slot], done++) != 0) {
            w->failed = 1;
            break;
        }
        ids[slot] = 0;
        for (unsigned i = 0; i < w->batch; i++) {
            reqs[i].local_offset = loffs[i] = block_offset(w, k, i, mul[0]);
            reqs[i].remote_offset = roffs[i] = block_offset(w, k, i, mul[1]);
        }
        sr.wait = w->submit_wait;
        sr.brief = 1;
        sr.digest = w->digest;
        if (w->per_request) {
            sr.requests = ptrs;
            sr.n_requests = w->batch;
        } else {
            sr.blocks = &bptr;
            sr.n_blocks = 1;
        }
        t0[slot] = now_s();
        if (batch_submit(w, cn.c, &sr, &ids[slot], &b) != 0 ||
            (b != NULL && batch_end(w, cn.c, ids[slot], b, t0[slot], done++) != 0)) {
            w->failed = 1;
            break;
        }
        if (b != NULL)
            ids[slot] = 0; /* over already */
    }
    for (unsigned j = 0; j < w->inflight && !w->failed; j++) { /* the last ones, oldest first */
        unsigned slot = (k + j) % w->inflight;
        if (ids[slot] && batch_end(w, cn.c, ids[slot], NULL, t0[slot], done++) != 0)
            w->failed = 1;
    }
out:
    conn_close(&cn);
    free(reqs);
    free(ptrs);
    free(loffs);
    free(roffs);
    free(lengths);
    free(ids);
    free(t0);
    return NULL;
}

typedef struct {
    const char *target, *peer;
    uint64_t local_id, remote_id, seg_bytes, bytes;
    unsigned threads, inflight;
    int json, per_request, submit_wait, scatter, print_layout, digest, cold;
    double seconds;  /* --seconds: each configuration runs this long instead of --bytes */
    double start_at; /* --start-at: the first configuration starts at this wall-clock time */
} setup;

/* --start-at: sleeps until the wall clock reaches `at` (seconds since the epoch), so that
 * several mgbench processes start moving together. */
static void wait_until(double at)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double left = at - ((double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
    if (left > 0) {
        struct timespec d = {.tv_sec = (time_t)left,
                             .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};
        while (nanosleep(&d, &d) != 0) {
        }
    }
}

/* --print-layout: the offsets of each thread's first --inflight batches, one line per batch
 * and side ("layout T K local|remote OFF..."), for each configuration; nothing is moved. */
static void print_layout(const setup *s, uint64_t block, unsigned batch)
{
    for (unsigned t = 0; t < s->threads; t++) {
        worker w = {.seg_bytes = s->seg_bytes,
                    .block = block,
                    .batch = batch,
                    .index = t,
                    .threads = s->threads,
                    .inflight = s->inflight,
                    .scatter = s->scatter};
        uint64_t mul[2];
        layout_muls(&w, mul);
        for (unsigned k = 0; k < s->inflight; k++)
            for (int side = 0; side < 2; side++) {
                printf("layout %u %u %s", t, k, side ? "remote" : "local");
                for (unsigned i = 0; i < batch; i++)
                    printf(" %" PRIu64, block_offset(&w, k, i, mul[side]));
                printf("\n");
            }
    }
}

/* One configuration; prints its line. Returns 0 when every batch ended DONE. */
static int run(const setup *s, int write, uint64_t block, unsigned batch, unsigned min_batches)
{
    worker *w = calloc(s->threads, sizeof(*w));
    pthread_t *th = calloc(s->threads, sizeof(*th));
    uint64_t per_batch = block * batch;
    unsigned batches = (unsigned)(s->bytes / per_batch / s->threads);
    double t0, secs, *all, submit = 0;
    size_t n = 0;
    int failed = 0;
    char label[64];
    if (batches < min_batches)
        batches = min_batches;
    if (batches > 2000)
        batches = 2000;
    if (s->seconds > 0) /* as many as fit in the time (a bound for the latency array) */
        batches = 200000;
    all = calloc((size_t)batches * s->threads, sizeof(double));
    if (w == NULL || th == NULL || all == NULL) {
        fprintf(stderr, "mgbench: out of memory\n");
        return 1;
    }
    if (s->start_at > 0)
        wait_until(s->start_at);
    t0 = now_s();
    for (unsigned i = 0; i < s->threads; i++) {
        w[i] = (worker){.target = s->target,
                        .peer = s->peer,
                        .local_id = s->local_id,
                        .remote_id = s->remote_id,
                        .seg_bytes = s->seg_bytes,
                        .write = write,
                        .block = block,
                        .batch = batch,
                        .batches = batches,
                        .index = i,
                        .threads = s->threads,
                        .inflight = s->inflight,
                        .scatter = s->scatter,
                        .per_request = s->per_request,
                        .submit_wait = s->submit_wait,
                        .digest = s->digest,
                        .deadline = s->seconds > 0 ? t0 + s->seconds : 0,
                        .latency = calloc(batches, sizeof(double))};
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    for (unsigned i = 0; i < s->threads; i++) {
        pthread_join(th[i], NULL);
        if (w[i].failed) {
            failed = 1;
            fprintf(stderr, "mgbench: %s %" PRIu64 " x %u: %s\n", write ? "WRITE" : "READ", block,
                    batch, w[i].error);
        }
        for (unsigned k = 0; k < batches; k++) {
            if (w[i].latency[k] > 0)
                all[n++] = w[i].latency[k];
        }
        submit += w[i].submit_sum;
        free(w[i].latency);
    }
    secs = now_s() - t0;
    qsort(all, n, sizeof(double), cmp_double);
    {
        double bytes = (double)per_batch * (double)n, avg = 0;
        double p99 = n ? all[n * 99 / 100 < n ? n * 99 / 100 : n - 1] : 0;
        double p50 = n ? all[n / 2] : 0;
        for (size_t i = 0; i < n; i++)
            avg += all[i];
        avg = n ? avg / (double)n : 0;
        if (block >= (1u << 20))
            snprintf(label, sizeof(label), "%" PRIu64 " MiB", block >> 20);
        else
            snprintf(label, sizeof(label), "%" PRIu64 " KiB", block >> 10);
        if (s->json)
            printf("{\"op\":\"%s\",\"block_bytes\":%" PRIu64 ",\"batch\":%u,\"threads\":%u,"
                   "\"batches\":%zu,\"gbytes_per_s\":%.3f,\"latency_avg_us\":%.1f,"
                   "\"latency_p50_us\":%.1f,\"latency_p99_us\":%.1f,\"submit_avg_us\":%.1f,"
                   "\"submit_wait\":%s,\"inflight\":%u,\"scatter\":%s,\"ok\":%s}\n",
                   write ? "write" : "read", block, batch, s->threads, n, bytes / secs / 1e9,
                   avg * 1e6, p50 * 1e6, p99 * 1e6, n ? submit / (double)n * 1e6 : 0,
                   s->submit_wait ? "true" : "false", s->inflight, s->scatter ? "true" : "false",
                   failed ? "false" : "true");
        else
            printf("%-5s %9s x %-5u %2u thr %2u in flight%s %6zu batches %8.3f GB/s  latency avg "
                   "%10.1f p50 %10.1f p99 %10.1f us  submit %8.1f us%s\n",
                   write ? "WRITE" : "READ", label, batch, s->threads, s->inflight,
                   s->scatter ? " scattered" : "", n, bytes / secs / 1e9, avg * 1e6, p50 * 1e6,
                   p99 * 1e6, n ? submit / (double)n * 1e6 : 0, failed ? "  FAILED" : "");
        fflush(stdout);
    }
    free(all);
    free(w);
    free(th);
    return failed;
}

uint64_t mgbench_register_segment(const char *target, const char *name, uint64_t bytes, int remote)
{
    Moongate__V1__RegisterRequest rr = MOONGATE__V1__REGISTER_REQUEST__INIT;
    Moongate__V1__RegisterResponse *resp;
    uint64_t id = 0;
    call_rec r;
    char err[256];
    conn k;
    if (conn_open(&k, target, err, sizeof(err)) != 0) {
        fprintf(stderr, "mgbench: %s: %s\n", target, err);
        goto out;
    }
    rr.name = (char *)name;
    rr.size = bytes;
    rr.remote_accessible = remote;
    rr.prefault = 1;
    if (call(k.c, "/moongate.v1.Memory/RegisterSegment", &rr.base, &r) != MG_GRPC_OK ||
        (resp = moongate__v1__register_response__unpack(NULL, r.len, r.resp)) == NULL) {
        fprintf(stderr, "mgbench: RegisterSegment on %s: %s\n", target, r.message);
        free(r.resp);
        goto out;
    }
    id = resp->segment->id;
    moongate__v1__register_response__free_unpacked(resp, NULL);
    free(r.resp);
out:
    conn_close(&k);
    return id;
}

void mgbench_unregister_segment(const char *target, uint64_t id)
{
    Moongate__V1__UnregisterRequest ur = MOONGATE__V1__UNREGISTER_REQUEST__INIT;
    call_rec r;
    char err[256];
    conn k;
    if (conn_open(&k, target, err, sizeof(err)) == 0) {
        ur.id = id;
        if (call(k.c, "/moongate.v1.Memory/UnregisterSegment", &ur.base, &r) != MG_GRPC_OK)
            fprintf(stderr, "mgbench: UnregisterSegment on %s: %s\n", target, r.message);
        free(r.resp);
    }
    conn_close(&k);
}

int mgbench_parse_size(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = 1;
    if (end == s)
        return -1;
    if (*end == 'K' || *end == 'k')
        mul = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1024 * 1024 * 1024, end++;
    if (*end != '\0' || v == 0 || v > UINT64_MAX / mul)
        return -1;
    *out = v * mul;
    return 0;
}

/* "a,b,c" of sizes (or plain numbers); returns how many, -1 on a bad item. */
static int parse_list(const char *s, uint64_t *out, int max)
{
    char buf[256], *save = NULL, *tok;
    int n = 0;
    snprintf(buf, sizeof(buf), "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == max || mgbench_parse_size(tok, &out[n]) != 0)
            return -1;
        n++;
    }
    return n;
}

/* memcpy of `bytes` between two prefaulted buffers on one thread: the median of 3, printed
 * as the copies' reference. */
static void memcpy_reference(const setup *s, uint64_t bytes)
{
    char *a = malloc(bytes), *b = malloc(bytes);
    double t[3];
    if (a == NULL || b == NULL) {
        fprintf(stderr, "mgbench: no memory for the memcpy reference\n");
        free(a);
        free(b);
        return;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        memcpy(r % 2 ? a : b, r % 2 ? b : a, bytes);
        t[r] = now_s() - t0;
    }
    qsort(t, 3, sizeof(double), cmp_double);
    if (s->json)
        printf("{\"op\":\"memcpy\",\"block_bytes\":%" PRIu64 ",\"threads\":1,"
               "\"gbytes_per_s\":%.3f}\n",
               bytes, (double)bytes / t[1] / 1e9);
    else
        printf("memcpy %8" PRIu64 " MiB one thread, prefaulted %8.3f GB/s (the copies' "
               "reference)\n",
               bytes >> 20, (double)bytes / t[1] / 1e9);
    free(a);
    free(b);
}

/* One untimed WRITE and one READ of the whole segments before anything is timed, so that every
 * page of both has been moved through, and mapped by, both daemons: the references' buffers
 * (iperf3's, UCX's, memcpy's) are warm, and so is a serving system's KV cache once it runs.
 * Returns 0, or -1 with the reason printed. */
static int warm_up(const setup *s)
{
    for (int write = 1; write >= 0; write--) {
        double latency = 0;
        worker w = {.target = s->target,
                    .peer = s->peer,
                    .local_id = s->local_id,
                    .remote_id = s->remote_id,
                    .seg_bytes = s->seg_bytes,
                    .write = write,
                    .block = s->seg_bytes,
                    .batch = 1,
                    .batches = 1,
                    .threads = 1,
                    .inflight = 1,
                    .digest = s->digest, /* the same passes over the memory as the runs */
                    .latency = &latency};
        worker_main(&w);
        if (w.failed) {
            fprintf(stderr, "mgbench: warming up (%s of the whole segments): %s\n",
                    write ? "WRITE" : "READ", w.error);
            return -1;
        }
        if (!s->json)
            printf("warm-up  %s of all %" PRIu64 " MiB, untimed: %.3f s\n",
                   write ? "WRITE" : "READ ", s->seg_bytes >> 20, latency);
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "Usage: mgbench transfer --target A --peer B [--blocks 4K,64K,1M,16M,64M]\n"
               "           [--batches 1,16] [--ops write,read] [--bytes 256M] [--threads N]\n"
               "           [--inflight N] [--scatter] [--big 1G] [--per-request]\n"
               "           [--submit-wait] [--print-layout] [--seconds S] [--start-at T]\n"
               "           [--digest] [--cold] [--json]\n"
               "A, B: h2c control endpoints of two daemons (B as A reaches it); B \"\": copies\n"
               "on A, with --big beside memcpy on one thread. --seconds: each configuration\n"
               "runs S seconds instead of --bytes; --start-at: the first starts at wall-clock\n"
               "time T (seconds since the epoch), for runs of several mgbench at once.\n"
               "--digest: end-to-end CRC32C on every batch (SubmitRequest.digest).\n"
               "First one untimed WRITE and READ of the whole segments warm every page of\n"
               "both (as the references' buffers are); --cold: measure from fresh ones.\n"
               "MOONGATE_TOKEN: a bearer token for both daemons.\n");
}

int mgbench_transfer_main(int argc, char **argv)
{
    setup s = {.bytes = 256u << 20, .threads = 1, .inflight = 1};
    uint64_t blocks[MAX_LIST] = {4096, 65536, 1 << 20, 16 << 20, 64 << 20};
    uint64_t batches[MAX_LIST] = {1, 16}, big = 0;
    int nblocks = 5, nbatches = 2, do_write = 1, do_read = 1, rc = 0;
    char local_name[64], remote_name[64];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            s.json = 1;
        } else if (!strcmp(a, "--per-request")) {
            s.per_request = 1;
        } else if (!strcmp(a, "--submit-wait")) {
            s.submit_wait = 1;
        } else if (!strcmp(a, "--digest")) {
            s.digest = 1;
        } else if (!strcmp(a, "--cold")) {
            s.cold = 1;
        } else if (!strcmp(a, "--scatter")) {
            s.scatter = 1;
        } else if (!strcmp(a, "--print-layout")) {
            s.print_layout = 1;
        } else if (v && !strcmp(a, "--inflight")) {
            s.inflight = (unsigned)strtoul(v, NULL, 10), i++;
        } else if (v && !strcmp(a, "--target")) {
            s.target = v, i++;
        } else if (v && !strcmp(a, "--peer")) {
            s.peer = v, i++;
        } else if (v && !strcmp(a, "--blocks") && (nblocks = parse_list(v, blocks, MAX_LIST)) > 0) {
            i++;
        } else if (v && !strcmp(a, "--batches") &&
                   (nbatches = parse_list(v, batches, MAX_LIST)) > 0) {
            i++;
        } else if (v && !strcmp(a, "--ops")) {
            do_write = strstr(v, "write") != NULL;
            do_read = strstr(v, "read") != NULL;
            i++;
        } else if (v && !strcmp(a, "--bytes") && mgbench_parse_size(v, &s.bytes) == 0) {
            i++;
        } else if (v && !strcmp(a, "--big") && mgbench_parse_size(v, &big) == 0) {
            i++;
        } else if (v && !strcmp(a, "--seconds")) {
            s.seconds = strtod(v, NULL), i++;
        } else if (v && !strcmp(a, "--start-at")) {
            s.start_at = strtod(v, NULL), i++;
        } else if (v && !strcmp(a, "--threads")) {
            s.threads = (unsigned)strtoul(v, NULL, 10), i++;
        } else {
            usage(stderr);
            return 64;
        }
    }
    if (s.target == NULL || s.peer == NULL || s.threads < 1 || s.threads > 64 || s.inflight < 1 ||
        s.inflight > 64 || s.seconds < 0 || s.seconds > 3600 || (s.submit_wait && s.inflight > 1) ||
        (!do_write && !do_read)) {
        usage(stderr);
        return 64;
    }
    /* Segments large enough for every configuration, each thread its own slice. */
    s.seg_bytes = big;
    for (int i = 0; i < nblocks; i++) {
        for (int j = 0; j < nbatches; j++) {
            uint64_t need = blocks[i] * batches[j] * s.threads * s.inflight * (s.scatter ? 2 : 1);
            if (need > s.seg_bytes)
                s.seg_bytes = need;
        }
    }
    if (s.seg_bytes > (4ull << 30)) {
        fprintf(stderr,
                "mgbench: the largest configuration needs %" PRIu64
                " bytes of segment; at most 4 GiB\n",
                s.seg_bytes);
        return 64;
    }
    if (s.print_layout) {
        for (int i = 0; i < nblocks; i++)
            for (int j = 0; j < nbatches; j++)
                print_layout(&s, blocks[i], (unsigned)batches[j]);
        return 0;
    }
    snprintf(local_name, sizeof(local_name), "mgbench-local-%d", (int)getpid());
    snprintf(remote_name, sizeof(remote_name), "mgbench-remote-%d", (int)getpid());
    s.local_id = mgbench_register_segment(s.target, local_name, s.seg_bytes, 0);
    /* --peer "": copies on the target daemon, between two segments of its */
    s.remote_id = s.local_id ? mgbench_register_segment(s.peer[0] ? s.peer : s.target, remote_name,
                                                        s.seg_bytes, 1)
                             : 0;
    if (s.remote_id == 0) {
        if (s.local_id)
            mgbench_unregister_segment(s.target, s.local_id);
        return 1;
    }
    if (!s.cold && warm_up(&s) != 0)
        rc = 1;
    for (int op = 0; op < 2 && rc == 0; op++) {
        int write = op == 0;
        if ((write && !do_write) || (!write && !do_read))
            continue;
        for (int i = 0; i < nblocks; i++) {
            for (int j = 0; j < nbatches; j++)
                rc |= run(&s, write, blocks[i], (unsigned)batches[j], 20);
        }
        if (big) { /* one request of that size: one thread */
            setup one = s;
            one.threads = 1;
            rc |= run(&one, write, big, 1, 3);
        }
    }
    if (big && !s.peer[0]) /* copies: beside memcpy on one thread, in the same run */
        memcpy_reference(&s, big);
    mgbench_unregister_segment(s.target, s.local_id);
    mgbench_unregister_segment(s.peer[0] ? s.peer : s.target, s.remote_id);
    return rc ? 1 : 0;
}
