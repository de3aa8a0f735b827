/*
 * svc_debug: moongate.v1.Debug, served with --debug-service. Test calls for the RPC framework
 * (every streaming shape, large messages, flow control) and for the engine hand-off: Sleep runs a
 * blocking job on an engine worker and answers from the loop when the job comes back, so a test
 * can show that other calls are served meanwhile. Loop thread, except sleep_work (a worker).
 */
#include "mg_gateway.h"
#include "mg_service.h"

#include "moongate/v1/debug.pb-c.h"

#include <event2/event.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SLEEP_MS     60000u
#define MAX_EXPAND       100000u
#define MAX_EXPAND_BYTES (256u * 1024u * 1024u)

/* ---- Sleep: a job on an engine worker ---- */

typedef struct {
    mg_call *call;
    uint32_t ms;
} sleep_job;

static int sleep_work(void *arg)
{
    sleep_job *j = arg;
    struct timespec ts = {(time_t)(j->ms / 1000), (long)(j->ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
    return 0;
}

static void sleep_done(void *arg, int result)
{
    sleep_job *j = arg;
    if (!mg_call_done(j->call)) {
        if (result != 0) {
            mg_call_fail(j->call, result, "sleep job");
        } else {
            Moongate__V1__SleepResponse resp = MOONGATE__V1__SLEEP_RESPONSE__INIT;
            resp.slept_ms = j->ms;
            mg_call_reply(j->call, &resp.base);
        }
    }
    mg_call_unref(j->call);
    free(j);
}

static void sleep_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__SleepRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    sleep_job *j;
    int rc;

    if (req->duration_ms > MAX_SLEEP_MS) {
        mg_call_finish(call, MG_GRPC_INVALID_ARGUMENT, "duration_ms %u is above the maximum %u",
                       req->duration_ms, MAX_SLEEP_MS);
        return;
    }
    j = malloc(sizeof(*j));
    if (j == NULL) {
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    j->call = call;
    j->ms = req->duration_ms;
    mg_call_ref(call);
    rc = mg_engine_submit(gw->engine, gw->cq, sleep_work, sleep_done, j);
    if (rc != 0) {
        mg_call_unref(call);
        free(j);
        mg_call_fail(call, rc, "engine queue holds %u jobs (--queue-depth)",
                     (unsigned)gw->cfg->queue_depth);
    }
}

/* ---- Echo, Collect, Chat ---- */

static void echo_message(mg_call *call, const ProtobufCMessage *m)
{
    mg_call_reply(call, m);
}

typedef struct {
    uint64_t messages, bytes;
} collect_state;

static void collect_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__EchoMessage *msg = (const void *)m;
    collect_state *st = mg_call_data(call);
    if (st == NULL) {
        st = calloc(1, sizeof(*st));
        if (st == NULL) {
            mg_call_fail(call, MG_ERR_NOMEM, NULL);
            return;
        }
        mg_call_set_data(call, st);
    }
    st->messages++;
    st->bytes += msg->payload.len;
}

static void collect_half_close(mg_call *call)
{
    collect_state *st = mg_call_data(call);
    Moongate__V1__CollectResponse resp = MOONGATE__V1__COLLECT_RESPONSE__INIT;
    if (st) {
        resp.messages = st->messages;
        resp.bytes = st->bytes;
    }
    mg_call_reply(call, &resp.base);
    free(st);
    mg_call_set_data(call, NULL);
}

static void collect_cancel(mg_call *call)
{
    free(mg_call_data(call));
    mg_call_set_data(call, NULL);
}

static void chat_message(mg_call *call, const ProtobufCMessage *m)
{
    mg_call_send(call, m);
}

static void chat_half_close(mg_call *call)
{
    mg_call_finish(call, MG_GRPC_OK, NULL);
}

/* ---- Expand: server streaming, paced by a timer when interval_ms > 0 ---- */

typedef struct {
    mg_call *call;
    struct event *timer;
    uint32_t left, size, interval_ms;
    uint64_t seq;
    uint8_t *payload;
} expand_state;

static void expand_free(expand_state *st)
{
    if (st->timer)
        event_free(st->timer);
    free(st->payload);
    free(st);
}

static void expand_step(evutil_socket_t fd, short what, void *arg)
{
    expand_state *st = arg;
    mg_call *call = st->call;
    do {
        Moongate__V1__EchoMessage msg = MOONGATE__V1__ECHO_MESSAGE__INIT;
        if (mg_call_done(call) || st->left == 0)
            break;
        if (!mg_call_writable(call))
            return; /* a slow reader: expand_writable resumes */
        msg.payload.data = st->payload;
        msg.payload.len = st->size;
        msg.seq = st->seq++;
        st->left--;
        if (mg_call_send(call, &msg.base) != 0)
            return; /* the call ended; expand_cancel freed st */
    } while (st->interval_ms == 0);
    if (st->left > 0 && !mg_call_done(call)) {
        struct timeval tv = {(time_t)(st->interval_ms / 1000),
                             (suseconds_t)(st->interval_ms % 1000) * 1000};
        evtimer_add(st->timer, &tv);
        return;
    }
    mg_call_finish(call, MG_GRPC_OK, NULL);
    mg_call_set_data(call, NULL);
    expand_free(st);
    mg_call_unref(call);
}

static void expand_writable(mg_call *call)
{
    expand_state *st = mg_call_data(call);
    if (st)
        expand_step(-1, 0, st); /* sends what the queue takes; re-arms the pacing timer */
}

static void expand_cancel(mg_call *call)
{
    expand_state *st = mg_call_data(call);
    if (st == NULL)
        return;
    mg_call_set_data(call, NULL);
    expand_free(st);
    mg_call_unref(call);
}

static void expand_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__ExpandRequest *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    expand_state *st;

    if (req->count > MAX_EXPAND || (uint64_t)req->count * req->size > (uint64_t)MAX_EXPAND_BYTES) {
        mg_call_finish(call, MG_GRPC_INVALID_ARGUMENT,
                       "count %u x size %u is above the limit of %u messages and %u bytes",
                       req->count, req->size, MAX_EXPAND, MAX_EXPAND_BYTES);
        return;
    }
    st = calloc(1, sizeof(*st));
    if (st == NULL || (st->payload = malloc(req->size ? req->size : 1)) == NULL ||
        (st->timer = evtimer_new(gw->base, expand_step, st)) == NULL) {
        if (st)
            expand_free(st);
        mg_call_fail(call, MG_ERR_NOMEM, NULL);
        return;
    }
    for (uint32_t i = 0; i < req->size; i++)
        st->payload[i] = (uint8_t)(i * 7 + 1);
    st->call = call;
    st->left = req->count;
    st->size = req->size;
    st->interval_ms = req->interval_ms;
    mg_call_ref(call);
    mg_call_set_data(call, st);
    event_active(st->timer, EV_TIMEOUT, 0);
}

