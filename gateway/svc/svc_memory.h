/* svc_memory.h: what the memory service's two files share (svc_memory.c: registration;
 * svc_memory_io.c: ReadSegment, WriteSegment and Checksum). */
#ifndef SVC_MEMORY_H
#define SVC_MEMORY_H

#include "mg_gateway.h"
#include "mg_service.h"

/* What /metrics counts of the memory calls (the unregistrations are the core's:
 * mg_gateway_unmap counts every one). */
typedef struct mg_segment_stats {
    uint64_t registered_total;
    uint64_t failed_total[MG_GRPC_CODE_COUNT]; /* by the gRPC code the client got */
    uint64_t in_flight;                        /* registrations on workers now */
    uint64_t buckets[12];                      /* registration seconds, see mg_metrics.c */
    double seconds_sum;
    uint64_t inline_read_bytes;    /* ReadSegment */
    uint64_t inline_written_bytes; /* WriteSegment */
    uint64_t write_queued_bytes;   /* WriteSegment messages received, not yet applied */
} mg_segment_stats;

struct mg_memory_svc {
    mg_segment_stats stats;
};

extern const mg_service mg_svc_memory;

/* The service's state, kept in its slot of the gateway (mg_gateway_state); NULL without a
 * segment registry (no memory call is served then). */
static inline struct mg_memory_svc *memory_of(mg_gateway *gw)
{
    return *mg_gateway_state(gw, &mg_svc_memory);
}

/* Adds ReadSegment, WriteSegment and Checksum (called by the memory service's init). */
int mg_svc_memory_io_init(mg_gateway *gw);

#endif
