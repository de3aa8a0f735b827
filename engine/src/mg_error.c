/* mg_error: the one table from MG_ERR_* to text and gRPC status. */
#include "moongate/mg_error.h"

static const struct {
    const char *text;
    int grpc;
} table[MG_ERR_COUNT] = {
    {"ok", 0},
    {"invalid argument", 3},
    {"out of memory", 8},
    {"limit reached", 8},
    {"not found", 5},
    {"already exists", 6},
    {"permission denied", 7},
    {"in use", 9},
    {"out of range", 11},
    {"deadline exceeded", 4},
    {"cancelled", 1},
    {"shutting down", 14},
    {"unavailable", 14},
    {"not supported", 12},
    {"system call failed", 13},
    {"protocol error", 13},
    {"unauthenticated", 16},
    {"data loss", 15},
    {"quota exceeded", 8},
};

const char *mg_strerror(int err)
{
    if (err > 0 || -err >= MG_ERR_COUNT)
        return "unknown error";
    return table[-err].text;
}

int mg_err_grpc(int err)
{
    if (err > 0 || -err >= MG_ERR_COUNT)
        return 2; /* UNKNOWN */
    return table[-err].grpc;
}
