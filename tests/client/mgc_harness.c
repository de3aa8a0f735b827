/*
 * mgc_harness: a program on moongate's C client (libmgclient, mg_client_open), driven line by
 * line on stdin by tests/integration/test_restart.py. Each command prints one line:
 *   agent NAME             -> "port P"          (Agent/RegisterAgent, port 0)
 *   buffer SIZE            -> "buffer ID ADDR"  (mg_buffer_alloc, remote-accessible)
 *   process NAME SIZE      -> "process ID ADDR" (malloc'd, RegisterSegment source PROCESS)
 *   anon NAME SIZE         -> "anon ID"         (RegisterSegment of a daemon-made file)
 *   fill ADDR BYTE LEN     -> "ok"              (memset here)
 *   check ADDR BYTE LEN    -> "ok" or "differs at N" (device memory: copied out first)
 *   copy FROM TO LEN       -> "DONE"            (Submit with wait: a WRITE from segment FROM
 *                                                to segment TO on this daemon, by the ids
 *                                                handed out, mapped by mg_client_segment_now)
 *   vram SIZE              -> "vram ID ADDR"    (device memory of the CUDA driver, its primary
 *                                                context, mg_vram_register: one allocation)
 *   any KIND SIZE          -> "any N ID ADDR KIND PATH" (mg_client_register_any, remote-accessible,
 *                                                of malloc'd memory, "pinned" host memory
 *                                                (cuMemHostAlloc), "device" memory, or a
 *                                                "freed" device pointer; ID the first of N)
 *   now ID                 -> "now ID2"         (mg_client_segment_now)
 *   unregister ID          -> "ok"
 *   epoch                  -> "epoch E restarts R"
 * A call that fails prints "error CODE message".
 */
#include "mg_client.h"
#include "mg_cuda.h"
#include "mg_vram.h"

#include "moongate/v1/agent.pb-c.h"
#include "moongate/v1/memory.pb-c.h"
#include "moongate/v1/transfer.pb-c.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *held[64]; /* process memory registered, freed at the end */
static int n_held;

static void fail(int status, const char *err)
{
    printf("error %s %s\n", mg_grpc_code_name(status), err);
}

static void agent(mg_client *c, const char *name)
{
    Moongate__V1__RegisterAgentRequest q = MOONGATE__V1__REGISTER_AGENT_REQUEST__INIT;
    Moongate__V1__AgentInfo *a;
    char err[512];
    int st;
    q.name = (char *)name;
    a = mg_client_call_msg(c, "/moongate.v1.Agent/RegisterAgent", &q.base,
                           &moongate__v1__agent_info__descriptor, 10000, &st, err, sizeof(err));
    if (a == NULL)
        return fail(st, err);
    printf("port %u\n", a->port);
    moongate__v1__agent_info__free_unpacked(a, NULL);
}

static void segment(mg_client *c, const char *name, int process, size_t size)
{
    Moongate__V1__RegisterRequest q = MOONGATE__V1__REGISTER_REQUEST__INIT;
    char err[512];
    int st;
    uint64_t id;
    void *p = process && n_held < 64 ? (held[n_held++] = calloc(1, size)) : NULL;
    q.name = (char *)name;
    q.size = size;
    if (process) {
        q.source = MOONGATE__V1__SEGMENT_SOURCE__PROCESS;
        q.client_address = (uint64_t)(uintptr_t)p;
    }
    if (mg_client_register(c, &q, &id, &st, err, sizeof(err)) != 0)
        return fail(st, err);
    if (process)
        printf("process %llu %llu\n", (unsigned long long)id, (unsigned long long)(uintptr_t)p);
    else
        printf("anon %llu\n", (unsigned long long)id);
}

