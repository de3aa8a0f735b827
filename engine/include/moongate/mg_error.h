/*
 * moongate error codes: every function returns 0 or a negative MG_ERR_*; mg_strerror() gives
 * its text. The engine knows no gRPC: at the edge each code maps to exactly one gRPC status (and
 * through it one HTTP status), mg_err_grpc() in common/mg_grpc.h; the comments say which.
 */
#ifndef MOONGATE_MG_ERROR_H
#define MOONGATE_MG_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MG_OK = 0,
    MG_ERR_INVALID = -1,      /* INVALID_ARGUMENT */
    MG_ERR_NOMEM = -2,        /* RESOURCE_EXHAUSTED */
    MG_ERR_FULL = -3,         /* RESOURCE_EXHAUSTED: a limit is reached (the message names it) */
    MG_ERR_NOT_FOUND = -4,    /* NOT_FOUND */
    MG_ERR_EXISTS = -5,       /* ALREADY_EXISTS */
    MG_ERR_PERMISSION = -6,   /* PERMISSION_DENIED */
    MG_ERR_BUSY = -7,         /* FAILED_PRECONDITION: in use */
    MG_ERR_RANGE = -8,        /* OUT_OF_RANGE */
    MG_ERR_TIMEOUT = -9,      /* DEADLINE_EXCEEDED */
    MG_ERR_CANCELLED = -10,   /* CANCELLED */
    MG_ERR_SHUTDOWN = -11,    /* UNAVAILABLE: shutting down */
    MG_ERR_UNAVAILABLE = -12, /* UNAVAILABLE: peer or transport unreachable */
    MG_ERR_UNSUPPORTED = -13, /* UNIMPLEMENTED */
    MG_ERR_SYSTEM = -14,      /* INTERNAL: a system call failed (errno is logged) */
    MG_ERR_PROTOCOL = -15,    /* INTERNAL: malformed data from a peer */
    MG_ERR_AUTH = -16,        /* UNAUTHENTICATED */
    MG_ERR_DATA_LOSS = -17,   /* DATA_LOSS */
    MG_ERR_QUOTA = -18,       /* RESOURCE_EXHAUSTED: a tenant's quota; waiting does not help */
    MG_ERR_STATE = -19,       /* FAILED_PRECONDITION: the memory is not in a state it needs */
};
#define MG_ERR_COUNT 20

/* Text for a code ("invalid argument"); "unknown error" out of range. */
const char *mg_strerror(int err);

#ifdef __cplusplus
}
#endif

#endif
