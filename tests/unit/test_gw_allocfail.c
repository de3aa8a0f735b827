/*
 * Allocation failures walked through the gateway's request paths: the real gateway runs in a
 * thread of this process, a client in the main thread makes a fixed series of calls (health,
 * info, register, get, list, read, unregister, a JSON call), and run N fails the N-th
 * allocation the gateway's loop thread makes in the moongate libraries (linked with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc) and every one after it in that run. Each call
 * may fail — with a status, or the connection closing — but the daemon must not crash, must
 * serve the next calls once allocations succeed again, and must leave no segment behind that
 * its caller did not get (ASan checks for leaks at exit in the sanitizer build).
 */
#include "mg_client.h"
#include "mg_config.h"
#include "mg_gateway.h"
#include "mg_log.h"
#include "mg_test.h"
#include "mg_test_gateway.h"

#include "grpc/health/v1/health.pb-c.h"
#include "moongate/v1/daemon.pb-c.h"
#include "moongate/v1/memory.pb-c.h"

#include <event2/event.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static __thread int on_loop; /* this thread is the gateway's loop */
static long countdown = -1;  /* loop allocations left before they fail; -1: never */
static long reached;         /* loop allocations made in this run */

static int fail_now(void)
{
    long left;
    if (!on_loop)
        return 0;
    __atomic_add_fetch(&reached, 1, __ATOMIC_RELAXED);
    left = __atomic_load_n(&countdown, __ATOMIC_RELAXED);
    if (left < 0)
        return 0;
    if (left == 0)
        return 1;
    __atomic_sub_fetch(&countdown, 1, __ATOMIC_RELAXED);
    return 0;
}

#include "mg_allocfail.h"

static mg_test_gw tg;

static void mark_loop_thread(void)
{
    on_loop = 1;
}

/* One unary call; returns the gRPC status (14 when the call could not be made or the
 * connection closed) and the reply in *out (caller frees) when OK. */
static int call(const char *path, const ProtobufCMessage *req, uint8_t **out, size_t *out_len)
{
    mg_client_options o = {.target = tg.sock_target};
    uint8_t buf[512];
    size_t n = protobuf_c_message_pack(req, buf);
    int status = 14;
    char *message = NULL, err[256];
    *out = NULL;
    *out_len = 0;
    if (mg_client_unary(&o, path, buf, n, 5000, out, out_len, &status, &message, err,
                        sizeof(err)) != 0)
        status = 14;
    free(message);
    return status;
}

/* The series of calls one run makes. Returns how many ended OK. */
static int series(void)
{
    Grpc__Health__V1__HealthCheckRequest hc = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Moongate__V1__InfoRequest ir = MOONGATE__V1__INFO_REQUEST__INIT;
    Moongate__V1__RegisterRequest rr = MOONGATE__V1__REGISTER_REQUEST__INIT;
    Moongate__V1__ListSegmentsRequest lr = MOONGATE__V1__LIST_SEGMENTS_REQUEST__INIT;
    Moongate__V1__GetSegmentRequest gr = MOONGATE__V1__GET_SEGMENT_REQUEST__INIT;
    Moongate__V1__ReadSegmentRequest rd = MOONGATE__V1__READ_SEGMENT_REQUEST__INIT;
    Moongate__V1__UnregisterRequest ur = MOONGATE__V1__UNREGISTER_REQUEST__INIT;
    uint8_t *resp;
    size_t len;
    int ok = 0;
    uint64_t id = 0;
    ok += call("/grpc.health.v1.Health/Check", &hc.base, &resp, &len) == 0;
    free(resp);
    ok += call("/moongate.v1.Daemon/Info", &ir.base, &resp, &len) == 0;
    free(resp);
    rr.name = "walk";
    rr.size = 4096;
    if (call("/moongate.v1.Memory/RegisterSegment", &rr.base, &resp, &len) == 0) {
        Moongate__V1__RegisterResponse *r =
            moongate__v1__register_response__unpack(NULL, len, resp);
        if (r && r->segment)
            id = r->segment->id;
        moongate__v1__register_response__free_unpacked(r, NULL);
        ok++;
    }
    free(resp);
    gr.id = id;
    ok += call("/moongate.v1.Memory/GetSegment", &gr.base, &resp, &len) == 0;
    free(resp);
    ok += call("/moongate.v1.Memory/ListSegments", &lr.base, &resp, &len) == 0;
    free(resp);
    rd.id = id;
    rd.length = 4096;
    (void)call("/moongate.v1.Memory/ReadSegment", &rd.base, &resp, &len);
    free(resp);
    ur.id = id;
    ok += call("/moongate.v1.Memory/UnregisterSegment", &ur.base, &resp, &len) == 0;
    free(resp);
    return ok;
}

