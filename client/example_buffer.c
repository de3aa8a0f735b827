/*
 * Buffers the client library allocates (docs/clients.md): two buffers, each a sealed memfd
 * mapped here and registered by the daemon where it lies, in one call; a transfer names its
 * local bytes by their address in this process, and its bytes land in the other buffer's
 * mapping here, with no copy through the daemon's pool. Built with the project so that the
 * example keeps compiling against the library.
 *
 *   example_buffer unix:/run/moongate/moongate.sock      (MOONGATE_TOKEN: a bearer token)
 *
 * Prints "ok <bytes> bytes from <address> into segment <id>" and exits 0.
 */
#include "mg_client.h"

#include "moongate/v1/transfer.pb-c.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIZE (1 << 20)

/* One WRITE from `addr` (this process) to segment `dst` on this daemon (peer ""), waited for.
 * Returns 0 when it is DONE. */
static int copy_by_address(mg_client *c, const void *addr, uint64_t dst, size_t len)
{
    Moongate__V1__SubmitRequest req = MOONGATE__V1__SUBMIT_REQUEST__INIT;
    Moongate__V1__TransferRequest t = MOONGATE__V1__TRANSFER_REQUEST__INIT, *tp = &t;
    Moongate__V1__SubmitResponse *r;
    uint8_t buf[128], *resp = NULL;
    size_t n, resp_len = 0;
    int status, rc = -1;
    char msg[512];
    t.op = MOONGATE__V1__TRANSFER_OP__WRITE;
    t.local_address = (uint64_t)(uintptr_t)addr; /* instead of a segment id */
    t.peer = "";
    t.remote_segment = dst;
    t.length = len;
    req.requests = &tp;
    req.n_requests = 1;
    req.wait = 1;
    n = moongate__v1__submit_request__pack(&req, buf);
    if (mg_client_call(c, "/moongate.v1.Transfer/Submit", buf, n, 30000, &resp, &resp_len, &status,
                       msg, sizeof(msg)) != 0 ||
        status != 0) {
        fprintf(stderr, "Submit: %d %s\n", status, msg);
        return -1;
    }
    r = moongate__v1__submit_response__unpack(NULL, resp_len, resp);
    if (r && r->batch && r->batch->state == MOONGATE__V1__REQUEST_STATE__DONE)
        rc = 0;
    else if (r && r->batch && r->batch->n_requests)
        fprintf(stderr, "request failed: %s\n", r->batch->requests[0]->message);
    moongate__v1__submit_response__free_unpacked(r, NULL);
    free(resp);
    return rc;
}

int main(int argc, char **argv)
{
    struct event_base *base = event_base_new();
    mg_client_options o = {0};
    mg_client *c;
    mg_buffer a, b;
    int status, rc = 1;
    char err[512];

    if (argc < 2) {
        fprintf(stderr, "usage: example_buffer unix:/path/to/moongate.sock\n");
        return 64;
    }
    o.target = argv[1];
    o.token = getenv("MOONGATE_TOKEN");
    if (mg_client_new(&c, base, &o, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (mg_buffer_alloc(c, SIZE, 0, NULL, &a, &status, err, sizeof(err)) != 0 ||
        mg_buffer_alloc(c, SIZE, 0, NULL, &b, &status, err, sizeof(err)) != 0) {
        fprintf(stderr, "mg_buffer_alloc: %d %s\n", status, err);
        return status;
    }
    strcpy((char *)a.addr + 4096, "hello from a buffer");
    if (copy_by_address(c, (char *)a.addr + 4096, b.segment_id, 64 * 1024) == 0 &&
        strcmp(b.addr, "hello from a buffer") == 0) { /* in b's mapping, here */
        printf("ok %d bytes from %p into segment %llu\n", 64 * 1024,
               (void *)((char *)a.addr + 4096), (unsigned long long)b.segment_id);
        rc = 0;
    }
    if (mg_buffer_free(c, &a, &status, err, sizeof(err)) != 0 ||
        mg_buffer_free(c, &b, &status, err, sizeof(err)) != 0) {
        fprintf(stderr, "mg_buffer_free: %d %s\n", status, err);
        rc = 1;
    }
    mg_client_del(c);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    return rc;
}
