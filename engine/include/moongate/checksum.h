/*
 * moongate checksum: the CRC32C of a range of registered memory, taken on an engine worker for
 * whoever asks on the loop (the memory service's Checksum, a peer's Peer/Checksum).
 *
 * The caller holds the range — a reference on its segment, and the use of a pool lease when
 * the range is one — and hands that hold over with the call: it is let go on the loop once the
 * sum is taken (or could not be), before done runs, and at once when the call fails. The sum is
 * read under the fault guard (moongate/fault.h): a file cut under it is DATA_LOSS, not a crash.
 * Loop thread; the sum on a worker.
 */
#ifndef MOONGATE_CHECKSUM_H
#define MOONGATE_CHECKSUM_H

#include <stdint.h>

#include "moongate/engine.h"
#include "moongate/pools.h"
#include "moongate/segment.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sum was taken: result 0 and crc, or an MG_ERR_* and why ("" when the engine stopped
 * before it ran). On the loop, once; the range is let go already. */
typedef void (*mg_checksum_done_fn)(void *arg, int result, uint32_t crc, const char *why);

/* Loop. The CRC32C of `length` bytes at p, inside seg (a segment of engine's registry the
 * caller holds a reference on; `lease`: the mg_pools_use token of the lease the range is, or
 * NULL), on a worker of engine; done runs on the loop that drains cq. The hold is the call's
 * from here on. Returns 0, or MG_ERR_NOMEM or an error of mg_engine_submit (MG_ERR_FULL: the
 * queue; MG_ERR_SHUTDOWN) with the hold let go and done not called. */
int mg_checksum_async(mg_engine *engine, mg_cq *cq, mg_pools *pools, mg_segment *seg, void *lease,
                      const uint8_t *p, uint64_t length, mg_checksum_done_fn done, void *arg);

#ifdef __cplusplus
}
#endif

#endif
