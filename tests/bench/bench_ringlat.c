/*
 * bench_ringlat: one 4 KiB WRITE at a time from C, to an agent's memory on a peer daemon, timed
 * from the post until the client sees its end — posted on a submission ring, or as a Submit
 * with wait (the same prepared pair) — for tests/bench/bench_ring.py. Prints one line per
 * transfer, "ring US" or "submit US", after `warm` unprinted ones of each.
 *
 *   bench_ringlat unix:SOCK PEER AGENT REMOTE_ADDR WAY COUNT [WARM 200] [SPIN_US 0] [BLOCKS]
 *
 * WAY: ring or submit: the remote range is REMOTE_ADDR..+4096 of AGENT on PEER. many: BLOCKS
 * (default 4096) blocks of 4 KiB at REMOTE_ADDR + k * 4096, one batch of pairs by index posted on
 * a ring at a time, each printed as "many POSTED_US ACCEPTED_US DONE_US": from the post until it
 * was written, until its acceptance completion was seen, until its end.
 */
#include "mg_client.h"

#include "moongate/ringwire.h"
#include "moongate/v1/transfer.pb-c.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int fail(const char *what, int status, const char *err)
{
    fprintf(stderr, "bench_ringlat: %s: %d %s\n", what, status, err);
    return 1;
}

/* BLOCKS blocks of 4 KiB to the agent's range at raddr, one batch of pairs at a time. */
static int many(mg_client *c, const char *peer, const char *agent, uint64_t raddr, int count,
                int warm, unsigned spin, uint32_t blocks)
{
    uint8_t *src = aligned_alloc(4096, (size_t)blocks * 4096);
    uint64_t *laddrs = calloc(blocks, sizeof(*laddrs)), *raddrs = calloc(blocks, sizeof(*raddrs));
    uint64_t *lens = calloc(blocks, sizeof(*lens)), ids[4], lo, ro;
    uint32_t *idx = calloc(blocks, sizeof(*idx));
    mg_client_ring *r = NULL;
    mg_registered how;
    char err[512];
    int status;
    if (src == NULL || laddrs == NULL || raddrs == NULL || lens == NULL || idx == NULL)
        return fail("many", 8, "out of memory");
    memset(src, 7, (size_t)blocks * 4096);
    for (uint32_t k = 0; k < blocks; k++) {
        laddrs[k] = (uintptr_t)src + (uint64_t)k * 4096;
        raddrs[k] = raddr + (uint64_t)k * 4096;
        lens[k] = 4096;
        idx[k] = k;
    }
    if (mg_client_register_any(c, (uintptr_t)src, (uint64_t)blocks * 4096, 0, "ringlat-many", ids,
                               4, &how, &status, err, sizeof(err)) < 0)
        return fail("register", status, err);
    if (mg_client_prepare_list(c, laddrs, lens, blocks, NULL, NULL, &lo, &status, err,
                               sizeof(err)) ||
        mg_client_prepare_list(c, raddrs, lens, blocks, peer, agent, &ro, &status, err,
                               sizeof(err)))
        return fail("prepare_list", status, err);
    if (mg_client_ring_attach(c, 4096, &r, &status, err, sizeof(err)) != 0)
        return fail("attach", status, err);
    for (int i = 0; i < warm + count; i++) {
        double t0 = now_us(), posted, accepted = 0;
        mg_ring_cqe cqe;
        int rc = mg_client_ring_post_pairs(r, MG_RING_WRITE, lo, idx, ro, idx, blocks, (uint64_t)i,
                                           MG_RING_ACCEPTED, NULL, NULL, 0);
        if (rc != 0)
            return fail("post", rc, "");
        posted = now_us();
        for (;;) {
            if (mg_client_ring_wait(r, &cqe, 1, 30000, spin) != 1 || cqe.code != 0)
                return fail("many", (int)cqe.code, cqe.why);
            if (!(cqe.flags & MG_RING_CQE_ACCEPTED))
                break;
            accepted = now_us();
        }
        if (cqe.done != blocks || accepted == 0)
            return fail("many", 13, "the batch ended without its acceptance, or short");
        if (i >= warm)
            printf("many %.2f %.2f %.2f\n", posted - t0, accepted - t0, now_us() - t0);
    }
    mg_client_ring_detach(r);
    free(src);
    free(laddrs);
    free(raddrs);
    free(lens);
    free(idx);
    return 0;
}

