/*
 * mg_rdma_wire: the RDMA handshake's wire form (moongate.v1.RdmaEndpoint) and its checks. What a
 * peer sends is checked before any of it reaches a verbs call: a 16-byte GID, an MTU verbs
 * knows, 1 to MG_RDMA_MAX_QPS queue pairs with as many PSNs, every number within 24 bits.
 */
#ifndef MG_RDMA_WIRE_H
#define MG_RDMA_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "moongate/rdma.h"
#include "moongate/v1/peer.pb-c.h"

/* An endpoint's message and the storage it points into. */
typedef struct mg_rdma_wire {
    Moongate__V1__RdmaEndpoint msg;
    uint8_t gid[16];
    uint32_t qpn[MG_RDMA_MAX_QPS], psn[MG_RDMA_MAX_QPS];
} mg_rdma_wire;

/* Fills w from ep (w->msg is then ready to pack). */
void mg_rdma_wire_encode(const mg_rdma_ep *ep, mg_rdma_wire *w);
/* Checks and converts a received endpoint. Returns 0, or -1 with what is wrong in why. */
int mg_rdma_wire_decode(const Moongate__V1__RdmaEndpoint *m, mg_rdma_ep *ep, char *why,
                        size_t whycap);

#endif