static void copy(mg_client *c, uint64_t from, uint64_t to, uint64_t len)
{
    Moongate__V1__TransferRequest r = MOONGATE__V1__TRANSFER_REQUEST__INIT, *rs[1] = {&r};
    Moongate__V1__SubmitRequest q = MOONGATE__V1__SUBMIT_REQUEST__INIT;
    Moongate__V1__SubmitResponse *s;
    char err[512];
    int st;
    r.op = MOONGATE__V1__TRANSFER_OP__WRITE;
    r.local_segment = mg_client_segment_now(c, from);
    r.remote_segment = mg_client_segment_now(c, to);
    r.peer = "";
    r.length = len;
    q.n_requests = 1;
    q.requests = rs;
    q.wait = 1;
    s = mg_client_call_msg(c, "/moongate.v1.Transfer/Submit", &q.base,
                           &moongate__v1__submit_response__descriptor, 10000, &st, err,
                           sizeof(err));
    if (s == NULL)
        return fail(st, err);
    if (s->batch && s->batch->state == MOONGATE__V1__REQUEST_STATE__DONE)
        printf("DONE\n");
    else if (s->batch && s->batch->n_requests &&
             s->batch->requests[0]->state == MOONGATE__V1__REQUEST_STATE__FAILED)
        printf("error %s %s\n", mg_grpc_code_name(s->batch->requests[0]->code),
               s->batch->requests[0]->message);
    else
        printf("error UNKNOWN the batch did not end\n");
    moongate__v1__submit_response__free_unpacked(s, NULL);
}

static void vram(mg_client *c, size_t size)
{
    const mg_cuda *cu;
    mg_cu_context ctx;
    mg_cu_ptr d;
    uint64_t id;
    char err[512];
    int st;
    if ((cu = mg_cuda_get(err, sizeof(err))) == NULL)
        return fail(MG_GRPC_FAILED_PRECONDITION, err);
    if (cu->cuDevicePrimaryCtxRetain(&ctx, 0) || cu->cuCtxSetCurrent(ctx) ||
        cu->cuMemAlloc(&d, size))
        return fail(MG_GRPC_RESOURCE_EXHAUSTED, "no device memory");
    if (mg_vram_register(c, (uintptr_t)d, size, 0, "c-vram", &id, 1, &st, err, sizeof(err)) != 1)
        return fail(st, err);
    printf("vram %llu %llu\n", (unsigned long long)id, (unsigned long long)d);
}

