/*
 * GPU memory (docs/gpu.md): this process allocates device memory with the CUDA driver (loaded
 * at run time by the client library: libcuda.so.1, or $MOONGATE_CUDA_LIB), registers it with
 * the daemon by its dma-buf (mg_vram_register) and says what the daemon made of it. Built with
 * the project so that the example keeps compiling against the library.
 *
 *   example_vram unix:/run/moongate/moongate.sock BYTES   (MOONGATE_TOKEN: a bearer token)
 *
 * Prints "ok vram 0xADDR BYTES: N segment(s) ID..." and exits 0; else the reason, exit 1.
 */
#include "mg_client.h"
#include "mg_cuda.h"
#include "mg_vram.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    struct event_base *base = event_base_new();
    mg_client_options o = {0};
    const mg_cuda *cu;
    mg_cu_context ctx;
    mg_cu_ptr d;
    mg_client *c;
    uint64_t ids[8];
    size_t size;
    int status, n;
    char err[512];

    if (argc < 3) {
        fprintf(stderr, "usage: example_vram unix:/path/to/moongate.sock BYTES\n");
        return 64;
    }
    size = strtoull(argv[2], NULL, 0);
    if ((cu = mg_cuda_get(err, sizeof(err))) == NULL) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (cu->cuDevicePrimaryCtxRetain(&ctx, 0) || cu->cuCtxSetCurrent(ctx) ||
        cu->cuMemAlloc(&d, size)) {
        fprintf(stderr, "cannot allocate %zu bytes of device memory\n", size);
        return 1;
    }
    o.target = argv[1];
    o.token = getenv("MOONGATE_TOKEN");
    if (mg_client_new(&c, base, &o, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    /* The registrations live as long as this connection: the daemon lets go when it closes. */
    n = mg_vram_register(c, (uintptr_t)d, size, 1, "example", ids, 8, &status, err, sizeof(err));
    if (n < 0) {
        fprintf(stderr, "mg_vram_register: %s (%s)\n", err, mg_grpc_code_name(status));
        return 1;
    }
    printf("ok vram 0x%llx %zu: %d segment(s)", (unsigned long long)d, size, n);
    for (int i = 0; i < n; i++)
        printf(" %llu", (unsigned long long)ids[i]);
    printf("\n");
    mg_client_del(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    cu->cuMemFree(d);
    return 0;
}