int main(int argc, char **argv)
{
    static uint8_t src[4096] __attribute__((aligned(4096)));
    char err[512];
    int status, ring = argc > 5 && strcmp(argv[5], "ring") == 0;
    int count = argc > 6 ? atoi(argv[6]) : 1000, warm = argc > 7 ? atoi(argv[7]) : 200;
    unsigned spin = argc > 8 ? (unsigned)atoi(argv[8]) : 0;
    uint64_t ids[4], lo, ro, raddr, len = 4096, laddr = (uintptr_t)src;
    uint32_t zero = 0;
    mg_registered how;
    mg_client_ring *r = NULL;
    mg_client *c;
    if (argc < 7) {
        fprintf(stderr, "usage: bench_ringlat unix:SOCK PEER AGENT REMOTE_ADDR ring|submit|many "
                        "COUNT [WARM] [SPIN_US] [BLOCKS]\n");
        return 64;
    }
    raddr = strtoull(argv[4], NULL, 0);
    memset(src, 7, sizeof(src));
    if ((c = mg_client_open(argv[1], NULL, err, sizeof(err))) == NULL)
        return fail("open", 14, err);
    if (strcmp(argv[5], "many") == 0) {
        int rc = many(c, argv[2], argv[3], raddr, count, warm, spin,
                      argc > 9 ? (uint32_t)strtoul(argv[9], NULL, 0) : 4096);
        mg_client_close(c);
        return rc;
    }
    if (mg_client_register_any(c, (uintptr_t)src, sizeof(src), 0, "ringlat-src", ids, 4, &how,
                               &status, err, sizeof(err)) < 0)
        return fail("register", status, err);
    if (mg_client_prepare_list(c, &laddr, &len, 1, NULL, NULL, &lo, &status, err, sizeof(err)) ||
        mg_client_prepare_list(c, &raddr, &len, 1, argv[2], argv[3], &ro, &status, err,
                               sizeof(err)))
        return fail("prepare_list", status, err);
    if (ring && mg_client_ring_attach(c, 256, &r, &status, err, sizeof(err)) != 0)
        return fail("attach", status, err);
    for (int i = 0; i < warm + count; i++) {
        double t0 = now_us();
        if (ring) {
            mg_ring_cqe cqe;
            int rc = mg_client_ring_post_pairs(r, MG_RING_WRITE, lo, &zero, ro, &zero, 1,
                                               (uint64_t)i, 0, NULL, NULL, 0);
            if (rc != 0)
                return fail("post", rc, "");
            if (mg_client_ring_wait(r, &cqe, 1, 30000, spin) != 1 || cqe.code != 0)
                return fail("ring", (int)cqe.code, cqe.why);
        } else {
            Moongate__V1__SubmitRequest req = MOONGATE__V1__SUBMIT_REQUEST__INIT;
            Moongate__V1__Prepared p = MOONGATE__V1__PREPARED__INIT, *pp = &p;
            Moongate__V1__SubmitResponse *resp;
            p.op = MOONGATE__V1__TRANSFER_OP__WRITE;
            p.local_list = lo;
            p.remote_list = ro;
            p.n_local_indices = p.n_remote_indices = 1;
            p.local_indices = p.remote_indices = &zero;
            req.n_prepared = 1;
            req.prepared = &pp;
            req.wait = 1;
            req.brief = 1;
            resp = mg_client_call_msg(c, "/moongate.v1.Transfer/Submit", &req.base,
                                      &moongate__v1__submit_response__descriptor, 30000, &status,
                                      err, sizeof(err));
            if (resp == NULL || resp->batch == NULL ||
                resp->batch->state != MOONGATE__V1__REQUEST_STATE__DONE)
                return fail("submit", status, err);
            protobuf_c_message_free_unpacked(&resp->base, NULL);
        }
        if (i >= warm)
            printf("%s %.2f\n", ring ? "ring" : "submit", now_us() - t0);
    }
    mg_client_ring_detach(r);
    mg_client_close(c);
    return 0;
}
