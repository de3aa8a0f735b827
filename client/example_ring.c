/*
 * A submission ring from C (docs/api.md, "Submission rings"): this process registers a buffer
 * of its own, prepares lists (its buffer's 16 blocks of 4 KiB and 16 blocks of an agent's
 * memory on a peer; and each side whole, one range), attaches a ring and posts on it: 16 pairs
 * with a notification for the peer, then one strided group (the first 512 bytes of every other
 * block, side by side into the agent's first block), waiting for each end. Built with the project
 * so that the example keeps compiling.
 *
 *   example_ring unix:/run/moongate/moongate.sock PEER AGENT REMOTE_ADDRESS
 *
 * The agent's memory is REMOTE_ADDRESS..+64 KiB, registered remote-accessible by it. Prints
 * "ok ring N batches B1 B2" and exits 0; else the failure's gRPC code.
 */
#include "mg_client.h"

#include "moongate/ringwire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK  4096
#define BLOCKS 16

static int fail(const char *what, int status, const char *why)
{
    fprintf(stderr, "%s: %d %s\n", what, status, why);
    return status ? status : 1;
}

int main(int argc, char **argv)
{
    static uint8_t buf[BLOCK * BLOCKS] __attribute__((aligned(4096)));
    uint64_t ids[4], laddr[BLOCKS], raddr[BLOCKS], lens[BLOCKS], lo, ro, lall, rall, base;
    uint64_t all = sizeof(buf);
    uint32_t idx[BLOCKS];
    mg_registered how;
    mg_client_ring *ring;
    mg_ring_cqe done;
    mg_client *c;
    char err[512];
    int status, rc;
    if (argc != 5) {
        fprintf(stderr, "usage: example_ring unix:SOCKET PEER AGENT REMOTE_ADDRESS\n");
        return 64;
    }
    base = strtoull(argv[4], NULL, 0);
    for (int i = 0; i < BLOCKS; i++) {
        memset(buf + i * BLOCK, 'a' + i, BLOCK);
        laddr[i] = (uintptr_t)buf + (uint64_t)i * BLOCK;
        raddr[i] = base + (uint64_t)i * BLOCK;
        lens[i] = BLOCK;
        idx[i] = (uint32_t)i;
    }
    if ((c = mg_client_open(argv[1], getenv("MOONGATE_TOKEN"), err, sizeof(err))) == NULL)
        return fail("open", 14, err);
    if (mg_client_register_any(c, (uintptr_t)buf, sizeof(buf), 0, NULL, ids, 4, &how, &status, err,
                               sizeof(err)) < 0)
        return fail("register", status, err);
    if (mg_client_prepare_list(c, laddr, lens, BLOCKS, NULL, NULL, &lo, &status, err,
                               sizeof(err)) != 0 ||
        mg_client_prepare_list(c, raddr, lens, BLOCKS, argv[2], argv[3], &ro, &status, err,
                               sizeof(err)) != 0)
        return fail("prepare_list", status, err);
    if (mg_client_prepare_list(c, laddr, &all, 1, NULL, NULL, &lall, &status, err, sizeof(err)) !=
            0 || /* each side whole, for strided groups */
        mg_client_prepare_list(c, raddr, &all, 1, argv[2], argv[3], &rall, &status, err,
                               sizeof(err)) != 0)
        return fail("prepare_list", status, err);
    if (mg_client_ring_attach(c, 64, &ring, &status, err, sizeof(err)) != 0)
        return fail("attach", status, err);
    /* every block, by index, and a notification for the peer's topic "ring-example" */
    rc = mg_client_ring_post_pairs(ring, MG_RING_WRITE, lo, idx, ro, idx, BLOCKS, 1, 0,
                                   "ring-example", "landed", 6);
    if (rc != 0 || mg_client_ring_wait(ring, &done, 1, 30000, 0) != 1 || done.code != 0)
        return fail("pairs", rc ? rc : (int)done.code, done.why);
    printf("ok ring %llu batches %llu", (unsigned long long)mg_client_ring_id(ring),
           (unsigned long long)done.batch_id);
    /* the first 512 bytes of every other block into the agent's first block, side by side */
    rc = mg_client_ring_post_strided(ring, MG_RING_WRITE, lall, 0, 0, 2 * BLOCK, rall, 0, 0, 512,
                                     512, BLOCKS / 2, 2, 0);
    if (rc != 0 || mg_client_ring_wait(ring, &done, 1, 30000, 0) != 1 || done.code != 0)
        return fail("strided", rc ? rc : (int)done.code, done.why);
    printf(" %llu\n", (unsigned long long)done.batch_id);
    mg_client_ring_detach(ring);
    mg_client_close(c);
    return 0;
}
