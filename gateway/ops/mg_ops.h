/*
 * mg_ops: the ops pages (/livez, /readyz, /healthz, /metrics, /status.json, /traces and the
 * status page at /) and the plaintext HTTP/1.1 ops port that serves them beside the control
 * port. What ops' own files share; nothing outside gateway/ops includes it. The daemon reaches
 * ops only through its descriptor (mg_ops_service, listed in mg_services.c), as it reaches a
 * service. Loop thread.
 */
#ifndef MG_OPS_H
#define MG_OPS_H

#include "mg_gateway.h"

#include <stdint.h>

struct evbuffer;

/* What the ops port counts of its own connections. */
typedef struct mg_ops_counts {
    uint64_t refused;         /* over --ops-max-connections */
    uint64_t header_timeouts; /* closed: the request not whole in time */
} mg_ops_counts;

/* mg_ops_metrics.c: the Prometheus text of /metrics: the daemon's and the engine's figures,
 * each service's block between them. ops: the port's counts (all 0 without the port). */
void mg_ops_metrics(mg_gateway *gw, const mg_ops_counts *ops, struct evbuffer *out);

#endif
