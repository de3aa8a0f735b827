/* Unit tests for mg_grpc (status codes, percent-encoding, grpc-timeout, deframer) and mg_b64. */
#include "mg_addr.h"
#include "mg_b64.h"
#include "mg_grpc.h"
#include "mg_test.h"
#include "moongate/mg_error.h"

#include <stdlib.h>
#include <string.h>

/* Each engine error code has its one gRPC status, at the edge. */
static void test_engine_errors_map_to_grpc(void)
{
    CU_ASSERT_EQUAL(mg_err_grpc(0), MG_GRPC_OK);
    CU_ASSERT_EQUAL(mg_err_grpc(MG_ERR_INVALID), MG_GRPC_INVALID_ARGUMENT);
    CU_ASSERT_EQUAL(mg_err_grpc(MG_ERR_FULL), MG_GRPC_RESOURCE_EXHAUSTED);
    CU_ASSERT_EQUAL(mg_err_grpc(MG_ERR_BUSY), MG_GRPC_FAILED_PRECONDITION);
    CU_ASSERT_EQUAL(mg_err_grpc(MG_ERR_SHUTDOWN), MG_GRPC_UNAVAILABLE);
    CU_ASSERT_EQUAL(mg_err_grpc(MG_ERR_AUTH), MG_GRPC_UNAUTHENTICATED);
    CU_ASSERT_EQUAL(mg_err_grpc(MG_ERR_QUOTA), MG_GRPC_RESOURCE_EXHAUSTED);
    CU_ASSERT_EQUAL(mg_err_grpc(-MG_ERR_COUNT), MG_GRPC_UNKNOWN);
    CU_ASSERT_EQUAL(mg_err_grpc(5), MG_GRPC_UNKNOWN);
    for (int e = 0; e < MG_ERR_COUNT; e++) /* every one maps, and not to UNKNOWN */
        CU_ASSERT(mg_err_grpc(-e) != MG_GRPC_UNKNOWN);
}

static void test_code_names_and_http(void)
{
    CU_ASSERT_STRING_EQUAL(mg_grpc_code_name(0), "OK");
    CU_ASSERT_STRING_EQUAL(mg_grpc_code_name(16), "UNAUTHENTICATED");
    CU_ASSERT_STRING_EQUAL(mg_grpc_code_name(99), "UNKNOWN");
    CU_ASSERT_EQUAL(mg_grpc_code_parse("NOT_FOUND"), 5);
    CU_ASSERT_EQUAL(mg_grpc_code_parse("14"), 14);
    CU_ASSERT_EQUAL(mg_grpc_code_parse("17"), -1);
    CU_ASSERT_EQUAL(mg_grpc_code_parse("5x"), -1);
    CU_ASSERT_EQUAL(mg_grpc_code_parse("0"), 0);
    CU_ASSERT_EQUAL(mg_grpc_code_parse("05"), 5);
    CU_ASSERT_EQUAL(mg_grpc_code_parse("16"), 16);
    CU_ASSERT_EQUAL(mg_grpc_code_parse(""), -1);
    CU_ASSERT_EQUAL(mg_grpc_code_parse("-1"), -1);
    CU_ASSERT_EQUAL(mg_grpc_code_parse("999999999"), -1);
    CU_ASSERT_EQUAL(mg_grpc_code_http(MG_GRPC_NOT_FOUND), 404);
    CU_ASSERT_EQUAL(mg_grpc_code_http(MG_GRPC_RESOURCE_EXHAUSTED), 429);
    CU_ASSERT_EQUAL(mg_grpc_code_http(MG_GRPC_CANCELLED), 499);
    CU_ASSERT_EQUAL(mg_grpc_code_http(MG_GRPC_UNIMPLEMENTED), 501);
}

static void test_pct_encode_spec_example(void)
{
    /* grpc-message: "ünïcode % test" -> "%C3%BCn%C3%AFcode %25 test" */
    const char *in = "\xc3\xbcn\xc3\xaf"
                     "code % test";
    char out[64];
    size_t need = mg_pct_encode(out, sizeof(out), in, strlen(in));
    CU_ASSERT_STRING_EQUAL(out, "%C3%BCn%C3%AFcode %25 test");
    CU_ASSERT_EQUAL(need, strlen(out));
}

static void test_pct_whitespace_round_trip(void)
{
    const char *in = "\t\ntest with whitespace\r\nand Unicode BMP \xe2\x98\xba\t\n";
    char enc[256], dec[256];
    mg_pct_encode(enc, sizeof(enc), in, strlen(in));
    CU_ASSERT_PTR_NULL(strpbrk(enc, "\t\r\n"));
    mg_pct_decode(dec, enc, strlen(enc));
    CU_ASSERT_STRING_EQUAL(dec, in);
}

