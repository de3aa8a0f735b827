/*
 * Unit tests for the C client library (mg_client), against the real gateway running in a
 * thread of this process: unary and every streaming shape, deadlines, cancellation, unknown
 * methods, response headers, connection failure. h2c over a Unix socket and over TCP.
 */
#include "mg_client.h"
#include "mg_config.h"
#include "mg_gateway.h"
#include "mg_log.h"
#include "mg_test.h"
#include "mg_test_gateway.h"

#include "grpc/health/v1/health.pb-c.h"
#include "moongate/segment.h"
#include "moongate/v1/debug.pb-c.h"
#include "moongate/v1/memory.pb-c.h"

#include <arpa/inet.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static mg_test_gw tg;

/* ---- a tiny harness: one client on a private base, calls recorded ---- */

typedef struct {
    struct event_base *base;
    int closed;
    int status;
    char message[256];
    int messages;
    size_t bytes;
    uint64_t last_seq;
    char ctype[64];
    mg_rpc *rpc;
    int reply_each; /* bidi: send the next message when one arrives */
    int sent;
} rec;

static void on_msg(mg_rpc *rpc, const uint8_t *m, size_t len, void *arg)
{
    rec *r = arg;
    const char *ct = mg_rpc_header(rpc, "content-type");
    Moongate__V1__EchoMessage *e = moongate__v1__echo_message__unpack(NULL, len, m);
    r->messages++;
    r->bytes += len;
    if (ct)
        snprintf(r->ctype, sizeof(r->ctype), "%s", ct);
    if (e) {
        r->last_seq = e->seq;
        moongate__v1__echo_message__free_unpacked(e, NULL);
    }
    if (r->reply_each && r->sent < r->reply_each) {
        Moongate__V1__EchoMessage next = MOONGATE__V1__ECHO_MESSAGE__INIT;
        uint8_t buf[64];
        next.seq = (uint64_t)r->sent++;
        mg_rpc_send(rpc, buf, moongate__v1__echo_message__pack(&next, buf));
        if (r->sent == r->reply_each)
            mg_rpc_close_send(rpc);
    }
}

static void on_close(mg_rpc *rpc, int status, const char *message, void *arg)
{
    rec *r = arg;
    r->closed = 1;
    r->status = status;
    snprintf(r->message, sizeof(r->message), "%s", message);
    event_base_loopbreak(r->base);
}

static const mg_rpc_handlers handlers = {on_msg, on_close};

static mg_client *client(const char *target, struct event_base *base)
{
    mg_client_options o = {.target = target};
    mg_client *c = NULL;
    char err[256];
    CU_ASSERT_EQUAL(mg_client_new(&c, base, &o, err, sizeof(err)), 0);
    return c;
}

static void run(rec *r)
{
    while (!r->closed && event_base_dispatch(r->base) == 0)
        ;
}

static size_t pack(const ProtobufCMessage *m, uint8_t *buf)
{
    return protobuf_c_message_pack(m, buf);
}

static void test_unary_over_unix_and_tcp(void)
{
    const char *targets[] = {tg.sock_target, tg.tcp_target};
    for (int i = 0; i < 2; i++) {
        rec r = {.base = event_base_new()};
        mg_client *c = client(targets[i], r.base);
        Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        uint8_t buf[64];
        mg_metadata md[] = {{"x-request-id", "abc"}};
        r.rpc = mg_rpc_start(c, "/grpc.health.v1.Health/Check", md, 1, 5000, &handlers, &r);
        CU_ASSERT_PTR_NOT_NULL_FATAL(r.rpc);
        mg_rpc_send(r.rpc, buf, pack(&req.base, buf));
        mg_rpc_close_send(r.rpc);
        run(&r);
        CU_ASSERT_EQUAL(r.status, MG_GRPC_OK);
        CU_ASSERT_EQUAL(r.messages, 1);
        CU_ASSERT_STRING_EQUAL(r.ctype, "application/grpc");
        mg_client_del(c);
        event_base_loop(r.base, EVLOOP_NONBLOCK);
        event_base_free(r.base);
    }
}

