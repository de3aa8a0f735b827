/* Unit tests for mg_json: the proto3 JSON mapping over protobuf-c descriptors. */
#include "mg_json.h"
#include "mg_pbcheck.h"
#include "mg_test.h"

#include "grpc/health/v1/health.pb-c.h"
#include "grpc/reflection/v1/reflection.pb-c.h"
#include "moongate/v1/daemon.pb-c.h"
#include "moongate/v1/debug.pb-c.h"
#include "moongate/v1/memory.pb-c.h"
#include "moongate/v1/notify.pb-c.h"

#include <stdlib.h>
#include <string.h>

static char *dump(const ProtobufCMessage *m)
{
    json_t *j = mg_json_from_message(m);
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return s;
}

static ProtobufCMessage *load(const ProtobufCMessageDescriptor *d, const char *text, char *err)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    ProtobufCMessage *m;
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    m = mg_json_to_message(d, j, err, 256);
    json_decref(j);
    return m;
}

static void test_names(void)
{
    char out[64];
    mg_json_name(out, sizeof(out), "start_unix_ms");
    CU_ASSERT_STRING_EQUAL(out, "startUnixMs");
    mg_json_name(out, sizeof(out), "payload");
    CU_ASSERT_STRING_EQUAL(out, "payload");
}

static void test_encode_info(void)
{
    Moongate__V1__InfoResponse r = MOONGATE__V1__INFO_RESPONSE__INIT;
    Moongate__V1__TransportInfo t = MOONGATE__V1__TRANSPORT_INFO__INIT;
    Moongate__V1__TransportInfo *tp[1] = {&t};
    char *features[2] = {"tls", "json"};
    char *s;
    r.version = "1.2.3";
    r.epoch = 18446744073709551615ULL;
    r.uptime_ms = 5;
    r.features = features;
    r.n_features = 2;
    t.name = "tcp";
    t.available = 1;
    r.transports = tp;
    r.n_transports = 1;
    r.workers = 4;
    s = dump(&r.base);
    CU_ASSERT_STRING_EQUAL(
        s, "{\"epoch\":\"18446744073709551615\",\"features\":[\"tls\",\"json\"],"
           "\"maxWaitMs\":\"0\",\"openFilesLimit\":\"0\",\"startUnixMs\":\"0\",\"state\":\"\","
           "\"transports\":[{"
           "\"available\":true,"
           "\"devices\":[],\"endpoint\":\"\",\"name\":\"tcp\",\"reason\":\"\"}],\"uptimeMs\":\"5\","
           "\"version\":"
           "\"1.2.3\","
           "\"workerQueueDepth\":0,\"workers\":4}");
    free(s);
}

static void test_enum_by_name_and_number(void)
{
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    char err[256], *s;
    ProtobufCMessage *m;
    r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    s = dump(&r.base);
    CU_ASSERT_STRING_EQUAL(s, "{\"status\":\"NOT_SERVING\"}");
    free(s);
    m = load(&grpc__health__v1__health_check_response__descriptor, "{\"status\":\"SERVING\"}", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(((Grpc__Health__V1__HealthCheckResponse *)m)->status, 1);
    protobuf_c_message_free_unpacked(m, NULL);
    m = load(&grpc__health__v1__health_check_response__descriptor, "{\"status\":3}", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(((Grpc__Health__V1__HealthCheckResponse *)m)->status, 3);
    protobuf_c_message_free_unpacked(m, NULL);
    m = load(&grpc__health__v1__health_check_response__descriptor, "{\"status\":\"MAYBE\"}", err);
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "status"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "ServingStatus"));
}