static void test_pct_truncation_never_splits_an_escape(void)
{
    char out[6];
    size_t need = mg_pct_encode(out, sizeof(out), "ab%cd", 5);
    CU_ASSERT_EQUAL(need, 7);
    CU_ASSERT_STRING_EQUAL(out, "ab%25"); /* 5 bytes + NUL fit exactly */
    need = mg_pct_encode(out, 5, "ab%cd", 5);
    CU_ASSERT_STRING_EQUAL(out, "ab");
}

static void test_pct_decode_malformed_passes_through(void)
{
    char out[32];
    mg_pct_decode(out, "100%", 4);
    CU_ASSERT_STRING_EQUAL(out, "100%");
    mg_pct_decode(out, "%zz%4", 5);
    CU_ASSERT_STRING_EQUAL(out, "%zz%4");
    mg_pct_decode(out, "%41%62", 6);
    CU_ASSERT_STRING_EQUAL(out, "Ab");
}

static void test_timeout_parse(void)
{
    uint64_t ns;
    CU_ASSERT_EQUAL(mg_grpc_timeout_parse("2500m", 5, &ns), 0);
    CU_ASSERT_EQUAL(ns, 2500000000ULL);
    CU_ASSERT_EQUAL(mg_grpc_timeout_parse("1H", 2, &ns), 0);
    CU_ASSERT_EQUAL(ns, 3600000000000ULL);
    CU_ASSERT_EQUAL(mg_grpc_timeout_parse("99999999H", 9, &ns), 0);
    CU_ASSERT_EQUAL(ns, 99999999ULL * 3600000000000ULL);
    CU_ASSERT_EQUAL(mg_grpc_timeout_parse("7n", 2, &ns), 0);
    CU_ASSERT_EQUAL(ns, 7);
    CU_ASSERT_EQUAL(mg_grpc_timeout_parse("123456789S", 10, &ns), -1); /* 9 digits */
    CU_ASSERT_EQUAL(mg_grpc_timeout_parse("S", 1, &ns), -1);
    CU_ASSERT_EQUAL(mg_grpc_timeout_parse("10x", 3, &ns), -1);
    CU_ASSERT_EQUAL(mg_grpc_timeout_parse("-1S", 3, &ns), -1);
    CU_ASSERT_EQUAL(mg_grpc_timeout_parse("1 S", 3, &ns), -1);
}

static void test_timeout_format_never_shortens(void)
{
    char buf[16];
    uint64_t ns,
        samples[] = {
            1, 999, 1000, 1500, 2500000000ULL, 100000000000ULL, 3600000000000ULL * 30000000ULL};
    for (size_t i = 0; i < sizeof(samples) / sizeof(samples[0]); i++) {
        size_t n = mg_grpc_timeout_format(buf, samples[i]);
        CU_ASSERT(n >= 2 && n <= 9);
        CU_ASSERT_EQUAL(mg_grpc_timeout_parse(buf, n, &ns), 0);
        CU_ASSERT(ns >= samples[i]);
    }
    mg_grpc_timeout_format(buf, 2500000000ULL);
    CU_ASSERT_STRING_EQUAL(buf, "2500000u");
    CU_ASSERT_EQUAL(mg_grpc_timeout_format(buf, 0), 2);
    CU_ASSERT_STRING_EQUAL(buf, "0n");
    mg_grpc_timeout_format(buf, 60000000000ULL);
    CU_ASSERT_STRING_EQUAL(buf, "60000000u");
    mg_grpc_timeout_format(buf, UINT64_MAX); /* rounded up without wrapping */
    CU_ASSERT_STRING_EQUAL(buf, "5124096H");
}

typedef struct {
    int count;
    size_t lens[16];
    uint8_t first[16];
} sink;

static int collect(void *arg, const uint8_t *msg, size_t len)
{
    sink *s = arg;
    if (s->count < 16) {
        s->lens[s->count] = len;
        s->first[s->count] = len ? msg[0] : 0;
    }
    s->count++;
    return 0;
}

static size_t frame(uint8_t *dst, uint8_t fill, uint32_t len)
{
    mg_grpc_prefix(dst, len);
    memset(dst + 5, fill, len);
    return len + 5;
}

