/*
 * svc_transfer_digest: requests of batches with a digest (SubmitRequest.digest) that moved over
 * RDMA. Over TCP each slice's CRC32C rides on its frame and the receiver checks it as the bytes
 * land (the data plane); over RDMA the bytes never pass through the daemon that received them.
 * So once such a request has moved, this daemon takes the CRC32C of its local range on a worker
 * and asks the peer for that of the remote range (Peer/Checksum, on the peer's worker): for a
 * WRITE the peer's is of the landed bytes, for a READ ours is. The request ends DONE when they
 * agree, DATA_LOSS when they differ — before any notification of its batch is due. Loop thread
 * only (the CRC on the workers).
 */
#include "svc_transfer.h"

#include "mg_peer_rpc.h"

#include "mg_log.h"

#include "moongate/v1/memory.pb-c.h"
#include "moongate/v1/peer.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct verify {
    struct mg_transfer_svc *ts;
    mg_batch_req *r;
    uint32_t local; /* the CRC32C of the local range */
    int rc;
    char why[160];
} verify;

/* Ends v's request (err 0: DONE), unless it was stopped meanwhile: then as its stop word says. */
static void verify_end(verify *v, int err, const char *msg)
{
    mg_batch_req *r = v->r;
    int stopped = mg_xfer_req_stopped(&r->x);
    free(v);
    if (stopped)
        mg_batch_req_end(r, stopped,
                         stopped == MG_ERR_CANCELLED ? "stopped (cancelled)" : "stopped");
    else
        mg_batch_req_end(r, err, msg);
}

static void remote_answered(void *arg, int status, const char *message, ProtobufCMessage *m)
{
    verify *v = arg;
    mg_batch_req *r = v->r;
    Moongate__V1__ChecksumResponse *a = (void *)m;
    char msg[400];
    if (transfer_closing(v->ts)) {
        free(v);
    } else if (a == NULL) {
        snprintf(msg, sizeof(msg), "digest: peer %s did not give the CRC32C of the range: %s (%s)",
                 r->peer->addr, message && *message ? message : "no answer",
                 mg_grpc_code_name(status));
        verify_end(v, MG_ERR_UNAVAILABLE, msg);
    } else if (a->crc32c != v->local) {
        snprintf(msg, sizeof(msg),
                 "digest: the CRC32C of the bytes that landed %s (%08x) differs from the "
                 "source's (%08x)",
                 r->write ? "on the peer" : "here", r->write ? a->crc32c : v->local,
                 r->write ? v->local : a->crc32c);
        verify_end(v, MG_ERR_DATA_LOSS, msg);
    } else {
        verify_end(v, 0, NULL);
    }
    if (a)
        moongate__v1__checksum_response__free_unpacked(a, NULL);
}

static int local_work(void *arg)
{
    verify *v = arg;
    v->rc = mg_segment_crc32c(v->r->local, v->r->local_addr, v->r->length, &v->local, v->why,
                              sizeof(v->why));
    return 0;
}

static void local_done(void *arg, int result)
{
    verify *v = arg;
    mg_batch_req *r = v->r;
    Moongate__V1__PeerChecksumRequest req = MOONGATE__V1__PEER_CHECKSUM_REQUEST__INIT;
    char err[256], msg[400];
    (void)result;
    if (transfer_closing(v->ts)) {
        free(v);
        return;
    }
    if (v->rc != 0) {
        snprintf(msg, sizeof(msg), "digest: reading the local range: %s", v->why);
        verify_end(v, v->rc, msg);
        return;
    }
    req.tenant = r->b->tenant;
    req.target = r->remote_segment;
    req.lease = r->remote_lease;
    req.offset = r->remote_offset;
    req.length = r->length;
    if (mg_peer_unary(v->ts->gw, mg_peer_chan_of(r->peer), r->peer->addr,
                      "/moongate.v1.Peer/Checksum", &req.base,
                      &moongate__v1__checksum_response__descriptor, remote_answered, v, err,
                      sizeof(err)) != 0) {
        snprintf(msg, sizeof(msg), "digest: asking peer %s: %s", r->peer->addr, err);
        verify_end(v, MG_ERR_UNAVAILABLE, msg);
    }
}

void mg_xfer_verify(void *arg, mg_batch_req *r)
{
    struct mg_transfer_svc *ts = arg;
    verify *v = calloc(1, sizeof(*v));
    int rc;
    if (v == NULL) {
        mg_batch_req_end(r, MG_ERR_NOMEM, "digest: out of memory");
        return;
    }
    *v = (verify){.ts = ts, .r = r};
    if ((rc = mg_engine_submit(ts->gw->engine, ts->gw->cq, local_work, local_done, v)) != 0) {
        free(v);
        mg_batch_req_end(r, rc, "digest: the engine's queue is full (--queue-depth)");
    }
}