static void test_server_streaming(void)
{
    rec r = {.base = event_base_new()};
    mg_client *c = client(tg.sock_target, r.base);
    Moongate__V1__ExpandRequest req = MOONGATE__V1__EXPAND_REQUEST__INIT;
    uint8_t buf[64];
    req.count = 40;
    req.size = 200000; /* 8 MB in all: many flow-control windows */
    r.rpc = mg_rpc_start(c, "/moongate.v1.Debug/Expand", NULL, 0, 20000, &handlers, &r);
    mg_rpc_send(r.rpc, buf, pack(&req.base, buf));
    mg_rpc_close_send(r.rpc);
    run(&r);
    CU_ASSERT_EQUAL(r.status, MG_GRPC_OK);
    CU_ASSERT_EQUAL(r.messages, 40);
    CU_ASSERT_EQUAL(r.last_seq, 39);
    mg_client_del(c);
    event_base_loop(r.base, EVLOOP_NONBLOCK);
    event_base_free(r.base);
}

static void test_client_streaming(void)
{
    rec r = {.base = event_base_new()};
    mg_client *c = client(tg.tcp_target, r.base);
    Moongate__V1__EchoMessage m = MOONGATE__V1__ECHO_MESSAGE__INIT;
    static uint8_t payload[100000], buf[100100];
    Moongate__V1__CollectResponse *resp;
    r.rpc = mg_rpc_start(c, "/moongate.v1.Debug/Collect", NULL, 0, 20000, &handlers, &r);
    m.payload.data = payload;
    m.payload.len = sizeof(payload);
    for (int i = 0; i < 30; i++)
        CU_ASSERT_EQUAL(mg_rpc_send(r.rpc, buf, pack(&m.base, buf)), 0);
    mg_rpc_close_send(r.rpc);
    CU_ASSERT_EQUAL(mg_rpc_send(r.rpc, buf, 1), -1); /* after half-close */
    run(&r);
    CU_ASSERT_EQUAL(r.status, MG_GRPC_OK);
    CU_ASSERT_EQUAL(r.messages, 1);
    (void)resp;
    mg_client_del(c);
    event_base_loop(r.base, EVLOOP_NONBLOCK);
    event_base_free(r.base);
}

static void test_bidi_lock_step(void)
{
    rec r = {.base = event_base_new(), .reply_each = 25};
    mg_client *c = client(tg.sock_target, r.base);
    Moongate__V1__EchoMessage first = MOONGATE__V1__ECHO_MESSAGE__INIT;
    uint8_t buf[64];
    r.rpc = mg_rpc_start(c, "/moongate.v1.Debug/Chat", NULL, 0, 10000, &handlers, &r);
    first.seq = 1000;
    mg_rpc_send(r.rpc, buf, pack(&first.base, buf));
    run(&r);
    CU_ASSERT_EQUAL(r.status, MG_GRPC_OK);
    CU_ASSERT_EQUAL(r.messages, 26);
    CU_ASSERT_EQUAL(r.last_seq, 24);
    mg_client_del(c);
    event_base_loop(r.base, EVLOOP_NONBLOCK);
    event_base_free(r.base);
}

static void test_deadline_and_cancel(void)
{
    rec r = {.base = event_base_new()}, r2 = {.base = r.base};
    mg_client *c = client(tg.sock_target, r.base);
    Moongate__V1__SleepRequest req = MOONGATE__V1__SLEEP_REQUEST__INIT;
    uint8_t buf[64];
    size_t n;
    req.duration_ms = 3000;
    n = pack(&req.base, buf);
    r.rpc = mg_rpc_start(c, "/moongate.v1.Debug/Sleep", NULL, 0, 100, &handlers, &r);
    mg_rpc_send(r.rpc, buf, n);
    mg_rpc_close_send(r.rpc);
    run(&r);
    CU_ASSERT_EQUAL(r.status, MG_GRPC_DEADLINE_EXCEEDED);

    r2.rpc = mg_rpc_start(c, "/moongate.v1.Debug/Sleep", NULL, 0, 0, &handlers, &r2);
    mg_rpc_send(r2.rpc, buf, n);
    mg_rpc_close_send(r2.rpc);
    mg_rpc_cancel(r2.rpc);
    CU_ASSERT_EQUAL(r2.closed, 1);
    CU_ASSERT_EQUAL(r2.status, MG_GRPC_CANCELLED);
    mg_client_del(c);
    event_base_loop(r.base, EVLOOP_NONBLOCK);
    event_base_free(r.base);
}

