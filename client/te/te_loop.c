/*
 * The engine's loop thread: the connection to the daemon, the calls callers hand it, and the
 * Submit calls whose answers (each the batch at its end) make the transfer statuses
 * (te_internal.h).
 */
#include "te_internal.h"
#include "mg_b64.h"

#include "moongate/v1/notify.pb-c.h"
#include "moongate/v1/transfer.pb-c.h"

#include <errno.h>
#include <event2/event.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

void te_log(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "moongate transfer_engine: %s\n", line);
}

/* ---- a task's state from moongate's request state ---- */

static int task_state(const Moongate__V1__RequestStatus *r)
{
    if (r->state == MOONGATE__V1__REQUEST_STATE__DONE)
        return STATUS_COMPLETED;
    if (r->state == MOONGATE__V1__REQUEST_STATE__RUNNING)
        return STATUS_PENDING;
    if (r->state != MOONGATE__V1__REQUEST_STATE__FAILED)
        return STATUS_WAITING;
    if (r->code == MG_GRPC_DEADLINE_EXCEEDED)
        return STATUS_TIMEOUT;
    return r->code == MG_GRPC_CANCELLED ? STATUS_CANCELED : STATUS_FAILED;
}

static int terminal(int status)
{
    return status >= STATUS_CANCELED;
}

int te_task_status(const te_batch *b, size_t k)
{
    int s = TE_GET(b->tasks[k].status), note = TE_GET(b->note_state);
    if (s == STATUS_COMPLETED && note == TE_NOTE_FAILED)
        return STATUS_FAILED; /* in place, but the peer was not told */
    if (s == STATUS_COMPLETED && note != TE_NOTE_NONE && note != TE_NOTE_SENT)
        return STATUS_PENDING;
    return s;
}

/* ---- the test-only straddle (e->test_straddle) ---- */

#define TE_TEST_WAIT_NS 10000000000ull /* a safety net: the other side never came */

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

void te_test_straddle(te_engine *e, const te_batch *b, size_t k)
{
    uint64_t until = now_ns() + TE_TEST_WAIT_NS;
    if (!e->test_straddle || terminal(TE_GET(b->tasks[k].status)))
        return;
    TE_SET(e->test_mid_poll, 1);
    while (!terminal(TE_GET(b->tasks[k].status)) && now_ns() < until)
        sched_yield();
    TE_SET(e->test_mid_poll, 0);
}

/* The loop thread, about to publish what b says of the tasks tb has from `first` on: when that
 * ends one of them, waits for a poll between its loads. Without e->mu, which the caller whose
 * submit returns needs. */
static void test_wait_for_a_poll(te_engine *e, const te_batch *tb, size_t first,
                                 const Moongate__V1__Batch *b, size_t count)
{
    uint64_t until = now_ns() + TE_TEST_WAIT_NS;
    int ends = 0;
    for (size_t k = 0; tb != NULL && k < b->n_requests && k < count; k++)
        ends |=
            terminal(task_state(b->requests[k])) && !terminal(TE_GET(tb->tasks[first + k].status));
    while (ends && !TE_GET(e->test_mid_poll) && now_ns() < until)
        sched_yield();
}

te_batch *te_slot(te_engine *e, size_t s, uint32_t gen)
{
    te_batch *chunk = s / TE_CHUNK < TE_MAX_CHUNKS ? TE_GET(e->chunks[s / TE_CHUNK]) : NULL;
    if (chunk == NULL || gen == 0 || TE_GET(chunk[s % TE_CHUNK].gen) != gen)
        return NULL;
    return &chunk[s % TE_CHUNK];
}

/* ---- submits: one call each, answered when the batch is over ---- */

/* The tasks a Submit call moves: batch slot, generation and range. */
typedef struct te_watch {
    te_engine *e;
    size_t slot, first, count;
    uint32_t gen;
} te_watch;

/* What the daemon's final batch says of each task (the bytes, then the status). */
static void apply_batch(const te_watch *w, const Moongate__V1__Batch *b)
{
    te_batch *tb;
    if (w->e->test_straddle)
        test_wait_for_a_poll(w->e, te_slot(w->e, w->slot, w->gen), w->first, b, w->count);
    pthread_mutex_lock(&w->e->mu);
    tb = te_slot(w->e, w->slot, w->gen);
    for (size_t k = 0; tb != NULL && k < b->n_requests && k < w->count; k++) {
        /* publish: the bytes, then the status (getTransferStatus loads the status first) */
        TE_SET(tb->tasks[w->first + k].bytes, b->requests[k]->bytes_done);
        TE_SET(tb->tasks[w->first + k].status, task_state(b->requests[k]));
    }
    pthread_mutex_unlock(&w->e->mu);
}

/* The Submit call ended (status, message): its tasks not ended by then failed, and the batch's
 * notification goes once its last submit is over. */