static void test_deframer_every_split(void)
{
    /* Three messages (0, 3 and 300 bytes) fed in every possible pair of pieces. */
    uint8_t buf[400];
    size_t n = 0;
    n += frame(buf + n, 0, 0);
    n += frame(buf + n, 0xaa, 3);
    n += frame(buf + n, 0xbb, 300);
    for (size_t cut = 0; cut <= n; cut++) {
        mg_deframer d;
        sink s = {0};
        mg_deframer_init(&d, 1024);
        CU_ASSERT_EQUAL(mg_deframer_feed(&d, buf, cut, collect, &s), 0);
        CU_ASSERT_EQUAL(mg_deframer_feed(&d, buf + cut, n - cut, collect, &s), 0);
        CU_ASSERT_EQUAL(s.count, 3);
        CU_ASSERT_EQUAL(s.lens[0], 0);
        CU_ASSERT_EQUAL(s.lens[1], 3);
        CU_ASSERT_EQUAL(s.first[1], 0xaa);
        CU_ASSERT_EQUAL(s.lens[2], 300);
        CU_ASSERT_EQUAL(s.first[2], 0xbb);
        CU_ASSERT_FALSE(mg_deframer_partial(&d));
        mg_deframer_free(&d);
    }
}

static void test_deframer_byte_at_a_time_and_partial(void)
{
    uint8_t buf[64];
    size_t n = frame(buf, 0x11, 40);
    mg_deframer d;
    sink s = {0};
    mg_deframer_init(&d, 64);
    for (size_t i = 0; i + 1 < n; i++) {
        CU_ASSERT_EQUAL(mg_deframer_feed(&d, buf + i, 1, collect, &s), 0);
        CU_ASSERT_TRUE(mg_deframer_partial(&d));
    }
    CU_ASSERT_EQUAL(s.count, 0);
    CU_ASSERT_EQUAL(mg_deframer_feed(&d, buf + n - 1, 1, collect, &s), 0);
    CU_ASSERT_EQUAL(s.count, 1);
    CU_ASSERT_FALSE(mg_deframer_partial(&d));
    mg_deframer_free(&d);
}

static void test_deframer_limits_and_flags(void)
{
    uint8_t big[5], comp[5] = {1, 0, 0, 0, 0}, bad[5] = {2, 0, 0, 0, 0};
    mg_deframer d;
    sink s = {0};
    mg_grpc_prefix(big, 65);
    mg_deframer_init(&d, 64);
    CU_ASSERT_EQUAL(mg_deframer_feed(&d, big, 5, collect, &s), MG_DEFRAME_TOO_LARGE);
    CU_ASSERT_EQUAL(d.declared, 65);
    mg_deframer_free(&d);
    mg_deframer_init(&d, 64);
    CU_ASSERT_EQUAL(mg_deframer_feed(&d, comp, 5, collect, &s), MG_DEFRAME_COMPRESSED);
    mg_deframer_free(&d);
    mg_deframer_init(&d, 64);
    CU_ASSERT_EQUAL(mg_deframer_feed(&d, bad, 5, collect, &s), MG_DEFRAME_BAD_FLAG);
    mg_deframer_free(&d);
    CU_ASSERT_EQUAL(s.count, 0);
}

static int stop_after_first(void *arg, const uint8_t *msg, size_t len)
{
    (*(int *)arg)++;
    return 7;
}

static void test_deframer_callback_stops_feeding(void)
{
    uint8_t buf[32];
    size_t n = frame(buf, 1, 2);
    int calls = 0;
    mg_deframer d;
    n += frame(buf + n, 2, 2);
    mg_deframer_init(&d, 64);
    CU_ASSERT_EQUAL(mg_deframer_feed(&d, buf, n, stop_after_first, &calls), 7);
    CU_ASSERT_EQUAL(calls, 1);
    mg_deframer_free(&d);
}

static void test_base64(void)
{
    const char *cases[][2] = {{"", ""},
                              {"f", "Zg=="},
                              {"fo", "Zm8="},
                              {"foo", "Zm9v"},
                              {"foob", "Zm9vYg=="},
                              {"fooba", "Zm9vYmE="},
                              {"foobar", "Zm9vYmFy"}};
    char enc[32];
    uint8_t dec[32];
    for (size_t i = 0; i < 7; i++) {
        mg_b64_encode(enc, (const uint8_t *)cases[i][0], strlen(cases[i][0]));
        CU_ASSERT_STRING_EQUAL(enc, cases[i][1]);
        CU_ASSERT_EQUAL(mg_b64_decode(dec, cases[i][1], strlen(cases[i][1])),
                        (long)strlen(cases[i][0]));
        CU_ASSERT_EQUAL(memcmp(dec, cases[i][0], strlen(cases[i][0])), 0);
    }
    /* Unpadded and URL-safe input are accepted; junk is not. */
    CU_ASSERT_EQUAL(mg_b64_decode(dec, "Zm9vYg", 6), 4);
    CU_ASSERT_EQUAL(mg_b64_decode(dec, "-_8", 3), 2);
    CU_ASSERT_EQUAL(dec[0], 0xfb);
    CU_ASSERT_EQUAL(mg_b64_decode(dec, "Zm9*", 4), -1);
    CU_ASSERT_EQUAL(mg_b64_decode(dec, "Z", 1), -1);
}

