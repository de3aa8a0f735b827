/* svc_memory.h: what the memory service's two files share (svc_memory.c: registration;
 * svc_memory_io.c: ReadSegment and WriteSegment). */
#ifndef SVC_MEMORY_H
#define SVC_MEMORY_H

#include "mg_gateway.h"

/* Adds ReadSegment and WriteSegment (called by the memory service's init). */
int mg_svc_memory_io_init(mg_gateway *gw);

#endif