static void submit_ended(const te_watch *w, int status, const char *message)
{
    te_batch *tb;
    pthread_mutex_lock(&w->e->mu);
    tb = te_slot(w->e, w->slot, w->gen);
    if (tb != NULL) {
        int failed = 0;
        for (size_t k = w->first; k < w->first + w->count; k++)
            if (!terminal(tb->tasks[k].status)) { /* publish: the status alone, the bytes stay */
                TE_SET(tb->tasks[k].status, STATUS_FAILED);
                failed = 1;
            }
        if (status != 0 && failed)
            te_log("submitTransfer: %s (%s)", message, mg_grpc_code_name(status));
        tb->streams--;
        te_batch_settle(w->e, tb);
    }
    pthread_mutex_unlock(&w->e->mu);
}

/* The answer to a Submit with `wait`: the batch at its end. */
static void submit_answered(te_call *c, int status, const char *message)
{
    const te_watch w = {
        .e = c->e, .slot = c->slot, .first = c->first, .count = c->count, .gen = c->gen};
    Moongate__V1__SubmitResponse *r =
        status == 0 ? moongate__v1__submit_response__unpack(NULL, c->resp_len, c->resp) : NULL;
    if (status == 0 && (r == NULL || r->batch == NULL)) {
        status = MG_GRPC_INTERNAL;
        message = "the daemon's answer to Submit holds no batch";
    } else if (r != NULL) {
        apply_batch(&w, r->batch);
    }
    submit_ended(&w, status, message);
    if (r != NULL)
        moongate__v1__submit_response__free_unpacked(r, NULL);
}

/* ---- calls ---- */

static void call_free(te_call *c)
{
    free(c->req);
    free(c->resp);
    free(c);
}

static void call_message(mg_rpc *rpc, const uint8_t *msg, size_t len, void *arg)
{
    te_call *c = arg;
    free(c->resp);
    c->resp = malloc(len ? len : 1);
    c->resp_len = c->resp ? len : 0;
    if (c->resp)
        memcpy(c->resp, msg, len);
}

static void call_close(mg_rpc *rpc, int status, const char *message, void *arg)
{
    te_call *c = arg;
    te_engine *e = c->e;
    if (c->watch) { /* nobody waits for a submit: its answer goes to its tasks */
        submit_answered(c, status, message);
        call_free(c);
        return;
    }
    pthread_mutex_lock(&e->mu);
    c->status = status;
    snprintf(c->msg, sizeof(c->msg), "%s", message);
    c->done = 1;
    if (c->note && te_slot(e, c->slot, c->gen) != NULL) /* publish: read after a status */
        TE_SET(te_slot(e, c->slot, c->gen)->note_state,
               status == 0 ? TE_NOTE_SENT : TE_NOTE_FAILED);
    if (c->detached) { /* the notification of a submitTransferWithNotify */
        if (status != 0)
            te_log("submitTransferWithNotify: the notification was not delivered: %s (%s)", message,
                   mg_grpc_code_name(status));
        pthread_mutex_unlock(&e->mu);
        call_free(c);
        return;
    }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

int te_connect(te_engine *e, char *why, size_t cap)
{
    mg_client_options o = {.target = e->target,
                           .token = e->token[0] ? e->token : NULL,
                           .on_broken = te_broken,
                           .broken_arg = e};
    mg_client_del(e->client);
    e->client = NULL;
    return mg_client_new(&e->client, e->base, &o, why, cap);
}

static void call_start(te_engine *e, te_call *c)
{
    static const mg_rpc_handlers h = {.on_message = call_message, .on_close = call_close};
    char why[512];
    mg_rpc *rpc;
    if (c->path == NULL) { /* te_call_reconnect */
        int rc = te_connect(e, why, sizeof(why));
        call_close(NULL, rc ? MG_GRPC_UNAVAILABLE : 0, rc ? why : "", c);
        return;
    }
    rpc = e->client ? mg_rpc_start(e->client, c->path, NULL, 0, c->timeout_ms, &h, c) : NULL;
    if (rpc == NULL) {
        call_close(NULL, MG_GRPC_UNAVAILABLE, "the connection to the daemon is gone", c);
        return;
    }
    mg_rpc_send(rpc, c->req, c->req_len);
    mg_rpc_close_send(rpc);
}

static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
    te_engine *e = arg;
    uint64_t n;
    te_call *q, *next, *oldest = NULL;
    int stop;
    if (read(e->efd, &n, sizeof(n)) < 0 && errno != EAGAIN)
        te_log("wake: %s", strerror(errno));
    pthread_mutex_lock(&e->mu);
    q = e->queue;
    e->queue = NULL;
    stop = e->stopping;
    pthread_mutex_unlock(&e->mu);
    for (; q != NULL; q = next) { /* handed over newest first */
        next = q->next;
        q->next = oldest;
        oldest = q;
    }
    for (q = oldest; q != NULL; q = next) {
        next = q->next;
        call_start(e, q);
    }
    if (stop) {
        mg_client_del(e->client);
        e->client = NULL;
        event_base_loopbreak(e->base);
    }
}