/* The request's DATA frame arrives right behind its HEADERS, after the daemon already decided
 * the answer: the answer must still reach the client (no reset may cancel it). */
static void test_unknown_method(void)
{
    rec r = {.base = event_base_new()};
    mg_client *c = client(tg.tcp_target, r.base);
    r.rpc = mg_rpc_start(c, "/moongate.v1.Daemon/Nope", NULL, 0, 5000, &handlers, &r);
    mg_rpc_send(r.rpc, (const uint8_t *)"", 0);
    mg_rpc_close_send(r.rpc);
    run(&r);
    CU_ASSERT_EQUAL(r.status, MG_GRPC_UNIMPLEMENTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.message, "unknown method /moongate.v1.Daemon/Nope"));
    mg_client_del(c);
    event_base_loop(r.base, EVLOOP_NONBLOCK);
    event_base_free(r.base);
}

static void test_blocking_unary_and_unreachable(void)
{
    mg_client_options o = {.target = tg.tcp_target};
    mg_client_options down = {.target = "127.0.0.1:1"};
    uint8_t *resp = NULL;
    size_t len = 0;
    int status = -1;
    char *msg = NULL, err[256];
    Moongate__V1__EchoMessage m = MOONGATE__V1__ECHO_MESSAGE__INIT;
    uint8_t buf[64];
    m.seq = 77;
    CU_ASSERT_EQUAL(mg_client_unary(&o, "/moongate.v1.Debug/Echo", buf, pack(&m.base, buf), 5000,
                                    &resp, &len, &status, &msg, err, sizeof(err)),
                    0);
    CU_ASSERT_EQUAL(status, MG_GRPC_OK);
    {
        Moongate__V1__EchoMessage *e = moongate__v1__echo_message__unpack(NULL, len, resp);
        CU_ASSERT_PTR_NOT_NULL_FATAL(e);
        CU_ASSERT_EQUAL(e->seq, 77);
        moongate__v1__echo_message__free_unpacked(e, NULL);
    }
    free(resp);
    free(msg);
    CU_ASSERT_EQUAL(mg_client_unary(&down, "/grpc.health.v1.Health/Check", buf, 0, 5000, &resp,
                                    &len, &status, &msg, err, sizeof(err)),
                    0);
    CU_ASSERT_EQUAL(status, MG_GRPC_UNAVAILABLE);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "127.0.0.1:1"));
    free(msg);
    {
        mg_client_options bad = {.target = "no-port"};
        mg_client *c = NULL;
        struct event_base *b = event_base_new();
        CU_ASSERT_EQUAL(mg_client_new(&c, b, &bad, err, sizeof(err)), -1);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "host:port"));
        event_base_free(b);
    }
}

/* One mg_client_call answered by EchoMessages: checks the last one carries `payload`, returns
 * its seq (UINT64_MAX when the call failed). */
static uint64_t echo_call(mg_client *c, const char *path, const ProtobufCMessage *req,
                          const ProtobufCBinaryData *payload)
{
    static uint8_t buf[100100];
    uint8_t *resp;
    size_t len;
    int status;
    char msg[256];
    uint64_t seq = UINT64_MAX;
    Moongate__V1__EchoMessage *e;
    CU_ASSERT_EQUAL(
        mg_client_call(c, path, buf, pack(req, buf), 5000, &resp, &len, &status, msg, sizeof(msg)),
        0);
    CU_ASSERT_EQUAL(status, MG_GRPC_OK);
    if (status != MG_GRPC_OK)
        return seq;
    e = moongate__v1__echo_message__unpack(NULL, len, resp);
    CU_ASSERT_PTR_NOT_NULL(e);
    if (e) {
        seq = e->seq;
        CU_ASSERT_EQUAL(e->payload.len, payload->len);
        if (e->payload.len == payload->len && payload->len)
            CU_ASSERT_EQUAL(memcmp(e->payload.data, payload->data, payload->len), 0);
        moongate__v1__echo_message__free_unpacked(e, NULL);
    }
    free(resp);
    return seq;
}