/* With allocations succeeding again: the daemon serves, and holds no segment of the walk
 * (one its caller did not get is undone by the daemon; one the caller got is unregistered). */
static void settle(void)
{
    Moongate__V1__ListSegmentsRequest lr = MOONGATE__V1__LIST_SEGMENTS_REQUEST__INIT;
    Grpc__Health__V1__HealthCheckRequest hc = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    uint8_t *resp;
    size_t len;
    for (int tries = 0; tries < 200; tries++) {
        Moongate__V1__ListSegmentsResponse *l;
        CU_ASSERT_EQUAL_FATAL(call("/grpc.health.v1.Health/Check", &hc.base, &resp, &len), 0);
        free(resp);
        CU_ASSERT_EQUAL_FATAL(call("/moongate.v1.Memory/ListSegments", &lr.base, &resp, &len), 0);
        l = moongate__v1__list_segments_response__unpack(NULL, len, resp);
        free(resp);
        CU_ASSERT_PTR_NOT_NULL_FATAL(l);
        for (size_t i = 0; i < l->n_segments; i++) { /* what a failed unregister left */
            Moongate__V1__UnregisterRequest ur = MOONGATE__V1__UNREGISTER_REQUEST__INIT;
            ur.id = l->segments[i]->id;
            (void)call("/moongate.v1.Memory/UnregisterSegment", &ur.base, &resp, &len);
            free(resp);
        }
        if (l->n_segments == 0) {
            moongate__v1__list_segments_response__free_unpacked(l, NULL);
            return;
        }
        moongate__v1__list_segments_response__free_unpacked(l, NULL);
        usleep(10000);
    }
    CU_FAIL("segments of the walk are left");
}

static void test_walk(void)
{
    long n, total;
    CU_ASSERT_EQUAL_FATAL(series(), 6); /* the whole series works when nothing fails */
    settle();
    __atomic_store_n(&reached, 0, __ATOMIC_RELAXED);
    series();
    total = __atomic_load_n(&reached, __ATOMIC_RELAXED);
    CU_ASSERT(total > 20);
    for (n = 0; n <= total; n++) {
        __atomic_store_n(&reached, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&countdown, n, __ATOMIC_RELAXED);
        series();
        __atomic_store_n(&countdown, -1, __ATOMIC_RELAXED);
        settle();
    }
    printf("\n  %ld loop allocations in the series, each made to fail in turn\n", total);
}

int main(void)
{
    static const mg_test_case cases[] = {MG_TEST(test_walk)};
    int rc;
    signal(SIGPIPE, SIG_IGN);
    tg.on_loop_thread = mark_loop_thread;
    if (mg_test_gw_start(&tg, "gwfail", 0, 0, 64, MG_LOG_ERROR) != 0) {
        fprintf(stderr, "cannot start the gateway\n");
        return 1;
    }
    rc = mg_test_run("allocation failures in the gateway", cases, sizeof(cases) / sizeof(cases[0]));
    mg_test_gw_stop(&tg);
    return rc;
}