/* ---- HoldRegistrations: a gate the registry's worker jobs pass ----
 *
 * Installed as the registry's gate (mg_registry_set_gate): registration jobs pass it before
 * mapping (or, with after_map, after it) and WriteSegment jobs before copying. Workers wait on
 * it; the loop only flips it (mutex held for O(1) work). */
struct mg_hold {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int on;
    int after_map;
    unsigned waiting;
};

extern const mg_service mg_svc_debug;

/* The service's state, kept in its slot of the gateway (mg_gateway_state). */
static struct mg_hold *hold_of(mg_gateway *gw)
{
    return *mg_gateway_state(gw, &mg_svc_debug);
}

/* Sets the hold; returns how many jobs wait on it. */
static unsigned hold_set(struct mg_hold *h, int hold, int after_map)
{
    unsigned waiting;
    if (h == NULL)
        return 0;
    pthread_mutex_lock(&h->lock);
    h->on = hold;
    if (hold)
        h->after_map = after_map;
    waiting = h->waiting;
    if (!hold)
        pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
    return waiting;
}

/* Worker: waits while the hold is on for this point of a job. */
static void hold_gate(void *arg, int after_map)
{
    struct mg_hold *h = arg;
    pthread_mutex_lock(&h->lock);
    if (h->on && h->after_map == after_map) {
        h->waiting++;
        while (h->on)
            pthread_cond_wait(&h->cond, &h->lock);
        h->waiting--;
    }
    pthread_mutex_unlock(&h->lock);
}