/* mg_client_call on one persistent connection, sleeping and busy-polling, over both socket
 * kinds: answers in order (payloads larger than one read), the last message of a streaming
 * call, an error status with its message, a deadline that expires while polling, and a call on
 * a connection that failed. */
static void test_call_on_open_client(void)
{
    const char *targets[] = {tg.sock_target, tg.tcp_target};
    static uint8_t payload[100000], buf[100100];
    for (size_t i = 0; i < sizeof(payload); i++)
        payload[i] = (uint8_t)(i * 7);
    for (int t = 0; t < 2; t++) {
        for (int poll = 0; poll < 2; poll++) {
            struct event_base *base = event_base_new();
            mg_client_options o = {.target = targets[t], .busy_poll_us = poll ? 2000 : 0};
            mg_client *c = NULL;
            uint8_t *resp;
            size_t len;
            int status;
            char msg[256], err[256];
            CU_ASSERT_EQUAL_FATAL(mg_client_new(&c, base, &o, err, sizeof(err)), 0);
            for (int k = 0; k < 50; k++) {
                Moongate__V1__EchoMessage m = MOONGATE__V1__ECHO_MESSAGE__INIT;
                m.seq = (uint64_t)k;
                if (k % 10 == 9) { /* a reply of several reads */
                    m.payload.data = payload;
                    m.payload.len = sizeof(payload);
                }
                CU_ASSERT_EQUAL(echo_call(c, "/moongate.v1.Debug/Echo", &m.base, &m.payload),
                                (uint64_t)k);
            }
            {
                Moongate__V1__ExpandRequest x = MOONGATE__V1__EXPAND_REQUEST__INIT;
                ProtobufCBinaryData none = {0, NULL};
                x.count = 3;
                x.size = 0;
                CU_ASSERT_EQUAL(echo_call(c, "/moongate.v1.Debug/Expand", &x.base, &none), 2);
            }
            CU_ASSERT_EQUAL(mg_client_call(c, "/moongate.v1.Daemon/Nope", buf, 0, 5000, &resp, &len,
                                           &status, msg, sizeof(msg)),
                            0);
            CU_ASSERT_EQUAL(status, MG_GRPC_UNIMPLEMENTED);
            CU_ASSERT_PTR_NOT_NULL(strstr(msg, "/moongate.v1.Daemon/Nope"));
            CU_ASSERT_PTR_NULL(resp);
            {
                Moongate__V1__SleepRequest sl = MOONGATE__V1__SLEEP_REQUEST__INIT;
                sl.duration_ms = 3000;
                CU_ASSERT_EQUAL(mg_client_call(c, "/moongate.v1.Debug/Sleep", buf,
                                               pack(&sl.base, buf), 100, &resp, &len, &status, msg,
                                               sizeof(msg)),
                                0);
                CU_ASSERT_EQUAL(status, MG_GRPC_DEADLINE_EXCEEDED);
                CU_ASSERT_PTR_NULL(resp);
            }
            mg_client_del(c);
            event_base_loop(base, EVLOOP_NONBLOCK);
            event_base_free(base);
        }
    }
    {
        struct event_base *base = event_base_new();
        mg_client_options o = {.target = "127.0.0.1:1", .busy_poll_us = 1000};
        mg_client *c = NULL;
        uint8_t *resp;
        size_t len;
        int status;
        char msg[256], err[256];
        CU_ASSERT_EQUAL_FATAL(mg_client_new(&c, base, &o, err, sizeof(err)), 0);
        CU_ASSERT_EQUAL(mg_client_call(c, "/grpc.health.v1.Health/Check", buf, 0, 5000, &resp, &len,
                                       &status, msg, sizeof(msg)),
                        0);
        CU_ASSERT_EQUAL(status, MG_GRPC_UNAVAILABLE);
        CU_ASSERT_PTR_NOT_NULL(strstr(msg, "127.0.0.1:1"));
        /* The connection is known dead: the next call is not even started. */
        CU_ASSERT_EQUAL(mg_client_call(c, "/grpc.health.v1.Health/Check", buf, 0, 5000, &resp, &len,
                                       &status, msg, sizeof(msg)),
                        -1);
        CU_ASSERT_PTR_NOT_NULL(strstr(msg, "127.0.0.1:1"));
        mg_client_del(c);
        event_base_loop(base, EVLOOP_NONBLOCK);
        event_base_free(base);
    }
}

