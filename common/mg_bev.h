/*
 * mg_bev: writing a plain socket's HTTP/2 output at once.
 *
 * A bufferevent writes its output only when the loop next reports the socket writable: one
 * epoll_ctl to watch for it, one more epoll_wait, one epoll_ctl to stop watching. For a unary
 * call that is three system calls and a loop round on each side of every request. The gateway
 * and the client library therefore collect what nghttp2 sends into a staging buffer and, when
 * nothing is already queued on the bufferevent, write it straight to the socket; only what the
 * socket does not take goes to the bufferevent, which then writes it as usual. Errors are left
 * to the bufferevent: the remainder is queued there and its own write reports them.
 *
 * TLS bufferevents keep their own path (the staging buffer is NULL for them).
 */
#ifndef MG_BEV_H
#define MG_BEV_H

#include <event2/buffer.h>
#include <event2/bufferevent.h>

/* Bytes waiting to be written on bev, staged or queued. */
static inline size_t mg_bev_pending(struct bufferevent *bev, struct evbuffer *stage)
{
    return evbuffer_get_length(bufferevent_get_output(bev)) +
           (stage ? evbuffer_get_length(stage) : 0);
}

/* Takes `length` bytes of output: into the staging buffer when there is one, else onto bev. */
static inline int mg_bev_add(struct bufferevent *bev, struct evbuffer *stage, const void *data,
                             size_t length)
{
    return stage ? evbuffer_add(stage, data, length) : bufferevent_write(bev, data, length);
}

/* Writes the staged bytes: to the socket now when nothing is queued before them, whatever the
 * socket did not take onto bev. Returns 1 when nothing is left queued on bev: its write callback
 * will then not run, so a sender that stopped at its output cap must send again itself (else
 * it waits for the next input, which may never come). */
static inline int mg_bev_flush(struct bufferevent *bev, struct evbuffer *stage)
{
    if (stage != NULL && evbuffer_get_length(stage) > 0) {
        if (evbuffer_get_length(bufferevent_get_output(bev)) == 0 && bufferevent_getfd(bev) >= 0)
            (void)evbuffer_write(stage, bufferevent_getfd(bev));
        if (evbuffer_get_length(stage) > 0)
            bufferevent_write_buffer(bev, stage);
    }
    return evbuffer_get_length(bufferevent_get_output(bev)) == 0;
}

#endif