/* SIZE bytes of KIND (malloc, pinned, device, freed) for "any"; NULL with err. */
static void *any_memory(const char *kind, size_t size, char *err, size_t errcap)
{
    const char *lib = getenv("MOONGATE_CUDA_LIB");
    int (*host_alloc)(void **, size_t, unsigned) = NULL;
    const mg_cuda *cu;
    mg_cu_context ctx;
    mg_cu_ptr d;
    void *h, *p = NULL;
    if (strcmp(kind, "malloc") == 0)
        return n_held < 64 ? (held[n_held++] = calloc(1, size)) : NULL;
    if ((cu = mg_cuda_get(err, errcap)) == NULL)
        return NULL;
    if (cu->cuDevicePrimaryCtxRetain(&ctx, 0) || cu->cuCtxSetCurrent(ctx))
        return NULL;
    if (strcmp(kind, "pinned") == 0) {
        h = dlopen(lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (h != NULL)
            *(void **)&host_alloc = dlsym(h, "cuMemHostAlloc");
        if (host_alloc == NULL || host_alloc(&p, size, 0) != 0)
            return NULL;
        return memset(p, 0, size);
    }
    if (cu->cuMemAlloc(&d, size))
        return NULL;
    if (strcmp(kind, "freed") == 0 && cu->cuMemFree(d))
        return NULL;
    return (void *)(uintptr_t)d;
}

static void any(mg_client *c, const char *kind, size_t size)
{
    uint64_t ids[8];
    mg_registered how;
    char err[1024] = "no such memory";
    int st, n;
    void *p = any_memory(kind, size, err, sizeof(err));
    if (p == NULL)
        return fail(MG_GRPC_RESOURCE_EXHAUSTED, err);
    n = mg_client_register_any(c, (uintptr_t)p, size, 1, NULL, ids, 8, &how, &st, err, sizeof(err));
    if (n < 0)
        return fail(st, err);
    printf("any %d %llu %llu %s %s\n", n, (unsigned long long)ids[0],
           (unsigned long long)(uintptr_t)p, how.kind, how.path[0] ? how.path : "-");
}

static void check(const char *a, const char *v, const char *n)
{
    const unsigned char *p = (const unsigned char *)(uintptr_t)strtoull(a, NULL, 0);
    unsigned char byte = (unsigned char)strtoul(v, NULL, 0);
    size_t len = strtoull(n, NULL, 0);
    mg_cuda_ptr_info info;
    const mg_cuda *cu = mg_cuda_get(NULL, 0);
    unsigned char *copy = NULL;
    if (cu != NULL && mg_cuda_pointer(cu, (uintptr_t)p, &info) == 1) {
        if ((copy = malloc(len)) == NULL || cu->cuMemcpyDtoH(copy, (uintptr_t)p, len) != 0) {
            free(copy);
            printf("differs at 0 (the device copy failed)\n");
            return;
        }
        p = copy;
    }
    for (size_t i = 0; i < len; i++)
        if (p[i] != byte) {
            printf("differs at %zu\n", i);
            free(copy);
            return;
        }
    printf("ok\n");
    free(copy);
}

int main(int argc, char **argv)
{
    char line[512], err[512], a[160], b[64], n[64];
    mg_client *c;
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2 ||
        (c = mg_client_open(argv[1], getenv("MOONGATE_TOKEN"), err, sizeof(err))) == NULL) {
        fprintf(stderr, "usage: mgc_harness unix:/path (%s)\n", argc == 2 ? err : "");
        return 2;
    }
    while (fgets(line, sizeof(line), stdin)) {
        int st;
        if (sscanf(line, "agent %159s", a) == 1) {
            agent(c, a);
        } else if (sscanf(line, "buffer %63s", n) == 1) {
            mg_buffer buf;
            if (mg_buffer_alloc(c, strtoull(n, NULL, 0), 1, NULL, &buf, &st, err, sizeof(err)))
                fail(st, err);
            else
                printf("buffer %llu %llu\n", (unsigned long long)buf.segment_id,
                       (unsigned long long)(uintptr_t)buf.addr);
        } else if (sscanf(line, "process %159s %63s", a, n) == 2) {
            segment(c, a, 1, strtoull(n, NULL, 0));
        } else if (sscanf(line, "anon %159s %63s", a, n) == 2) {
            segment(c, a, 0, strtoull(n, NULL, 0));
        } else if (sscanf(line, "fill %159s %63s %63s", a, b, n) == 3) {
            memset((void *)(uintptr_t)strtoull(a, NULL, 0), (int)strtoul(b, NULL, 0),
                   strtoull(n, NULL, 0));
            printf("ok\n");
        } else if (sscanf(line, "check %159s %63s %63s", a, b, n) == 3) {
            check(a, b, n);
        } else if (sscanf(line, "copy %159s %63s %63s", a, b, n) == 3) {
            copy(c, strtoull(a, NULL, 0), strtoull(b, NULL, 0), strtoull(n, NULL, 0));
        } else if (sscanf(line, "any %159s %63s", a, n) == 2) {
            any(c, a, strtoull(n, NULL, 0));
        } else if (sscanf(line, "vram %63s", n) == 1) {
            vram(c, strtoull(n, NULL, 0));
        } else if (sscanf(line, "now %63s", n) == 1) {
            printf("now %llu\n",
                   (unsigned long long)mg_client_segment_now(c, strtoull(n, NULL, 0)));
        } else if (sscanf(line, "unregister %63s", n) == 1) {
            if (mg_client_unregister(c, strtoull(n, NULL, 0), &st, err, sizeof(err)) != 0)
                fail(st, err);
            else
                printf("ok\n");
        } else if (strncmp(line, "epoch", 5) == 0) {
            printf("epoch %llu restarts %u\n", (unsigned long long)mg_client_epoch(c),
                   mg_client_restarts(c));
        } else {
            printf("error INVALID_ARGUMENT unknown command\n");
        }
    }
    mg_client_close(c);
    while (n_held > 0)
        free(held[--n_held]);
    return 0;
}