static void test_bytes_and_64bit_round_trip(void)
{
    char err[256], *s;
    Moongate__V1__EchoMessage *e;
    ProtobufCMessage *m = load(&moongate__v1__echo_message__descriptor,
                               "{\"payload\":\"AP8Q\",\"seq\":\"9007199254740993\"}", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    e = (void *)m;
    CU_ASSERT_EQUAL(e->payload.len, 3);
    CU_ASSERT_EQUAL(e->payload.data[1], 0xff);
    CU_ASSERT_EQUAL(e->seq, 9007199254740993ULL); /* not representable as a double */
    s = dump(m);
    CU_ASSERT_STRING_EQUAL(s, "{\"payload\":\"AP8Q\",\"seq\":\"9007199254740993\"}");
    free(s);
    protobuf_c_message_free_unpacked(m, NULL);
    /* Numbers are accepted for 64-bit fields; URL-safe unpadded base64 for bytes. */
    m = load(&moongate__v1__echo_message__descriptor, "{\"payload\":\"-_8\",\"seq\":12}", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    e = (void *)m;
    CU_ASSERT_EQUAL(e->seq, 12);
    CU_ASSERT_EQUAL(e->payload.len, 2);
    protobuf_c_message_free_unpacked(m, NULL);
}

static void test_both_field_name_spellings(void)
{
    char err[256];
    ProtobufCMessage *m =
        load(&moongate__v1__sleep_request__descriptor, "{\"duration_ms\":7}", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(((Moongate__V1__SleepRequest *)m)->duration_ms, 7);
    protobuf_c_message_free_unpacked(m, NULL);
    m = load(&moongate__v1__sleep_request__descriptor, "{\"durationMs\":null}", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(((Moongate__V1__SleepRequest *)m)->duration_ms, 0);
    protobuf_c_message_free_unpacked(m, NULL);
}

static void expect_error(const ProtobufCMessageDescriptor *d, const char *text, const char *needle)
{
    char err[256];
    ProtobufCMessage *m = load(d, text, err);
    CU_ASSERT_PTR_NULL(m);
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, needle));
}

static void test_errors_name_the_field(void)
{
    const ProtobufCMessageDescriptor *sleep = &moongate__v1__sleep_request__descriptor;
    const ProtobufCMessageDescriptor *info = &moongate__v1__info_response__descriptor;
    expect_error(sleep, "{\"nope\":1}", "unknown field \"nope\"");
    expect_error(sleep, "{\"durationMs\":-1}", "negative");
    expect_error(sleep, "{\"durationMs\":4294967296}", "out of range for uint32");
    expect_error(sleep, "{\"durationMs\":1.5}", "integer");
    expect_error(sleep, "{\"durationMs\":\"12a\"}", "integer");
    expect_error(sleep, "{\"durationMs\":true}", "integer");
    expect_error(sleep, "[]", "JSON object");
    expect_error(&moongate__v1__echo_message__descriptor, "{\"payload\":\"@@\"}", "base64");
    expect_error(info, "{\"features\":\"x\"}", "expected an array");
    expect_error(info, "{\"features\":[\"a\",1]}", "features[1]");
    expect_error(info, "{\"transports\":[{\"name\":\"tcp\"},{\"available\":\"yes\"}]}",
                 "transports[1].available");
    expect_error(info, "{\"version\":\"a\\u0000b\"}", "NUL");
}

static void test_utf8(void)
{
    static const struct {
        const char *s;
        size_t len;
        int ok;
    } cases[] = {
        {"plain ascii", 11, 1},
        {"\xc3\xa9t\xc3\xa9", 6, 1}, /* é */
        {"\xe2\x82\xac", 3, 1},      /* € */
        {"\xf0\x9f\x98\x80", 4, 1},  /* U+1F600 */
        {"\xf4\x8f\xbf\xbf", 4, 1},  /* U+10FFFF, the last */
        {"\xff", 1, 0},              /* never in UTF-8 */
        {"\x80", 1, 0},              /* a continuation first */
        {"\xc0\x80", 2, 0},          /* overlong NUL */
        {"\xe0\x80\xaf", 3, 0},      /* overlong '/' */
        {"\xf0\x80\x80\xaf", 4, 0},  /* overlong '/' */
        {"\xed\xa0\x80", 3, 0},      /* a surrogate */
        {"\xf4\x90\x80\x80", 4, 0},  /* above U+10FFFF */
        {"\xe2\x82", 2, 0},          /* cut short */
        {"a\xc3", 2, 0},             /* cut short at the end */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        CU_ASSERT_EQUAL(mg_utf8_valid((const uint8_t *)cases[i].s, cases[i].len), cases[i].ok);
    CU_ASSERT_STRING_EQUAL(mg_string_problem((const uint8_t *)"a\0b", 3), "holds a NUL byte");
    CU_ASSERT_STRING_EQUAL(mg_string_problem((const uint8_t *)"a\xff"
                                                              "b",
                                             3),
                           "is not valid UTF-8");
    CU_ASSERT_PTR_NULL(mg_string_problem((const uint8_t *)"", 0));
}

/* Packs a RegisterSegmentsRequest of three items, then puts `bad` into the second item's
 * name ("nameX" -> bytes of the same length), the way a hostile client would. */
static size_t bad_batch(uint8_t *buf, const char *bad)
{
    Moongate__V1__RegisterSegmentsRequest r = MOONGATE__V1__REGISTER_SEGMENTS_REQUEST__INIT;
    Moongate__V1__RegisterRequest it[3], *items[3];
    size_t len;
    uint8_t *p;
    for (int i = 0; i < 3; i++) {
        moongate__v1__register_request__init(&it[i]);
        it[i].name = i == 1 ? "nameX" : "fine";
        it[i].shm_file = "f";
        items[i] = &it[i];
    }
    r.items = items;
    r.n_items = 3;
    len = moongate__v1__register_segments_request__pack(&r, buf);
    p = memmem(buf, len, "nameX", 5);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    memcpy(p, bad, 5);
    return len;
}

/* Strings are checked on the encoded message, at any depth, before protobuf-c cuts them. */
static void test_strings_checked_before_decoding(void)
{
    const ProtobufCMessageDescriptor *d = &moongate__v1__register_segments_request__descriptor;
    uint8_t buf[256];
    char err[256];
    size_t len = bad_batch(buf, "nameX");
    CU_ASSERT_EQUAL(mg_pb_check_strings(d, buf, len, err, sizeof(err)), 0);
    len = bad_batch(buf, "na\0eX");
    CU_ASSERT_EQUAL(mg_pb_check_strings(d, buf, len, err, sizeof(err)), -1);
    CU_ASSERT_STRING_EQUAL(err, "field \"items[1].name\": holds a NUL byte");
    len = bad_batch(buf, "na\xc0\x80X");
    CU_ASSERT_EQUAL(mg_pb_check_strings(d, buf, len, err, sizeof(err)), -1);
    CU_ASSERT_STRING_EQUAL(err, "field \"items[1].name\": is not valid UTF-8");
    /* Malformed input is the decoder's to refuse; unknown fields are skipped. */
    CU_ASSERT_EQUAL(mg_pb_check_strings(d, (const uint8_t *)"\x0a\x7f", 2, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(
        mg_pb_check_strings(d, (const uint8_t *)"\xfa\x01\x02\x00\xff", 5, err, sizeof(err)), 0);
}

/* A key for field 0 written in two bytes (80 00) is an unknown field to protobuf-c, which goes
 * on decoding; the check must go on too (found by fuzz_proto). */
static void test_strings_checked_after_field_zero(void)
{
    const ProtobufCMessageDescriptor *d = &moongate__v1__notification__descriptor;
    static const uint8_t msg[] = "\x80\x00\x18\x0a\x02\xc0\x80";
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, sizeof(msg) - 1, msg);
    char err[256];
    CU_ASSERT_PTR_NOT_NULL_FATAL(m); /* the decoder takes it: the check is all that stands */
    protobuf_c_message_free_unpacked(m, NULL);
    CU_ASSERT_EQUAL(mg_pb_check_strings(d, msg, sizeof(msg) - 1, err, sizeof(err)), -1);
    CU_ASSERT_STRING_EQUAL(err, "field \"topic\": is not valid UTF-8");
}

/* Reals given for integer fields are range-checked before conversion (found by fuzz_json). */
static void test_reals_for_integer_fields(void)
{
    char err[256];
    ProtobufCMessage *m = load(&moongate__v1__echo_message__descriptor, "{\"seq\": 1.5e19}", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(((Moongate__V1__EchoMessage *)m)->seq, 15000000000000000000ULL);
    protobuf_c_message_free_unpacked(m, NULL);
    expect_error(&moongate__v1__echo_message__descriptor, "{\"seq\": 1.8446744073709552e19}",
                 "out of range");
    expect_error(&moongate__v1__echo_message__descriptor, "{\"seq\": -1.0}", "negative");
    expect_error(&moongate__v1__expand_request__descriptor, "{\"count\": 15555555555555555556.8}",
                 "out of range for uint32");
    expect_error(&moongate__v1__expand_request__descriptor, "{\"count\": 1e300}", "out of range");
    expect_error(&moongate__v1__expand_request__descriptor, "{\"count\": 2.5}", "integer");
}

/* A query string's values are strings: "true" and "false" stand for the booleans. */
static void test_bools_as_strings(void)
{
    const ProtobufCMessageDescriptor *info = &moongate__v1__info_response__descriptor;
    char err[256];
    ProtobufCMessage *m =
        load(info, "{\"transports\":[{\"available\":\"true\"},{\"available\":\"false\"}]}", err);
    Moongate__V1__InfoResponse *r = (Moongate__V1__InfoResponse *)m;
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL_FATAL(r->n_transports, 2);
    CU_ASSERT_TRUE(r->transports[0]->available);
    CU_ASSERT_FALSE(r->transports[1]->available);
    protobuf_c_message_free_unpacked(m, NULL);
    expect_error(info, "{\"transports\":[{\"available\":\"True\"}]}", "true or false");
    expect_error(info, "{\"transports\":[{\"available\":1}]}", "true or false");
}

static void test_nested_and_repeated_decode(void)
{
    char err[256];
    Moongate__V1__InfoResponse *r;
    ProtobufCMessage *m = load(&moongate__v1__info_response__descriptor,
                               "{\"features\":[\"a\",\"b\"],\"transports\":[{\"name\":\"tcp\","
                               "\"available\":true},{\"name\":\"rdma\",\"reason\":\"none\"}],"
                               "\"epoch\":\"1\"}",
                               err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    r = (void *)m;
    CU_ASSERT_EQUAL(r->n_features, 2);
    CU_ASSERT_STRING_EQUAL(r->features[1], "b");
    CU_ASSERT_EQUAL(r->n_transports, 2);
    CU_ASSERT_TRUE(r->transports[0]->available);
    CU_ASSERT_STRING_EQUAL(r->transports[1]->reason, "none");
    CU_ASSERT_EQUAL(r->epoch, 1);
    protobuf_c_message_free_unpacked(m, NULL);
}

static void test_oneof(void)
{
    char err[256], *s;
    Grpc__Reflection__V1__ServerReflectionRequest *r;
    ProtobufCMessage *m = load(&grpc__reflection__v1__server_reflection_request__descriptor,
                               "{\"host\":\"h\",\"fileContainingSymbol\":\"a.B\"}", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    r = (void *)m;
    CU_ASSERT_EQUAL(
        r->message_request_case,
        GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL);
    s = dump(m);
    /* Only the set member of the oneof is emitted. */
    CU_ASSERT_STRING_EQUAL(s, "{\"fileContainingSymbol\":\"a.B\",\"host\":\"h\"}");
    free(s);
    protobuf_c_message_free_unpacked(m, NULL);
    expect_error(&grpc__reflection__v1__server_reflection_request__descriptor,
                 "{\"fileByFilename\":\"x\",\"listServices\":\"*\"}", "oneof");
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_names),
        MG_TEST(test_encode_info),
        MG_TEST(test_enum_by_name_and_number),
        MG_TEST(test_bytes_and_64bit_round_trip),
        MG_TEST(test_both_field_name_spellings),
        MG_TEST(test_errors_name_the_field),
        MG_TEST(test_reals_for_integer_fields),
        MG_TEST(test_bools_as_strings),
        MG_TEST(test_nested_and_repeated_decode),
        MG_TEST(test_oneof),
        MG_TEST(test_utf8),
        MG_TEST(test_strings_checked_before_decoding),
        MG_TEST(test_strings_checked_after_field_zero),
    };
    return mg_test_run("json mapping", cases, sizeof(cases) / sizeof(cases[0]));
}