static void *loop_main(void *arg)
{
    te_engine *e = arg;
    event_base_loop(e->base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
}

static void poke(te_engine *e)
{
    uint64_t one = 1;
    if (write(e->efd, &one, sizeof(one)) < 0)
        te_log("wake: %s", strerror(errno));
}

/* With e->mu held: queues c for the loop and wakes it. */
static void hand_over(te_engine *e, te_call *c)
{
    c->next = e->queue;
    e->queue = c;
    poke(e);
}

int te_start(te_engine *e)
{
    char err[512];
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    e->base = e->efd >= 0 ? event_base_new() : NULL;
    e->wake = e->base ? event_new(e->base, e->efd, EV_READ | EV_PERSIST, wake_cb, e) : NULL;
    if (e->wake == NULL || event_add(e->wake, NULL) != 0) {
        te_log("the engine's loop: %s", strerror(errno));
        return -1;
    }
    if (te_connect(e, err, sizeof(err)) != 0) {
        te_log("no moongate daemon at %s (MOONGATE_SOCKET): %s", e->target, err);
        return -1;
    }
    if (pthread_create(&e->thread, NULL, loop_main, e) != 0) {
        te_log("the engine's thread: %s", strerror(errno));
        return -1;
    }
    e->running = 1;
    return 0;
}

void te_stop(te_engine *e)
{
    te_restore_stop(e);
    if (e->running) {
        pthread_mutex_lock(&e->mu);
        e->stopping = 1;
        poke(e);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
        event_base_loop(e->base, EVLOOP_NONBLOCK); /* the connection's last resources */
    } else {
        mg_client_del(e->client);
    }
    if (e->wake)
        event_free(e->wake);
    if (e->base)
        event_base_free(e->base);
    if (e->efd >= 0)
        close(e->efd);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
}

static te_call *call_new(te_engine *e, const char *path, const ProtobufCMessage *req,
                         uint64_t timeout_ms)
{
    te_call *c = calloc(1, sizeof(*c));
    size_t n = protobuf_c_message_get_packed_size(req);
    if (c == NULL || (c->req = malloc(n ? n : 1)) == NULL) {
        free(c);
        return NULL;
    }
    c->e = e;
    c->path = path;
    c->req_len = protobuf_c_message_pack(req, c->req);
    c->timeout_ms = timeout_ms;
    return c;
}

/* Before a call goes: while the engine restores, it waits for that first; once it gave up, a
 * call that meets no daemon says why. Returns with e->mu held: 0, or UNAVAILABLE with c->msg
 * set when the engine is done with the daemon. */
static int call_may_go(te_engine *e, te_call *c)
{
    te_gate(e);  /* a restore on its way ends first: it may give up just now */
    te_retry(e); /* given up: one more try, the daemon may be back */
    te_gate(e);
    pthread_mutex_lock(&e->mu);
    if (e->fatal) { /* said once when it happened; the engine is done with the daemon */
        c->status = MG_GRPC_UNAVAILABLE;
        snprintf(c->msg, sizeof(c->msg), "%.500s", e->gone);
        return c->status;
    }
    return 0;
}

/* Hands c to the loop and waits for its end; returns its status (c is then the caller's). */
static int call_wait(te_engine *e, te_call *c)
{
    if (call_may_go(e, c) != 0) {
        pthread_mutex_unlock(&e->mu);
        return c->status;
    }
    hand_over(e, c);
    while (!c->done)
        pthread_cond_wait(&e->cv, &e->mu);
    if (c->status == MG_GRPC_UNAVAILABLE && e->gone[0])
        snprintf(c->msg, sizeof(c->msg), "%.500s", e->gone);
    pthread_mutex_unlock(&e->mu);
    return c->status;
}

int te_call_reconnect(te_engine *e, char *msg, size_t msgcap)
{
    te_call *c = calloc(1, sizeof(*c));
    int status;
    if (c == NULL) {
        snprintf(msg, msgcap, "out of memory");
        return MG_GRPC_RESOURCE_EXHAUSTED;
    }
    c->e = e; /* path NULL: the loop replaces the connection */
    status = call_wait(e, c);
    snprintf(msg, msgcap, "%s", c->msg);
    call_free(c);
    return status;
}

int te_call_run(te_engine *e, const char *path, const ProtobufCMessage *req, uint64_t timeout_ms,
                uint8_t **resp, size_t *resp_len, char *msg, size_t msgcap)
{
    te_call *c = call_new(e, path, req, timeout_ms);
    int status;
    if (c == NULL) {
        snprintf(msg, msgcap, "out of memory");
        return MG_GRPC_RESOURCE_EXHAUSTED;
    }
    status = call_wait(e, c);
    snprintf(msg, msgcap, "%s", c->msg);
    if (status == 0 && resp != NULL) {
        *resp = c->resp;
        *resp_len = c->resp_len;
        c->resp = NULL;
    }
    call_free(c);
    return status;
}

int te_call_submit(te_engine *e, const ProtobufCMessage *req, size_t slot, uint32_t gen,
                   size_t first, size_t count, char *msg, size_t msgcap)
{
    te_call *c = call_new(e, "/moongate.v1.Transfer/Submit", req, 0);
    if (c == NULL) {
        snprintf(msg, msgcap, "out of memory");
        return MG_GRPC_RESOURCE_EXHAUSTED;
    }
    c->watch = 1;
    c->slot = slot;
    c->gen = gen;
    c->first = first;
    c->count = count;
    if (call_may_go(e, c) != 0) {
        int status = c->status;
        pthread_mutex_unlock(&e->mu);
        snprintf(msg, msgcap, "%s", c->msg);
        call_free(c);
        return status;
    }
    hand_over(e, c); /* the loop frees it once answered */
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* ---- notifications ---- */

/* o[key] = text when it is UTF-8, else o[key + "_b64"] = its bytes in base64. 0, or -1. */
static int put_text(json_t *o, const char *key, const char *text)
{
    size_t n = strlen(text);
    json_t *s = json_stringn(text, n);
    char k[16];
    if (s == NULL) { /* not UTF-8: Mooncake's notifications are bytes */
        char *b = malloc(mg_b64_encoded_size(n));
        if (b != NULL)
            s = json_stringn(b, mg_b64_encode(b, (const uint8_t *)text, n));
        free(b);
        snprintf(k, sizeof(k), "%s_b64", key);
        key = k;
    }
    return s != NULL ? json_object_set_new(o, key, s) : -1;
}

char *te_note_payload(const char *name, const char *msg)
{
    json_t *o = json_object();
    char *out = NULL;
    if (o != NULL && put_text(o, "name", name ? name : "") == 0 &&
        put_text(o, "msg", msg ? msg : "") == 0)
        out = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return out;
}

char *te_note_text(json_t *o, const char *key)
{
    char k[16];
    const char *b64;
    uint8_t *out;
    long n;
    json_t *s = json_object_get(o, key);
    if (json_is_string(s)) /* up to its first NUL: all a C string holds */
        return strdup(json_string_value(s));
    snprintf(k, sizeof(k), "%s_b64", key);
    if ((b64 = json_string_value(json_object_get(o, k))) == NULL ||
        (out = malloc(strlen(b64) * 3 / 4 + 4)) == NULL)
        return NULL;
    if ((n = mg_b64_decode(out, b64, strlen(b64))) < 0) {
        free(out);
        return NULL;
    }
    out[n] = '\0';
    return (char *)out;
}

void te_note_topic(char *out, size_t cap, uint32_t port)
{
    snprintf(out, cap, "mooncake.notify.%u", port);
}

void te_batch_settle(te_engine *e, te_batch *b)
{
    Moongate__V1__SendRequest q = MOONGATE__V1__SEND_REQUEST__INIT;
    char topic[64];
    uint32_t port = 0;
    const char *colon = b->note_to ? strrchr(b->note_to, ':') : NULL;
    te_call *c;
    int all_done = 1;
    if (b->streams > 0 || b->note_state != TE_NOTE_WAITING)
        return;
    for (size_t k = 0; k < b->n; k++)
        all_done &= b->tasks[k].status == STATUS_COMPLETED;
    if (!all_done) {
        te_log("submitTransferWithNotify: the notification to %s was not sent: a transfer of "
               "its batch failed",
               b->note_to);
        TE_SET(b->note_state, TE_NOTE_FAILED);
        return;
    }
    if (colon != NULL)
        port = (uint32_t)strtoul(colon + 1, NULL, 10);
    te_note_topic(topic, sizeof(topic), port);
    q.agent = b->note_to;
    q.topic = topic;
    q.payload.data = (uint8_t *)b->note_payload;
    q.payload.len = strlen(b->note_payload);
    c = call_new(e, "/moongate.v1.Notify/Send", &q.base, 30000);
    if (c == NULL) {
        te_log("submitTransferWithNotify: no memory for the notification to %s", b->note_to);
        TE_SET(b->note_state, TE_NOTE_FAILED);
        return;
    }
    c->note = 1;
    c->detached = 1;
    c->slot = b->slot;
    c->gen = b->gen;
    TE_SET(b->note_state, TE_NOTE_SENDING);
    hand_over(e, c); /* started by the loop once this callback returns */
}