/* A user callback may delete its client while the library is failing the client's calls:
 * the gateway's peer directory does (a Submit's check ends, it opens a session, the old
 * connection is found dead and replaced). Two calls, the first one's close deletes the client,
 * the second still gets its close; under ASan a use after free would abort here. */
typedef struct {
    mg_client *c;
    int closed, deleted_in_cb;
    struct event_base *base;
} del_rec;

static void del_on_close(mg_rpc *rpc, int status, const char *message, void *arg)
{
    del_rec *r = arg;
    (void)rpc;
    (void)message;
    CU_ASSERT_TRUE(status == MG_GRPC_UNAVAILABLE || status == MG_GRPC_CANCELLED);
    if (r->closed++ == 0 && r->c) {
        mg_client_del(r->c);
        r->c = NULL;
        r->deleted_in_cb = 1;
    }
    if (r->closed == 2)
        event_base_loopbreak(r->base);
}

static void test_client_deleted_from_its_own_callback(void)
{
    static const mg_rpc_handlers h = {NULL, del_on_close};
    del_rec r = {0};
    r.base = event_base_new();
    r.c = client("127.0.0.1:1", r.base); /* refused: every call fails */
    CU_ASSERT_PTR_NOT_NULL_FATAL(r.c);
    CU_ASSERT_PTR_NOT_NULL(
        mg_rpc_start(r.c, "/grpc.health.v1.Health/Check", NULL, 0, 5000, &h, &r));
    CU_ASSERT_PTR_NOT_NULL(
        mg_rpc_start(r.c, "/grpc.health.v1.Health/Check", NULL, 0, 5000, &h, &r));
    while (r.closed < 2 && event_base_dispatch(r.base) == 0)
        ;
    CU_ASSERT_EQUAL(r.closed, 2);
    CU_ASSERT_TRUE(r.deleted_in_cb);
    event_base_free(r.base);
}

/* One unary call; returns the grpc status and the response (caller frees) in *resp. */
static int unary(const char *path, const ProtobufCMessage *req, uint8_t **resp, size_t *len)
{
    mg_client_options o = {.target = tg.sock_target};
    static uint8_t buf[4096];
    int status = -1;
    char *msg = NULL, err[256];
    CU_ASSERT_EQUAL(mg_client_unary(&o, path, buf, pack(req, buf), 10000, resp, len, &status, &msg,
                                    err, sizeof(err)),
                    0);
    free(msg);
    return status;
}

/* The hand-off rule for registration: every map and unmap the memory calls cause runs on an
 * engine worker, never on the gateway's loop thread (nor any other). */
