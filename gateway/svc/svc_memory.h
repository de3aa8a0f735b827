/* svc_memory.h: what the memory service's two files share (svc_memory.c: registration;
 * svc_memory_io.c: ReadSegment and WriteSegment). */
#ifndef SVC_MEMORY_H
#define SVC_MEMORY_H

#include "mg_gateway.h"

/* Adds ReadSegment and WriteSegment (called by the memory service's init). */
int mg_svc_memory_io_init(mg_gateway *gw);

struct mg_segment;
/* Unmaps a segment already marked UNREGISTERING on a worker, answering `call` (NULL: nobody
 * waits). Returns 0, or an MG_ERR_* with the segment still registered. */
int mg_memory_unmap(mg_gateway *gw, struct mg_segment *seg, mg_call *call);
/* svc_memory_exit.c: a registered process segment is released (unregistered) by the daemon
 * once its process has exited and nothing holds it. */
void mg_memory_watch_exit(mg_gateway *gw, struct mg_segment *seg);
/* Unregisters segments `ids` of process `proc` (each once nobody holds it; tried again every
 * second), logging `reason` (a static string). Those already gone are simply not found. */
void mg_memory_release(mg_gateway *gw, const mg_proc *proc, const uint64_t *ids, size_t n,
                       const char *reason);
/* Drops every watch (the service's free). */
void mg_memory_watches_free(mg_gateway *gw);

#endif
