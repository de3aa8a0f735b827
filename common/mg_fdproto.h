/*
 * mg_fdproto: the fd socket's messages (the daemon's side is gateway/core/mg_fdsock.h, the
 * client's mg_fd_pass in client/mg_client.h). One request, one reply, each one SOCK_SEQPACKET
 * message of ASCII:
 *
 *     request   "PUT" or "PUT <token>", with one descriptor attached (SCM_RIGHTS)
 *     reply     "OK <handle> <ttl_ms>" or "ERR <CODE> <message>" (CODE: a gRPC status name)
 *
 * A trailing newline is allowed on either. Pure functions; any thread.
 */
#ifndef MG_FDPROTO_H
#define MG_FDPROTO_H

#include <stddef.h>
#include <stdint.h>

#define MG_FDPROTO_TOKEN_MAX   1024 /* bytes of a bearer token */
#define MG_FDPROTO_REQUEST_MAX (4 + MG_FDPROTO_TOKEN_MAX)

/* Parses a request of len bytes in text (text[len] must be writable: it is cut in place).
 * Returns 0 with *token the bearer token or NULL, or -1 with *why a static reason. */
int mg_fdproto_request(char *text, size_t len, const char **token, const char **why);
/* Parses a reply. Returns 0 with *handle and *ttl_ms ("OK"); or -1 with *code the gRPC code
 * and msg (cap bytes) the message: the daemon's for "ERR", INTERNAL and a description for
 * anything else. */
int mg_fdproto_reply(const char *r, uint64_t *handle, uint64_t *ttl_ms, int *code, char *msg,
                     size_t cap);

#endif
