/* mg_error: the text of each MG_ERR_* (its gRPC status is the edge's: common/mg_grpc.c). */
#include "moongate/mg_error.h"

static const char *const table[MG_ERR_COUNT] = {
    "ok",
    "invalid argument",
    "out of memory",
    "limit reached",
    "not found",
    "already exists",
    "permission denied",
    "in use",
    "out of range",
    "deadline exceeded",
    "cancelled",
    "shutting down",
    "unavailable",
    "not supported",
    "system call failed",
    "protocol error",
    "unauthenticated",
    "data loss",
    "quota exceeded",
    "failed precondition",
};

const char *mg_strerror(int err)
{
    if (err > 0 || -err >= MG_ERR_COUNT)
        return "unknown error";
    return table[-err];
}