static void test_registration_never_runs_on_the_loop(void)
{
    mg_registry *reg = mg_engine_registry(tg.engine);
    mg_registry_stats st;
    uint64_t ids[4];
    uint8_t *resp = NULL;
    size_t len = 0;
    char name[16];
    for (int i = 0; i < 3; i++) {
        Moongate__V1__RegisterRequest r = MOONGATE__V1__REGISTER_REQUEST__INIT;
        Moongate__V1__RegisterResponse *rr;
        snprintf(name, sizeof(name), "s%d", i);
        r.name = name;
        r.size = (uint64_t)(i + 1) << 20;
        r.prefault = 1;
        r.memlock = MOONGATE__V1__MEMLOCK__MEMLOCK_TRY;
        CU_ASSERT_EQUAL_FATAL(unary("/moongate.v1.Memory/RegisterSegment", &r.base, &resp, &len),
                              MG_GRPC_OK);
        rr = moongate__v1__register_response__unpack(NULL, len, resp);
        CU_ASSERT_PTR_NOT_NULL_FATAL(rr);
        ids[i] = rr->segment->id;
        moongate__v1__register_response__free_unpacked(rr, NULL);
        free(resp);
    }
    {
        Moongate__V1__RegisterSegmentsRequest b = MOONGATE__V1__REGISTER_SEGMENTS_REQUEST__INIT;
        Moongate__V1__RegisterRequest item = MOONGATE__V1__REGISTER_REQUEST__INIT;
        Moongate__V1__RegisterRequest *items[1] = {&item};
        Moongate__V1__RegisterSegmentsResponse *br;
        item.name = "batch";
        item.size = 4096;
        b.items = items;
        b.n_items = 1;
        CU_ASSERT_EQUAL_FATAL(unary("/moongate.v1.Memory/RegisterSegments", &b.base, &resp, &len),
                              MG_GRPC_OK);
        br = moongate__v1__register_segments_response__unpack(NULL, len, resp);
        CU_ASSERT_PTR_NOT_NULL_FATAL(br);
        CU_ASSERT_EQUAL_FATAL(br->results[0]->status->code, 0);
        ids[3] = br->results[0]->segment->id;
        moongate__v1__register_segments_response__free_unpacked(br, NULL);
        free(resp);
    }
    {
        Moongate__V1__UnregisterRequest u = MOONGATE__V1__UNREGISTER_REQUEST__INIT;
        Moongate__V1__UnregisterSegmentsRequest ub =
            MOONGATE__V1__UNREGISTER_SEGMENTS_REQUEST__INIT;
        u.id = ids[0];
        CU_ASSERT_EQUAL(unary("/moongate.v1.Memory/UnregisterSegment", &u.base, &resp, &len),
                        MG_GRPC_OK);
        free(resp);
        ub.ids = ids + 1;
        ub.n_ids = 3;
        CU_ASSERT_EQUAL(unary("/moongate.v1.Memory/UnregisterSegments", &ub.base, &resp, &len),
                        MG_GRPC_OK);
        free(resp);
    }
    mg_registry_get_stats(reg, &st);
    CU_ASSERT_EQUAL(st.segments, 0);
    CU_ASSERT_EQUAL(st.jobs, 8); /* four maps, four unmaps */
    CU_ASSERT_EQUAL(st.jobs_off_worker, 0);
}

/* A batch whose items partly fail: each item has its own result, and the failed ones leave
 * nothing behind (no segment, no bytes, no file). */