static void hold_message(mg_call *call, const ProtobufCMessage *m)
{
    const Moongate__V1__HoldRequest *req = (const void *)m;
    Moongate__V1__HoldResponse resp = MOONGATE__V1__HOLD_RESPONSE__INIT;
    resp.held = hold_set(hold_of(mg_call_gateway(call)), req->hold, req->after_map);
    mg_call_reply(call, &resp.base);
}

static const mg_method debug_methods[] = {
    MG_UNARY("/moongate.v1.Debug/Sleep", &moongate__v1__sleep_request__descriptor,
             &moongate__v1__sleep_response__descriptor, sleep_message),
    MG_UNARY("/moongate.v1.Debug/Echo", &moongate__v1__echo_message__descriptor,
             &moongate__v1__echo_message__descriptor, echo_message),
    {.path = "/moongate.v1.Debug/Collect",
     .kind = MG_RPC_CLIENT_STREAM,
     .in = &moongate__v1__echo_message__descriptor,
     .out = &moongate__v1__collect_response__descriptor,
     .on_message = collect_message,
     .on_half_close = collect_half_close,
     .on_cancel = collect_cancel},
    {.path = "/moongate.v1.Debug/Expand",
     .kind = MG_RPC_SERVER_STREAM,
     .in = &moongate__v1__expand_request__descriptor,
     .out = &moongate__v1__echo_message__descriptor,
     .on_message = expand_message,
     .on_cancel = expand_cancel,
     .on_writable = expand_writable},
    {.path = "/moongate.v1.Debug/Chat",
     .kind = MG_RPC_BIDI,
     .in = &moongate__v1__echo_message__descriptor,
     .out = &moongate__v1__echo_message__descriptor,
     .on_message = chat_message,
     .on_half_close = chat_half_close},
    MG_UNARY("/moongate.v1.Debug/HoldRegistrations", &moongate__v1__hold_request__descriptor,
             &moongate__v1__hold_response__descriptor, hold_message),
};

static int mg_svc_debug_init(mg_gateway *gw)
{
    mg_registry *reg = mg_engine_registry(gw->engine);
    int rc = mg_gateway_add_methods(gw, debug_methods, MG_NELEM(debug_methods), NULL, 0);
    if (rc != 0)
        return rc;
    if (reg == NULL)
        return 0;
    *mg_gateway_state(gw, &mg_svc_debug) = calloc(1, sizeof(*hold_of(gw)));
    if (hold_of(gw) == NULL)
        return MG_ERR_NOMEM;
    pthread_mutex_init(&hold_of(gw)->lock, NULL);
    pthread_cond_init(&hold_of(gw)->cond, NULL);
    mg_registry_set_gate(reg, hold_gate, hold_of(gw)); /* before any registration job runs */
    return 0;
}

/* The workers are about to stop: a hold must not keep them. */
static void debug_stop(mg_gateway *gw)
{
    hold_set(hold_of(gw), 0, 0);
}

/* After the engine stopped: no job passes the gate any more. */
static void debug_free(mg_gateway *gw)
{
    if (hold_of(gw) == NULL)
        return;
    mg_registry_set_gate(mg_engine_registry(gw->engine), NULL, NULL);
    pthread_cond_destroy(&hold_of(gw)->cond);
    pthread_mutex_destroy(&hold_of(gw)->lock);
    free(hold_of(gw));
    *mg_gateway_state(gw, &mg_svc_debug) = NULL;
}

static int debug_wanted(const mg_config *cfg)
{
    return cfg->debug_service != 0;
}

const mg_service mg_svc_debug = {.name = "debug",
                                 .wanted = debug_wanted,
                                 .init = mg_svc_debug_init,
                                 .stop = debug_stop,
                                 .free = debug_free};
