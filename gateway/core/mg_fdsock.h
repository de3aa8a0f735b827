/*
 * mg_fdsock: the fd socket, where local clients pass file descriptors to the daemon.
 *
 * gRPC cannot carry a descriptor, so a client that registers memory it already has (a memfd, a
 * tmpfs file) passes the descriptor here first and names the handle it gets back in
 * RegisterSegment (source FD). The socket is a SOCK_SEQPACKET Unix socket next to --unix-socket
 * (--fd-socket; default "<unix socket>.fd", same mode and group). Each request is one message:
 *
 *     PUT [TOKEN]        ASCII, with exactly one descriptor attached (SCM_RIGHTS)
 *
 * and gets one reply message:
 *
 *     OK <handle> <ttl_ms>          the handle (decimal) names the descriptor until ttl_ms pass
 *     ERR <CODE> <message>          CODE is a gRPC status name (INVALID_ARGUMENT, ...)
 *
 * The sender is admitted like a caller of the Unix socket: a bearer TOKEN of --auth-file if it
 * gives one, else its uid's principal, else tenant "default" with --allow-anonymous. The handle
 * is bound to the kernel's uid and pid of the connection and to that tenant (moongate/
 * fdhandles.h): only a RegisterSegment call from the same process, on the Unix socket, as the
 * same tenant, can use it, once, within --fd-handle-ttl ms. A connection holds at most
 * --max-unclaimed-fds descriptors nobody has registered; the daemon at most --max-fd-handles.
 * A message whose descriptors did not all fit (MSG_CTRUNC), that is longer than a request can
 * be, or that is empty is a protocol error: ERR is sent and the connection closed. Whatever a
 * message is — served, refused, broken, or the last before its connection closes — every
 * descriptor the kernel installed with it ends in the handle table or closed, and those closed
 * without a handle are counted (mg_fdsock_discarded).
 *
 * Loop thread only; every socket is non-blocking.
 */
#ifndef MG_FDSOCK_H
#define MG_FDSOCK_H

#include "mg_gateway.h"
#include "moongate/fdhandles.h"

/* Opens the fd socket of cfg (nothing when --fd-socket is "" or there is no --unix-socket).
 * Returns 0, or an MG_ERR_* after logging why. */
int mg_fdsock_start(mg_gateway *gw);
/* Closes the socket, its connections and every descriptor held. Accepts a gateway without one. */
void mg_fdsock_stop(mg_gateway *gw);
/* Pauses (0) or resumes (1) accepting, with the other listeners (mg_accept_failed). */
void mg_fdsock_accepting(mg_gateway *gw, int on);
/* The table of passed descriptors, or NULL when the daemon has no fd socket. */
mg_fd_handles *mg_fdsock_handles(mg_gateway *gw);
/* Descriptors closed because the message that brought them was refused or broken (the table's
 * own refusals are counted there). 0 when the daemon has no fd socket. */
uint64_t mg_fdsock_discarded(const mg_gateway *gw);
/* The descriptor `handle` names, if the caller of `call` is the process and tenant that passed
 * it, on the Unix socket: the last check before the caller's use takes it (it is used up
 * whatever follows). Returns 0 with *fd (now the caller's), or an MG_ERR_* with err
 * (MG_SEG_ERROR_MAX bytes) set. */
int mg_call_take_fd(mg_call *call, uint64_t handle, int *fd, char *err);
/* The socket's path, or "" when there is none. */
const char *mg_fdsock_path(const mg_gateway *gw);

#endif