static void test_batch_partial_failure(void)
{
    mg_registry *reg = mg_engine_registry(tg.engine);
    Moongate__V1__RegisterSegmentsRequest b = MOONGATE__V1__REGISTER_SEGMENTS_REQUEST__INIT;
    Moongate__V1__RegisterRequest it[4] = {
        MOONGATE__V1__REGISTER_REQUEST__INIT, MOONGATE__V1__REGISTER_REQUEST__INIT,
        MOONGATE__V1__REGISTER_REQUEST__INIT, MOONGATE__V1__REGISTER_REQUEST__INIT};
    Moongate__V1__RegisterRequest *items[4] = {&it[0], &it[1], &it[2], &it[3]};
    Moongate__V1__RegisterSegmentsResponse *br;
    Moongate__V1__UnregisterSegmentsRequest ub = MOONGATE__V1__UNREGISTER_SEGMENTS_REQUEST__INIT;
    mg_registry_stats st;
    uint64_t ids[2];
    uint8_t *resp = NULL;
    size_t len = 0;
    it[0].name = "ok-1";
    it[0].size = 8192;
    it[1].name = "zero"; /* size 0: INVALID_ARGUMENT */
    it[2].name = "ok-1"; /* the name of item 0: ALREADY_EXISTS */
    it[2].size = 4096;
    it[3].name = "shm-missing"; /* fails on its worker: no such file */
    it[3].source = MOONGATE__V1__SEGMENT_SOURCE__SHM;
    it[3].shm_file = "not-there";
    b.items = items;
    b.n_items = 4;
    CU_ASSERT_EQUAL_FATAL(unary("/moongate.v1.Memory/RegisterSegments", &b.base, &resp, &len),
                          MG_GRPC_OK);
    br = moongate__v1__register_segments_response__unpack(NULL, len, resp);
    free(resp);
    CU_ASSERT_PTR_NOT_NULL_FATAL(br);
    CU_ASSERT_EQUAL_FATAL(br->n_results, 4);
    CU_ASSERT_EQUAL(br->results[0]->status->code, MG_GRPC_OK);
    CU_ASSERT_EQUAL(br->results[1]->status->code, MG_GRPC_INVALID_ARGUMENT);
    CU_ASSERT_EQUAL(br->results[2]->status->code, MG_GRPC_ALREADY_EXISTS);
    CU_ASSERT_EQUAL(br->results[3]->status->code, MG_GRPC_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(br->results[3]->status->message, "not-there"));
    CU_ASSERT_PTR_NULL(br->results[1]->segment);
    ids[0] = br->results[0]->segment->id;
    moongate__v1__register_segments_response__free_unpacked(br, NULL);
    mg_registry_get_stats(reg, &st);
    CU_ASSERT_EQUAL(st.segments, 1); /* only item 0 */
    CU_ASSERT_EQUAL(st.registering, 0);
    CU_ASSERT_EQUAL(st.bytes, 8192);
    ids[1] = 12345; /* unknown: its own NOT_FOUND, the other still goes */
    ub.ids = ids;
    ub.n_ids = 2;
    CU_ASSERT_EQUAL(unary("/moongate.v1.Memory/UnregisterSegments", &ub.base, &resp, &len),
                    MG_GRPC_OK);
    {
        Moongate__V1__UnregisterSegmentsResponse *ur =
            moongate__v1__unregister_segments_response__unpack(NULL, len, resp);
        CU_ASSERT_PTR_NOT_NULL_FATAL(ur);
        CU_ASSERT_EQUAL(ur->results[0]->code, MG_GRPC_OK);
        CU_ASSERT_EQUAL(ur->results[1]->code, MG_GRPC_NOT_FOUND);
        moongate__v1__unregister_segments_response__free_unpacked(ur, NULL);
    }
    free(resp);
    mg_registry_get_stats(reg, &st);
    CU_ASSERT_EQUAL(st.segments, 0);
    CU_ASSERT_EQUAL(st.bytes, 0);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_unary_over_unix_and_tcp),
        MG_TEST(test_server_streaming),
        MG_TEST(test_client_streaming),
        MG_TEST(test_bidi_lock_step),
        MG_TEST(test_deadline_and_cancel),
        MG_TEST(test_unknown_method),
        MG_TEST(test_blocking_unary_and_unreachable),
        MG_TEST(test_call_on_open_client),
        MG_TEST(test_client_deleted_from_its_own_callback),
        MG_TEST(test_registration_never_runs_on_the_loop),
        MG_TEST(test_batch_partial_failure),
    };
    int rc;
    signal(SIGPIPE, SIG_IGN); /* as the daemon and mgctl do */
    evthread_use_pthreads();
    if (mg_test_gw_start(&tg, "client", 1, 1, 16, MG_LOG_WARN) != 0) {
        fprintf(stderr, "could not start the gateway\n");
        return 1;
    }
    rc = mg_test_run("client library", cases, sizeof(cases) / sizeof(cases[0]));
    mg_test_gw_stop(&tg);
    return rc;
}