static void test_host_port(void)
{
    char host[16];
    int port = -1;
    CU_ASSERT_EQUAL(mg_split_host_port("10.0.0.2:7443", host, sizeof(host), &port), 0);
    CU_ASSERT_STRING_EQUAL(host, "10.0.0.2");
    CU_ASSERT_EQUAL(port, 7443);
    CU_ASSERT_EQUAL(mg_split_host_port("[::1]:0", host, sizeof(host), &port), 0);
    CU_ASSERT_STRING_EQUAL(host, "::1");
    CU_ASSERT_EQUAL(port, 0);
    CU_ASSERT_EQUAL(mg_split_host_port("[::]:7446", host, sizeof(host), &port), 0);
    CU_ASSERT_STRING_EQUAL(host, "::");
    CU_ASSERT_EQUAL(mg_split_host_port("host", host, sizeof(host), &port), -1);
    CU_ASSERT_EQUAL(mg_split_host_port("host:", host, sizeof(host), &port), -1);
    CU_ASSERT_EQUAL(mg_split_host_port(":80", host, sizeof(host), &port), -1);
    CU_ASSERT_EQUAL(mg_split_host_port("[]:80", host, sizeof(host), &port), -1);
    CU_ASSERT_EQUAL(mg_split_host_port("a:65536", host, sizeof(host), &port), -1);
    CU_ASSERT_EQUAL(mg_split_host_port("a:-1", host, sizeof(host), &port), -1);
    CU_ASSERT_EQUAL(mg_split_host_port("a:8x", host, sizeof(host), &port), -1);
    CU_ASSERT_EQUAL(mg_split_host_port("a-very-long-host-name:1", host, sizeof(host), &port), -1);
    CU_ASSERT_TRUE(mg_is_numeric_host_port("127.0.0.1:1"));
    CU_ASSERT_TRUE(mg_is_numeric_host_port("[fe80::1]:7443"));
    CU_ASSERT_FALSE(mg_is_numeric_host_port("peer.example:7443"));
    CU_ASSERT_FALSE(mg_is_numeric_host_port("127.0.0.1"));
    CU_ASSERT_FALSE(mg_is_numeric_host_port("999.0.0.1:80"));
    CU_ASSERT_TRUE(mg_is_host_port("node-b.moongate.svc:7443"));
    CU_ASSERT_TRUE(mg_is_host_port("localhost:1"));
    CU_ASSERT_TRUE(mg_is_host_port("node-b.:7443"));
    CU_ASSERT_TRUE(mg_is_host_port("[::1]:7443"));
    CU_ASSERT_FALSE(mg_is_host_port("node-b:0"));
    CU_ASSERT_FALSE(mg_is_host_port("-node:1"));
    CU_ASSERT_FALSE(mg_is_host_port("node-.b:1"));
    CU_ASSERT_FALSE(mg_is_host_port("a..b:1"));
    CU_ASSERT_FALSE(mg_is_host_port("a_b:1"));
    CU_ASSERT_FALSE(mg_is_host_port("a b:1"));
    CU_ASSERT_FALSE(mg_is_host_port(":1"));
    CU_ASSERT_FALSE(mg_is_host_port("[node]:1"));
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_engine_errors_map_to_grpc),
        MG_TEST(test_code_names_and_http),
        MG_TEST(test_pct_encode_spec_example),
        MG_TEST(test_pct_whitespace_round_trip),
        MG_TEST(test_pct_truncation_never_splits_an_escape),
        MG_TEST(test_pct_decode_malformed_passes_through),
        MG_TEST(test_timeout_parse),
        MG_TEST(test_timeout_format_never_shortens),
        MG_TEST(test_deframer_every_split),
        MG_TEST(test_deframer_byte_at_a_time_and_partial),
        MG_TEST(test_deframer_limits_and_flags),
        MG_TEST(test_deframer_callback_stops_feeding),
        MG_TEST(test_base64),
        MG_TEST(test_host_port),
    };
    return mg_test_run("grpc codec", cases, sizeof(cases) / sizeof(cases[0]));
}
