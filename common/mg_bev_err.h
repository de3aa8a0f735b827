/*
 * mg_bev_err: why a bufferevent's connection failed, in words a person reads.
 *
 * libevent's OpenSSL bufferevent records two kinds of value in its error queue: OpenSSL's packed
 * error codes (a library and a reason: "certificate verify failed") and, when the socket itself
 * failed, SSL_get_error()'s code (SSL_ERROR_SYSCALL, 5), which OpenSSL renders as the unreadable
 * "error:00000005:lib(0)::reason(5)". The second kind is not a TLS error at all: the system
 * call's errno, saved before anything else runs, says what happened ("Connection refused").
 * Shared by the client library and the gateway; header-only so that the common library keeps
 * no OpenSSL dependency.
 */
#ifndef MG_BEV_ERR_H
#define MG_BEV_ERR_H

#include <event2/util.h>
#include <openssl/err.h>
#include <stdio.h>
#include <string.h>

/* Writes the reason of a failed connection into out. `tls_err` is what
 * bufferevent_get_openssl_error() returned (0 for a plain socket; the call takes the error off
 * the queue, so call it once), `sock_err` is EVUTIL_SOCKET_ERROR() read first thing in the event
 * callback. */
static inline void mg_bev_error_reason(unsigned long tls_err, int sock_err, char *out, size_t cap)
{
    unsigned long e = tls_err;
    if (e && ERR_GET_LIB(e) != 0) {
        const char *r = ERR_reason_error_string(e);
        if (r)
            snprintf(out, cap, "TLS: %s", r);
        else
            ERR_error_string_n(e, out, cap);
    } else if (sock_err) {
        snprintf(out, cap, "%s", evutil_socket_error_to_string(sock_err));
    } else if (e) { /* the socket failed and left no errno: the other end closed it */
        snprintf(out, cap, "connection closed during the TLS handshake");
    } else {
        snprintf(out, cap, "connection failed");
    }
}

/* Why OpenSSL's last call failed, from its first queued error, the cause ("No such file or
 * directory" for a system call, "key values mismatch"), or "unknown error"; the queue is left
 * as it is. */
static inline const char *mg_ssl_last_reason(void)
{
    unsigned long e = ERR_peek_error();
    const char *r;
    if (e == 0)
        return "unknown error";
    if (ERR_SYSTEM_ERROR(e))
        return strerror(ERR_GET_REASON(e));
    r = ERR_reason_error_string(e);
    return r ? r : "unknown error";
}

#endif
