/*
 * mg_rdma_wire: see mg_rdma_wire.h.
 */
#include "mg_rdma_wire.h"

#include <stdio.h>
#include <string.h>

void mg_rdma_wire_encode(const mg_rdma_ep *ep, mg_rdma_wire *w)
{
    moongate__v1__rdma_endpoint__init(&w->msg);
    memcpy(w->gid, ep->gid, sizeof(w->gid));
    w->msg.gid.data = w->gid;
    w->msg.gid.len = sizeof(w->gid);
    w->msg.lid = ep->lid;
    w->msg.mtu = ep->mtu;
    for (unsigned i = 0; i < ep->nqps && i < MG_RDMA_MAX_QPS; i++) {
        w->qpn[i] = ep->qpn[i];
        w->psn[i] = ep->psn[i];
    }
    w->msg.qpn = w->qpn;
    w->msg.psn = w->psn;
    w->msg.n_qpn = w->msg.n_psn = ep->nqps;
}

int mg_rdma_wire_decode(const Moongate__V1__RdmaEndpoint *m, mg_rdma_ep *ep, char *why,
                        size_t whycap)
{
    memset(ep, 0, sizeof(*ep));
    if (m == NULL) {
        snprintf(why, whycap, "no RDMA endpoint");
        return -1;
    }
    if (m->gid.len != 16) {
        snprintf(why, whycap, "an RDMA GID has 16 bytes, not %zu", m->gid.len);
        return -1;
    }
    if (m->mtu != 256 && m->mtu != 512 && m->mtu != 1024 && m->mtu != 2048 && m->mtu != 4096) {
        snprintf(why, whycap, "RDMA MTU %u is not 256, 512, 1024, 2048 or 4096", m->mtu);
        return -1;
    }
    if (m->lid > 0xffff) {
        snprintf(why, whycap, "LID %u does not fit 16 bits", m->lid);
        return -1;
    }
    if (m->n_qpn < 1 || m->n_qpn > MG_RDMA_MAX_QPS || m->n_psn != m->n_qpn) {
        snprintf(why, whycap, "%zu queue pairs with %zu PSNs (1 to %d, as many PSNs)", m->n_qpn,
                 m->n_psn, MG_RDMA_MAX_QPS);
        return -1;
    }
    for (size_t i = 0; i < m->n_qpn; i++) {
        if (m->qpn[i] == 0 || m->qpn[i] > 0xffffff || m->psn[i] > 0xffffff) {
            snprintf(why, whycap, "queue pair %zu: QPN %u or PSN %u is not a 24-bit number", i,
                     m->qpn[i], m->psn[i]);
            return -1;
        }
        ep->qpn[i] = m->qpn[i];
        ep->psn[i] = m->psn[i];
    }
    memcpy(ep->gid, m->gid.data, 16);
    ep->lid = (uint16_t)m->lid;
    ep->mtu = m->mtu;
    ep->nqps = (unsigned)m->n_qpn;
    return 0;
}
