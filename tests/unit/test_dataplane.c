/*
 * Unit tests for the TCP data plane (moongate/dataplane.h) over loopback in one process: a
 * server on a real registry, real sockets, the client API. Bytes land and come back intact,
 * every refusal (token, tenant, remote accessibility, bounds, unknown target) is answered and
 * leaves the connection usable and the memory untouched, malformed streams are cut off, and
 * stop() returns with peers still connected. Remote-accessible leases are reached through the
 * lease table; a stop word ends a transfer to a peer that takes nothing.
 */
#include "mg_test.h"
#include "moongate/dataplane.h"
#include "moongate/procmem.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1024u * 1024u)

static char dir[64];
static mg_registry *reg;
static mg_dp_server *srv;
static uint64_t open_id, closed_id;
static uint8_t *open_mem, *closed_mem;
static mg_lease_table *leases;
static const uint8_t token_t[MG_DF_TOKEN_BYTES] = "token-of-tenant-t..............";
static const uint8_t token_o[MG_DF_TOKEN_BYTES] = "token-of-tenant-other..........";

static int auth(void *arg, const uint8_t token[MG_DF_TOKEN_BYTES], char *tenant)
{
    if (memcmp(token, token_t, MG_DF_TOKEN_BYTES) == 0)
        snprintf(tenant, MG_SEG_NAME_MAX + 1, "t");
    else if (memcmp(token, token_o, MG_DF_TOKEN_BYTES) == 0)
        snprintf(tenant, MG_SEG_NAME_MAX + 1, "other");
    else
        return MG_ERR_AUTH;
    return 0;
}

static uint64_t add_segment(const char *name, int remote, uint64_t size, uint8_t **mem)
{
    mg_segment_spec spec = {.tenant = "t",
                            .name = name,
                            .source = MG_SEG_ANON,
                            .size = size,
                            .remote_accessible = remote};
    mg_segment *seg;
    mg_segment_info info;
    char err[MG_SEG_ERROR_MAX];
    CU_ASSERT_EQUAL_FATAL(mg_registry_reserve(reg, &spec, &seg, err), 0);
    mg_registry_commit(reg, seg, mg_segment_map(seg));
    mg_segment_get_info(reg, seg, &info);
    *mem = mg_segment_addr(seg);
    return info.id;
}

static void start(unsigned max_conns)
{
    mg_registry_config rc = {
        .shm_dir = dir, .file_mode = 0600, .max_segments = 8, .tcp_targets = 1};
    mg_dp_server_config sc = {.host = "127.0.0.1",
                              .leases = leases,
                              .max_slice = 4 * MiB,
                              .max_conns = max_conns,
                              .io_timeout_ms = 2000,
                              .auth = auth};
    char err[256];
    snprintf(dir, sizeof(dir), "/tmp/mgdp-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    CU_ASSERT_EQUAL_FATAL(mg_registry_new(&reg, &rc), 0);
    open_id = add_segment("open", 1, 16 * MiB + 4096, &open_mem);
    closed_id = add_segment("closed", 0, 1 * MiB, &closed_mem);
    sc.registry = reg;
    CU_ASSERT_EQUAL_FATAL(mg_dp_server_start(&srv, &sc, err, sizeof(err)), 0);
}

static void stop(void)
{
    mg_dp_server_stop(srv);
    mg_registry_del(reg);
    rmdir(dir);
}

static mg_dp_conn *dial(const uint8_t *token)
{
    mg_dp_conn *c = NULL;
    char err[256];
    CU_ASSERT_EQUAL(mg_dp_connect(&c, "127.0.0.1", mg_dp_server_port(srv), token, 5000, NULL, NULL,
                                  err, sizeof(err)),
                    0);
    return c;
}

static void test_bytes_land_and_come_back(void)
{
    uint64_t len = 10 * MiB + 123;
    uint8_t *src = malloc(len), *back = calloc(1, len);
    mg_dp_options big = {.slice_bytes = 1 * MiB, .window = 4, .crc = 1};
    mg_dp_options small = {.slice_bytes = 4096, .window = 64};
    mg_dp_server_stats st;
    mg_dp_conn *c;
    char err[256];
    start(8);
    for (uint64_t i = 0; i < len; i++)
        src[i] = (uint8_t)(i * 2654435761u >> 13);
    c = dial(token_t);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT_EQUAL(mg_dp_write(c, open_id, 7, src, len, &big, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(memcmp(open_mem + 7, src, len), 0); /* in the segment itself */
    CU_ASSERT_EQUAL(mg_dp_read(c, open_id, 7, back, len, &big, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(memcmp(back, src, len), 0);
    memset(back, 0, len);
    CU_ASSERT_EQUAL(mg_dp_read(c, open_id, 7, back, 1 * MiB + 5, &small, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(memcmp(back, src, 1 * MiB + 5), 0); /* 257 slices, many in flight */
    /* A corrupted slice (the server's test switch) fails its transfer DATA_LOSS, both ways;
     * the stream stays in step (the connection is used after). */
    mg_dp_server_corrupt(srv, 1);
    CU_ASSERT_EQUAL(mg_dp_write(c, open_id, 7, src, 3 * MiB, &big, err, sizeof(err)),
                    MG_ERR_DATA_LOSS);
    mg_dp_server_corrupt(srv, 1);
    CU_ASSERT_EQUAL(mg_dp_read(c, open_id, 7, back, 3 * MiB, &big, err, sizeof(err)),
                    MG_ERR_DATA_LOSS);
    CU_ASSERT_EQUAL(mg_dp_write(c, open_id, 7, src, len, &big, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(memcmp(open_mem + 7, src, len), 0);
    CU_ASSERT_EQUAL(mg_dp_write(c, open_id, 16 * MiB + 4095, "z", 1, NULL, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(open_mem[16 * MiB + 4095], 'z'); /* the last byte */
    mg_dp_server_get_stats(srv, &st);
    CU_ASSERT_EQUAL(st.slices_in, 11 + 2 + 11 + 1); /* the corrupted one refused */
    CU_ASSERT_EQUAL(st.slices_refused, 1);
    CU_ASSERT_EQUAL(st.bytes_in, 2 * len + 2 * MiB + 1);
    CU_ASSERT_EQUAL(st.slices_out, 11 + 257 + 3);
    mg_dp_close(c);
    free(src);
    free(back);
    stop();
}

/* Idle connections kept for the next transfer to a peer: at most `max`, the last given back
 * taken first, the rest closed; a taken connection still moves bytes. */
static void test_idle_pool(void)
{
    mg_dp_pool pool;
    mg_dp_conn *c[3], *t;
    mg_dp_server_stats st;
    char err[256];
    start(8);
    mg_dp_pool_init(&pool, 2);
    for (int i = 0; i < 3; i++)
        CU_ASSERT_PTR_NOT_NULL_FATAL(c[i] = dial(token_t));
    CU_ASSERT_PTR_NULL(mg_dp_pool_take(&pool));
    for (int i = 0; i < 3; i++)
        mg_dp_pool_give(&pool, c[i]); /* the third is one too many: closed */
    mg_dp_pool_give(&pool, NULL);
    CU_ASSERT_EQUAL(mg_dp_pool_idle(&pool), 2);
    t = mg_dp_pool_take(&pool);
    CU_ASSERT_PTR_EQUAL(t, c[1]);
    CU_ASSERT_EQUAL(mg_dp_write(t, open_id, 0, "pooled", 6, NULL, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(memcmp(open_mem, "pooled", 6), 0);
    mg_dp_pool_give(&pool, t);
    mg_dp_pool_clear(&pool);
    CU_ASSERT_EQUAL(mg_dp_pool_idle(&pool), 0);
    for (int i = 0; i < 1500; i++) { /* the server sees every connection close (30 s at most) */
        mg_dp_server_get_stats(srv, &st);
        if (st.conns_active == 0)
            break;
        usleep(20000);
    }
    CU_ASSERT_EQUAL(st.conns_active, 0);
    mg_dp_pool_free(&pool);
    stop();
}

static void test_refusals_keep_the_stream(void)
{
    uint8_t data[8192], before[8192];
    mg_dp_conn *c, *o;
    char err[256];
    start(8);
    memset(data, 'x', sizeof(data));
    memcpy(before, closed_mem, sizeof(before));
    c = dial(token_t);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT_EQUAL(mg_dp_write(c, closed_id, 0, data, sizeof(data), NULL, err, sizeof(err)),
                    MG_ERR_PERMISSION);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "refused slice 0"));
    CU_ASSERT_EQUAL(memcmp(closed_mem, before, sizeof(before)), 0); /* nothing written */
    CU_ASSERT_EQUAL(mg_dp_write(c, open_id, 16 * MiB, data, 4097, NULL, err, sizeof(err)),
                    MG_ERR_RANGE); /* one byte past the end */
    CU_ASSERT_EQUAL(open_mem[16 * MiB], 0);
    CU_ASSERT_EQUAL(mg_dp_read(c, open_id, UINT64_MAX - 10, data, 100, NULL, err, sizeof(err)),
                    MG_ERR_RANGE); /* wraps: refused before sending */
    CU_ASSERT_EQUAL(mg_dp_write(c, 12345, 0, data, 10, NULL, err, sizeof(err)), MG_ERR_NOT_FOUND);
    /* A multi-slice write whose middle slices fall outside: the first lands, the answer names
     * the first refused slice. */
    {
        mg_dp_options o4 = {.slice_bytes = 4096, .window = 8};
        CU_ASSERT_EQUAL(mg_dp_write(c, open_id, 16 * MiB, data, 8192, &o4, err, sizeof(err)),
                        MG_ERR_RANGE);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "refused slice 1"));
        CU_ASSERT_EQUAL(open_mem[16 * MiB], 'x');
    }
    /* The same connection still works. */
    CU_ASSERT_EQUAL(mg_dp_write(c, open_id, 0, "ok", 2, NULL, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(memcmp(open_mem, "ok", 2), 0);
    /* Another tenant's token does not reach t's segments. */
    o = dial(token_o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    CU_ASSERT_EQUAL(mg_dp_write(o, open_id, 0, "no", 2, NULL, err, sizeof(err)), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(memcmp(open_mem, "ok", 2), 0);
    mg_dp_close(o);
    mg_dp_close(c);
    stop();
}

/* A raw connection sending `bytes`; returns the frame type the server answered (0: none). */
static int raw_exchange(const void *bytes, size_t len)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(mg_dp_server_port(srv))};
    uint8_t head[MG_DF_HEADER_BYTES];
    int fd = socket(AF_INET, SOCK_STREAM, 0), type = 0;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        send(fd, bytes, len, MSG_NOSIGNAL) == (ssize_t)len &&
        recv(fd, head, sizeof(head), MSG_WAITALL) == (ssize_t)sizeof(head))
        type = head[5];
    close(fd);
    return type;
}

static void test_auth_and_malformed_streams(void)
{
    static const uint8_t bad[MG_DF_TOKEN_BYTES] = "not a token";
    mg_dp_conn *c = NULL;
    mg_df_header h = {0};
    uint8_t frame[MG_DF_HEADER_BYTES + MG_DF_TOKEN_BYTES];
    char err[256];
    start(8);
    CU_ASSERT_EQUAL(mg_dp_connect(&c, "127.0.0.1", mg_dp_server_port(srv), bad, 5000, NULL, NULL,
                                  err, sizeof(err)),
                    MG_ERR_AUTH);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "session token refused"));
    CU_ASSERT_EQUAL(
        raw_exchange("GET / HTTP/1.1\r\n\r\n........................................", 56),
        MG_DF_ERROR); /* not our protocol */
    h.type = MG_DF_HELLO;
    h.length = MG_DF_TOKEN_BYTES;
    mg_df_encode(&h, frame);
    memcpy(frame + MG_DF_HEADER_BYTES, token_t, MG_DF_TOKEN_BYTES);
    frame[4] = 2; /* a peer of another version */
    CU_ASSERT_EQUAL(raw_exchange(frame, sizeof(frame)), MG_DF_ERROR);
    h.type = MG_DF_WRITE; /* data before HELLO */
    h.length = 1;
    h.target = open_id;
    mg_df_encode(&h, frame);
    CU_ASSERT_EQUAL(raw_exchange(frame, MG_DF_HEADER_BYTES + 1), MG_DF_ERROR);
    /* The daemon serves on. */
    c = dial(token_t);
    CU_ASSERT_PTR_NOT_NULL(c);
    CU_ASSERT_EQUAL(mg_dp_write(c, open_id, 0, "fine", 4, NULL, err, sizeof(err)), 0);
    mg_dp_close(c);
    stop();
}

static void test_limits_unreachable_and_stop(void)
{
    mg_dp_conn *c, *d = NULL;
    char err[256];
    int port;
    start(1);
    c = dial(token_t);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    /* max_conns 1: a second connection is closed at once. */
    CU_ASSERT_NOT_EQUAL(mg_dp_connect(&d, "127.0.0.1", mg_dp_server_port(srv), token_t, 2000, NULL,
                                      NULL, err, sizeof(err)),
                        0);
    port = mg_dp_server_port(srv);
    stop(); /* returns although c is connected and idle */
    CU_ASSERT_EQUAL(mg_dp_write(c, open_id, 0, "x", 1, NULL, err, sizeof(err)), MG_ERR_UNAVAILABLE);
    mg_dp_close(c);
    CU_ASSERT_EQUAL(
        mg_dp_connect(&d, "127.0.0.1", port, token_t, 2000, NULL, NULL, err, sizeof(err)),
        MG_ERR_UNAVAILABLE);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "127.0.0.1"));
}

/* A remote-accessible lease: bounded by its length, only its tenant's, and withdrawn while a
 * slice uses it, it is collectable once that slice ends. */
static void test_leases_as_targets(void)
{
    static uint8_t area[64 * 1024];
    uint8_t data[8192], back[8192];
    mg_dp_options lo = {.lease = 1};
    mg_lease_slot *slot;
    uint8_t *addr;
    void *handles[4];
    mg_dp_conn *c, *o;
    char err[256];
    int h1, h2;
    CU_ASSERT_EQUAL_FATAL(mg_lease_table_new(&leases), 0);
    start(8);
    memset(area, 0, sizeof(area));
    memset(data, 'L', sizeof(data));
    CU_ASSERT_EQUAL(mg_lease_table_put(leases, 77, "t", area + 4096, 10000, &h1), 0);
    CU_ASSERT_EQUAL(mg_lease_table_put(leases, 77, "t", area, 1, &h2), MG_ERR_EXISTS);
    c = dial(token_t);
    o = dial(token_o);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    CU_ASSERT_EQUAL(mg_dp_write(c, 77, 1808, data, 8192, &lo, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(memcmp(area + 4096 + 1808, data, 8192), 0); /* its last byte: 9999 */
    CU_ASSERT_EQUAL(mg_dp_read(c, 77, 1808, back, 8192, &lo, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(memcmp(back, data, 8192), 0);
    CU_ASSERT_EQUAL(mg_dp_write(c, 77, 1809, data, 8192, &lo, err, sizeof(err)), MG_ERR_RANGE);
    CU_ASSERT_EQUAL(area[4096 + 10000], 0); /* nothing past the lease */
    CU_ASSERT_EQUAL(mg_dp_write(o, 77, 0, data, 10, &lo, err, sizeof(err)), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_dp_write(c, 78, 0, data, 10, &lo, err, sizeof(err)), MG_ERR_NOT_FOUND);
    /* A lease id is not a segment id, nor the other way round. */
    CU_ASSERT_EQUAL(mg_dp_write(c, open_id, 0, data, 10, &lo, err, sizeof(err)), MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_dp_write(c, 77, 0, data, 10, NULL, err, sizeof(err)), MG_ERR_NOT_FOUND);

    /* Withdrawn while a slice uses it: the handle comes back only after the slice ends. */
    CU_ASSERT_EQUAL(mg_lease_table_begin(leases, 77, "t", 0, 1, &addr, &slot), 0);
    CU_ASSERT_PTR_NULL(mg_lease_table_withdraw(leases, 77));
    CU_ASSERT_EQUAL(mg_lease_table_collect(leases, handles, 4), 0);
    CU_ASSERT_EQUAL(mg_dp_write(c, 77, 0, data, 10, &lo, err, sizeof(err)), MG_ERR_NOT_FOUND);
    mg_lease_table_end(leases, slot);
    CU_ASSERT_EQUAL(mg_lease_table_collect(leases, handles, 4), 1);
    CU_ASSERT_PTR_EQUAL(handles[0], &h1);
    CU_ASSERT_EQUAL(mg_lease_table_collect(leases, handles, 4), 0);
    /* Withdrawn while unused: the handle comes back at once. */
    CU_ASSERT_EQUAL(mg_lease_table_put(leases, 79, "t", area, 100, &h2), 0);
    CU_ASSERT_PTR_EQUAL(mg_lease_table_withdraw(leases, 79), &h2);
    CU_ASSERT_PTR_NULL(mg_lease_table_withdraw(leases, 79));
    mg_dp_close(c);
    mg_dp_close(o);
    stop();
    mg_lease_table_del(leases);
    leases = NULL;
}

/* Several transfers as one stream: mixed WRITEs and READs, one refused in the middle; the others
 * land, the refused one fails alone, and the connection stays in step. */
static void test_run_many_on_one_stream(void)
{
    enum { N = 40 };
    static uint8_t src[N][8192], back[N][8192];
    mg_dp_op ops[N];
    char errs[N][256];
    mg_dp_options o = {.slice_bytes = 4096, .window = 8};
    mg_dp_conn *c;
    char err[256];
    start(8);
    c = dial(token_t);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    for (int i = 0; i < N; i++) {
        memset(src[i], 'a' + i % 26, sizeof(src[i]));
        ops[i] = (mg_dp_op){.write = 1,
                            .target = open_id,
                            .offset = (uint64_t)i * 8192,
                            .buf = src[i],
                            .len = 8192 - (uint64_t)i, /* unaligned tails */
                            .err = errs[i],
                            .errcap = sizeof(errs[i])};
    }
    ops[17].target = closed_id; /* not remote-accessible: this one alone fails */
    CU_ASSERT_EQUAL(mg_dp_run(c, ops, N, &o), 0);
    for (int i = 0; i < N; i++) {
        if (i == 17) {
            CU_ASSERT_EQUAL(ops[i].rc, MG_ERR_PERMISSION);
            CU_ASSERT_EQUAL(ops[i].done, 0);
            continue;
        }
        CU_ASSERT_EQUAL(ops[i].rc, 0);
        CU_ASSERT_EQUAL(ops[i].done, ops[i].len);
        CU_ASSERT_EQUAL(memcmp(open_mem + i * 8192, src[i], ops[i].len), 0);
    }
    for (int i = 0; i < N; i++) { /* and back, as READs */
        ops[i].write = 0;
        ops[i].target = open_id;
        ops[i].buf = back[i];
    }
    CU_ASSERT_EQUAL(mg_dp_run(c, ops, N, &o), 0);
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(ops[i].rc, 0);
        if (i != 17)
            CU_ASSERT_EQUAL(memcmp(back[i], src[i], ops[i].len), 0);
    }
    /* WRITEs and READs taking turns in one run: the acks the server holds back go before each
     * READ's answer, in order; a refused WRITE among them answers in its place. */
    for (int i = 0; i < N; i++) {
        ops[i].write = i % 2 == 0;
        ops[i].target = i == 20 ? closed_id : open_id;
        ops[i].offset = (uint64_t)(i / 2) * 8192; /* READ i+1 reads what WRITE i wrote */
        ops[i].buf = ops[i].write ? src[N - 1 - i] : back[i];
        ops[i].len = 8192 - (uint64_t)(i / 2);
    }
    CU_ASSERT_EQUAL(mg_dp_run(c, ops, N, &o), 0);
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(ops[i].rc, i == 20 ? MG_ERR_PERMISSION : 0);
        if (i % 2 == 1 && i != 21)
            CU_ASSERT_EQUAL(memcmp(back[i], src[N - i], ops[i].len), 0);
    }
    /* The stream is in step: a plain call after it works. */
    CU_ASSERT_EQUAL(mg_dp_write(c, open_id, 0, "ok", 2, NULL, err, sizeof(err)), 0);
    mg_dp_close(c);
    stop();
}

/* A server, a connection to it as tenant t, and src (n bytes) filled with a pattern. */
static mg_dp_conn *start_filled(uint8_t *src, size_t n)
{
    start(8);
    for (size_t i = 0; i < n; i++)
        src[i] = (uint8_t)(i * 2654435761u >> 13);
    return dial(token_t);
}

/* A WRITE of len bytes at src to offset off of target. */
static mg_dp_op write_op(uint64_t target, uint64_t off, uint8_t *src, uint64_t len, char *err,
                         size_t errcap)
{
    return (mg_dp_op){.write = 1,
                      .target = target,
                      .offset = off,
                      .buf = src,
                      .len = len,
                      .err = err,
                      .errcap = errcap};
}

/* Small and large slices mixed on one stream: the server reads ahead after small ones (a large
 * payload then arrives partly in its read-ahead, the rest straight into place) and reads
 * exactly after large ones; the client sends small ones with MSG_MORE. Every byte lands. */
static void test_mixed_sizes_on_one_stream(void)
{
    static const uint64_t len[] = {100,   4096, 200000, 3,      1 * MiB + 7, 70000, 65535,
                                   65536, 1,    4096,   300000, 17,          8192,  5 * MiB};
    enum { N = sizeof(len) / sizeof(len[0]) };
    static uint8_t src[16 * MiB], back[16 * MiB];
    mg_dp_op ops[N];
    char errs[N][256];
    mg_dp_options o = {.slice_bytes = 256 * 1024, .window = 32};
    uint64_t off = 0;
    mg_dp_conn *c;
    c = start_filled(src, sizeof(src));
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    for (int i = 0; i < N; i++) {
        ops[i] = write_op(open_id, off, src + off, len[i], errs[i], sizeof(errs[i]));
        off += len[i];
    }
    CU_ASSERT_FATAL(off <= 16 * MiB);
    for (int round = 0; round < 2; round++) { /* WRITEs, then READs of the same ranges */
        CU_ASSERT_EQUAL(mg_dp_run(c, ops, N, &o), 0);
        for (int i = 0; i < N; i++) {
            CU_ASSERT_EQUAL(ops[i].rc, 0);
            CU_ASSERT_EQUAL(ops[i].done, len[i]);
            ops[i].write = 0;
            ops[i].buf = back + ops[i].offset;
        }
    }
    CU_ASSERT_EQUAL(memcmp(open_mem, src, off), 0);
    CU_ASSERT_EQUAL(memcmp(back, src, off), 0);
    mg_dp_close(c);
    stop();
}

/* Checksummed slices are copied side by side into a stage and go several to a sendmsg: the
 * client's WRITE payloads, and the server's READ answers. Every slice lands under its own sum
 * (one staged over another's place would fail its CRC), a corrupted one among them fails its
 * op alone, and the stream stays in step for the next run. */
static void test_checksummed_slices_share_sends(void)
{
    static const uint64_t len[] = {100, 4096,  200000, 3,      1 * MiB + 7, 70000,
                                   1,   65536, 65535,  300000, 17,          4 * MiB};
    enum { N = sizeof(len) / sizeof(len[0]) };
    static uint8_t src[8 * MiB], back[8 * MiB];
    mg_dp_op ops[N];
    char errs[N][256];
    mg_dp_options o = {.slice_bytes = 64 * 1024, .window = 64, .crc = 1};
    mg_dp_server_stats st;
    uint64_t off = 0;
    mg_dp_conn *c = start_filled(src, sizeof(src));
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    for (int i = 0; i < N; i++) {
        ops[i] = write_op(open_id, off, src + off, len[i], errs[i], sizeof(errs[i]));
        off += len[i];
    }
    CU_ASSERT_FATAL(off <= sizeof(src));
    /* WRITEs three times (the second with op 0's slice corrupted on landing), then READs of
     * the same ranges three times (the second with op 0's answer corrupted). */
    for (int round = 0; round < 6; round++) {
        int write = round < 3;
        memset(write ? open_mem : back, 0, off);
        if (round % 3 == 1)
            mg_dp_server_corrupt(srv, 1); /* the first checksummed slice: op 0's */
        for (int i = 0; i < N; i++) {
            ops[i].write = write;
            ops[i].buf = (write ? src : back) + ops[i].offset;
        }
        CU_ASSERT_EQUAL(mg_dp_run(c, ops, N, &o), 0);
        for (int i = 0; i < N; i++) {
            int hit = round % 3 == 1 && i == 0;
            const uint8_t *got = (write ? open_mem : back) + ops[i].offset;
            CU_ASSERT_EQUAL(ops[i].rc, hit ? MG_ERR_DATA_LOSS : 0);
            CU_ASSERT_EQUAL(ops[i].done, hit ? 0 : len[i]);
            if (!hit)
                CU_ASSERT_EQUAL(memcmp(got, src + ops[i].offset, len[i]), 0);
        }
    }
    mg_dp_server_get_stats(srv, &st);
    CU_ASSERT_EQUAL(st.slices_refused,
                    1); /* the WRITE's: a READ's bad sum is found by the client */
    mg_dp_close(c);
    stop();
}

/* A window far wider than one send: the client sends up to 64 frames a sendmsg (partly taken
 * when the socket fills) and reads many answers a recv; the server holds WRITE acks and READ
 * data back and sends them together. Refusals among them answer in their places; every byte
 * lands and comes back. */
static void test_wide_window_many_frames(void)
{
    static const uint64_t sizes[] = {1, 100, 4095, 4096, 4097, 30000, 70000, 2};
    enum { N = 600, NS = sizeof(sizes) / sizeof(sizes[0]) };
    static uint8_t src[16 * MiB], back[16 * MiB];
    static mg_dp_op ops[N];
    static char errs[N][128];
    mg_dp_options o = {.slice_bytes = 16384, .window = 256};
    uint64_t off = 0;
    mg_dp_conn *c;
    c = start_filled(src, sizeof(src));
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    for (int i = 0; i < N; i++) {
        ops[i] = write_op(i % 97 == 50 ? closed_id : open_id, off, src + off, sizes[i % NS],
                          errs[i], sizeof(errs[i]));
        off += sizes[i % NS];
    }
    CU_ASSERT_FATAL(off <= 16 * MiB);
    for (int round = 0; round < 2; round++) { /* WRITEs, then READs of the same ranges */
        CU_ASSERT_EQUAL(mg_dp_run(c, ops, N, &o), 0);
        for (int i = 0; i < N; i++) {
            int refused = ops[i].target == closed_id;
            CU_ASSERT_EQUAL(ops[i].rc, refused ? MG_ERR_PERMISSION : 0);
            CU_ASSERT_EQUAL(ops[i].done, refused ? 0 : ops[i].len);
            if (round == 1 && !refused)
                CU_ASSERT_EQUAL(memcmp(back + ops[i].offset, src + ops[i].offset, ops[i].len), 0);
            ops[i].write = 0;
            ops[i].buf = back + ops[i].offset;
        }
    }
    for (int i = 0; i < N; i++) {
        if (ops[i].target == open_id)
            CU_ASSERT_EQUAL(memcmp(open_mem + ops[i].offset, src + ops[i].offset, ops[i].len), 0);
    }
    mg_dp_close(c);
    stop();
}

/* A connection keeps its reference to the segment its slices go to while they come one after
 * another (no registry lock for each): slices alternating between two segments, WRITE and READ,
 * land and come back; one past the end of the held segment is refused; and once the client has
 * its acks the segment is let go, so it can be unregistered while the connection stays open,
 * and the next slice to it is refused, not written through a stale reference. */
static void test_held_segments(void)
{
    enum { N = 64, BLOCK = 4096 };
    static uint8_t src[N * BLOCK], back[N * BLOCK];
    mg_dp_op ops[N];
    char errs[N][128], err[MG_SEG_ERROR_MAX];
    mg_dp_options o = {.slice_bytes = BLOCK, .window = 16};
    mg_segment_info info;
    mg_segment *gone;
    uint8_t *other_mem;
    uint64_t other_id;
    mg_dp_conn *c = start_filled(src, sizeof(src));
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    other_id = add_segment("other", 1, N * BLOCK, &other_mem);
    for (int i = 0; i < N; i++) /* runs of one, two and three slices to each in turn */
        ops[i] = write_op((i % 6) < 2 || (i % 6) == 5 ? open_id : other_id, (uint64_t)i * BLOCK,
                          src + i * BLOCK, BLOCK, errs[i], sizeof(errs[i]));
    for (int round = 0; round < 2; round++) { /* WRITEs, then READs of the same ranges */
        CU_ASSERT_EQUAL(mg_dp_run(c, ops, N, &o), 0);
        for (int i = 0; i < N; i++) {
            CU_ASSERT_EQUAL(ops[i].rc, 0);
            CU_ASSERT_EQUAL(ops[i].done, BLOCK);
            ops[i].write = 0;
            ops[i].buf = back + i * BLOCK;
        }
    }
    for (int i = 0; i < N; i++) {
        uint8_t *mem = ops[i].target == open_id ? open_mem : other_mem;
        CU_ASSERT_EQUAL(memcmp(mem + i * BLOCK, src + i * BLOCK, BLOCK), 0);
        CU_ASSERT_EQUAL(memcmp(back + i * BLOCK, src + i * BLOCK, BLOCK), 0);
    }
    /* Two slices to the held segment, the second past its end. */
    CU_ASSERT_EQUAL(mg_dp_write(c, other_id, (N - 1) * BLOCK, src, 2 * BLOCK, &o, err, sizeof(err)),
                    MG_ERR_RANGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "refused slice 1"));
    /* The acks are in: nothing holds the segment. */
    CU_ASSERT_EQUAL(mg_dp_write(c, other_id, 0, src, 3 * BLOCK, &o, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(mg_registry_find(reg, "t", other_id, &info), 0);
    CU_ASSERT_EQUAL(info.refs, 0);
    CU_ASSERT_EQUAL(mg_registry_unregister(reg, "t", other_id, &gone, err), 0);
    CU_ASSERT_EQUAL(mg_dp_write(c, other_id, 0, src, BLOCK, &o, err, sizeof(err)),
                    MG_ERR_NOT_FOUND);
    mg_registry_restore(reg, gone);
    CU_ASSERT_EQUAL(mg_dp_write(c, other_id, 0, "ok", 2, &o, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(memcmp(other_mem, "ok", 2), 0);
    mg_dp_close(c);
    stop();
}

/* A child process's buffer, registered remote-accessible as process memory (MG_SEG_PROCESS) by
 * (pid, address): its id. The child answers 'y' or 'n' to each byte on *ask: whether its
 * buffer holds want[0, size - 7) at offset 7. */
static uint64_t add_child_memory(pid_t *pid, int *ask, int *answer, const uint8_t *want,
                                 uint64_t size)
{
    int up[2], down[2];
    uint64_t addr = 0;
    mg_segment_spec spec = {.tenant = "t",
                            .name = "child",
                            .source = MG_SEG_PROCESS,
                            .size = size,
                            .caller_uid_known = 1,
                            .caller_uid = (uint32_t)getuid(),
                            .remote_accessible = 1};
    mg_segment *seg;
    mg_segment_info info;
    char err[MG_SEG_ERROR_MAX], q;
    CU_ASSERT_FATAL(pipe(up) == 0 && pipe(down) == 0);
    *pid = fork();
    CU_ASSERT_FATAL(*pid >= 0);
    if (*pid == 0) {
        uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        uint64_t a = (uint64_t)(uintptr_t)m;
        if (m == MAP_FAILED || write(up[1], &a, sizeof(a)) != (ssize_t)sizeof(a))
            _exit(2);
        while (read(down[0], &q, 1) == 1) {
            char r = memcmp(m + 7, want, size - 7) == 0 ? 'y' : 'n';
            if (write(up[1], &r, 1) != 1)
                _exit(3);
        }
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    *ask = down[1];
    *answer = up[0];
    CU_ASSERT_FATAL(read(*answer, &addr, sizeof(addr)) == (ssize_t)sizeof(addr));
    spec.client_addr = addr;
    spec.client = (mg_proc){*pid, mg_proc_start_time(*pid)};
    CU_ASSERT_EQUAL_FATAL(mg_registry_reserve(reg, &spec, &seg, err), 0);
    mg_registry_commit(reg, seg, mg_segment_map(seg));
    mg_segment_get_info(reg, seg, &info);
    CU_ASSERT_EQUAL_FATAL(info.state, MG_SEG_READY);
    return info.id;
}

/* Whether the child's buffer holds what it was given to compare. */
static int child_has(int ask, int answer)
{
    char r = 0;
    CU_ASSERT_FATAL(write(ask, "?", 1) == 1 && read(answer, &r, 1) == 1);
    return r == 'y';
}

/* A process's memory as a peer's target: not mapped here, its slices land with
 * process_vm_writev (from a bounce) and go with process_vm_readv (through the stage). WRITEs,
 * plain and checksummed, land in the child's own buffer; READs, large and small, give them
 * back; a corrupted checksummed slice is refused; slices to it and to a mapped segment mix on
 * one stream. Once the child is killed, its slices fail FAILED_PRECONDITION naming the exit,
 * and the stream goes on: a slice to another segment lands after them. */
static void test_process_memory_as_a_target(void)
{
    enum { SIZE = 6 * MiB };
    static uint8_t src[SIZE], back[SIZE];
    mg_dp_options big = {.slice_bytes = 1 * MiB, .window = 4};
    mg_dp_options small = {.slice_bytes = 4096, .window = 64};
    mg_dp_options summed = {.slice_bytes = 512 * 1024, .window = 8, .crc = 1};
    mg_dp_op ops[3];
    char err[256], errs[3][256];
    int ask, answer, st = 0;
    pid_t pid;
    uint64_t id;
    mg_dp_conn *c = start_filled(src, sizeof(src));
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    id = add_child_memory(&pid, &ask, &answer, src, SIZE);
    CU_ASSERT_EQUAL(mg_dp_write(c, id, 7, src, SIZE - 7, &big, err, sizeof(err)), 0);
    CU_ASSERT(child_has(ask, answer)); /* in the child's memory itself */
    CU_ASSERT_EQUAL(mg_dp_read(c, id, 7, back, SIZE - 7, &big, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(memcmp(back, src, SIZE - 7), 0);
    memset(back, 0, SIZE);
    CU_ASSERT_EQUAL(mg_dp_read(c, id, 7, back, 1 * MiB + 5, &small, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(memcmp(back, src, 1 * MiB + 5), 0); /* 257 slices, many in flight */
    memset(back, 0, SIZE);
    CU_ASSERT_EQUAL(mg_dp_read(c, id, 7, back, SIZE - 7, &summed, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(memcmp(back, src, SIZE - 7), 0);
    /* checksummed WRITEs: a zeroed range, then the bytes again; one corrupted slice refused */
    memset(back, 0, SIZE);
    CU_ASSERT_EQUAL(mg_dp_write(c, id, 7, back, 2 * MiB, &summed, err, sizeof(err)), 0);
    CU_ASSERT_FALSE(child_has(ask, answer));
    mg_dp_server_corrupt(srv, 1);
    CU_ASSERT_EQUAL(mg_dp_write(c, id, 7, src, 2 * MiB, &summed, err, sizeof(err)),
                    MG_ERR_DATA_LOSS);
    CU_ASSERT_EQUAL(mg_dp_write(c, id, 7, src, 2 * MiB, &summed, err, sizeof(err)), 0);
    CU_ASSERT(child_has(ask, answer));
    /* one run: a WRITE to the child, one to a mapped segment, a READ from the child */
    ops[0] = write_op(id, 7, src, 1 * MiB, errs[0], sizeof(errs[0]));
    ops[1] = write_op(open_id, 0, src, 3 * MiB, errs[1], sizeof(errs[1]));
    ops[2] = write_op(id, 7 + 1 * MiB, back, 2 * MiB, errs[2], sizeof(errs[2]));
    ops[2].write = 0;
    CU_ASSERT_EQUAL(mg_dp_run(c, ops, 3, &big), 0);
    CU_ASSERT(ops[0].rc == 0 && ops[1].rc == 0 && ops[2].rc == 0);
    CU_ASSERT_EQUAL(memcmp(back, src + 1 * MiB, 2 * MiB), 0);
    CU_ASSERT_EQUAL(memcmp(open_mem, src, 3 * MiB), 0);
    /* the process exits: its slices fail by name, the stream stays in step */
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    close(ask);
    close(answer);
    CU_ASSERT_EQUAL(mg_dp_write(c, id, 0, src, 3 * MiB, &big, err, sizeof(err)), MG_ERR_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "exited"));
    CU_ASSERT_EQUAL(mg_dp_read(c, id, 0, back, 3 * MiB, &summed, err, sizeof(err)), MG_ERR_STATE);
    CU_ASSERT_EQUAL(mg_dp_write(c, open_id, 0, "ok", 2, &big, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(memcmp(open_mem, "ok", 2), 0);
    mg_dp_close(c);
    stop();
}

/* Local memory reached through an access (mg_dp_access) rather than mapped: a buffer with a
 * byte past which get and put fail, as process_vm does for a process that exited. */
typedef struct {
    uint8_t *mem;
    uint64_t fail_at; /* the first offset get and put refuse */
    unsigned calls;
    uint64_t ahead_off; /* the slice said next (ahead), and how long */
    size_t ahead_n;
    unsigned foretold; /* gets of exactly the slice said next */
} fake_proc;

static int fake_get(void *ctx, uint64_t off, void *dst, size_t n, char *why, size_t cap)
{
    fake_proc *f = ctx;
    f->calls++;
    f->foretold += off == f->ahead_off && n == f->ahead_n;
    if (off + n > f->fail_at) {
        snprintf(why, cap, "process 4242 exited");
        return MG_ERR_STATE;
    }
    memcpy(dst, f->mem + off, n);
    return 0;
}

static void fake_ahead(void *ctx, uint64_t off, size_t n)
{
    fake_proc *f = ctx;
    f->ahead_off = off;
    f->ahead_n = n;
}

static int fake_put(void *ctx, uint64_t off, const void *src, size_t n, char *why, size_t cap)
{
    fake_proc *f = ctx;
    f->calls++;
    if (off + n > f->fail_at) {
        snprintf(why, cap, "process 4242 exited");
        return MG_ERR_STATE;
    }
    memcpy(f->mem + off, src, n);
    return 0;
}

/* A run whose local sides are reached by get and put: WRITEs staged from it and READs put into
 * it, plain and checksummed, large and small slices, beside an op on mapped memory. An access
 * that fails part-way fails its op alone with the access's code and words; the others land and
 * the stream stays in step. */
static void test_local_memory_through_an_access(void)
{
    enum { SIZE = 5 * MiB + 3 };
    static uint8_t src[SIZE], mem[SIZE], other[SIZE];
    fake_proc f = {mem, UINT64_MAX, 0, 0, 0, 0};
    mg_dp_access acc = {fake_get, fake_put, &f, fake_ahead};
    mg_dp_options big = {.slice_bytes = 1 * MiB, .window = 4};
    mg_dp_options small = {.slice_bytes = 4096, .window = 64};
    mg_dp_options summed = {.slice_bytes = 256 * 1024, .window = 8, .crc = 1};
    const mg_dp_options *opts[3] = {&big, &small, &summed};
    mg_dp_op ops[2];
    char errs[2][256];
    mg_dp_conn *c = start_filled(src, sizeof(src));
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    for (int k = 0; k < 3; k++) {
        uint64_t len = k == 1 ? 1 * MiB + 5 : SIZE;
        memcpy(mem, src, SIZE);
        memset(open_mem, 0, SIZE + 16);
        ops[0] = write_op(open_id, 9, NULL, len, errs[0], sizeof(errs[0]));
        ops[0].access = &acc;
        CU_ASSERT_EQUAL(mg_dp_run(c, ops, 1, opts[k]), 0);
        CU_ASSERT_EQUAL(ops[0].rc, 0);
        CU_ASSERT_EQUAL(memcmp(open_mem + 9, src, len), 0);
        memset(mem, 0, SIZE);
        ops[0].write = 0;
        CU_ASSERT_EQUAL(mg_dp_run(c, ops, 1, opts[k]), 0);
        CU_ASSERT_EQUAL(ops[0].rc, 0);
        CU_ASSERT_EQUAL(memcmp(mem, src, len), 0);
    }
    CU_ASSERT(f.calls > 256); /* small slices: a get or put each */
    /* every WRITE slice after an op's first was said ahead, while the one before it went */
    CU_ASSERT_EQUAL(f.foretold, (SIZE / MiB) + ((1 * MiB + 5) / 4096) + (SIZE / (256 * 1024)));
    /* the access fails past 2 MiB: that op fails by its words, the mapped one beside it lands */
    for (int write = 1; write >= 0; write--) {
        f.fail_at = 2 * MiB;
        memset(other, 0, SIZE);
        ops[0] = write_op(open_id, 0, NULL, 4 * MiB, errs[0], sizeof(errs[0]));
        ops[0].access = &acc;
        ops[0].write = write;
        ops[1] = write_op(open_id, 8 * MiB, write ? src : other, 3 * MiB, errs[1], sizeof(errs[1]));
        ops[1].write = write;
        if (!write)
            memcpy(open_mem + 8 * MiB, src, 3 * MiB);
        CU_ASSERT_EQUAL(mg_dp_run(c, ops, 2, &big), 0); /* the stream stayed in step */
        CU_ASSERT_EQUAL(ops[0].rc, MG_ERR_STATE);
        CU_ASSERT_STRING_EQUAL(errs[0], "process 4242 exited");
        CU_ASSERT_EQUAL(ops[0].done, 2 * MiB); /* the slices before it */
        CU_ASSERT_EQUAL(ops[1].rc, 0);
        CU_ASSERT_EQUAL(memcmp(write ? open_mem + 8 * MiB : other, src, 3 * MiB), 0);
        f.fail_at = UINT64_MAX;
        ops[0].rc = 0;
        CU_ASSERT_EQUAL(mg_dp_run(c, ops, 1, &summed), 0);
        CU_ASSERT_EQUAL(ops[0].rc, 0);
    }
    mg_dp_close(c);
    stop();
}

/* READs from a segment whose file a client cut short after registration: a plain slice's bytes
 * would go from the mapping by the kernel's copy (EFAULT past the file's end, after the answer's
 * header went), a checksummed one's through the stage by the CPU's (guarded). Either way the
 * slice is answered DATA_LOSS naming the segment, slices beside it in the same run are served,
 * and the connection goes on: one connection carries it all. */
static void test_reads_of_a_shrunk_file(void)
{
    enum { BLOCK = 4096 };
    static uint8_t back[4 * MiB];
    mg_dp_options plain = {.slice_bytes = BLOCK, .window = 16};
    mg_dp_options large = {.slice_bytes = 2 * MiB, .window = 4};
    mg_dp_options summed = {.slice_bytes = BLOCK, .window = 16, .crc = 1};
    const mg_dp_options *opts[] = {&plain, &large, &summed};
    mg_dp_server_stats st;
    mg_segment_info info;
    mg_dp_op ops[3];
    char errs[3][256], err[256], name[32];
    uint8_t *mem;
    uint64_t id;
    mg_dp_conn *c;
    start(8);
    id = add_segment("shrinks", 1, 4 * MiB, &mem);
    for (uint32_t i = 0; i < 4 * MiB; i++)
        mem[i] = (uint8_t)(i * 2654435761u >> 13);
    CU_ASSERT_EQUAL_FATAL(mg_registry_find(reg, "t", id, &info), 0);
    CU_ASSERT_EQUAL_FATAL(truncate(info.path, MiB), 0); /* the first MiB stays */
    snprintf(name, sizeof(name), "segment %llu", (unsigned long long)id);
    c = dial(token_t);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    for (size_t k = 0; k < sizeof(opts) / sizeof(opts[0]); k++) {
        /* Wholly past the end, and across it: DATA_LOSS naming the segment. */
        CU_ASSERT_EQUAL(mg_dp_read(c, id, 2 * MiB, back, 3 * BLOCK, opts[k], err, sizeof(err)),
                        MG_ERR_DATA_LOSS);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, name));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "shorter than registered"));
        CU_ASSERT_EQUAL(mg_dp_read(c, id, 0, back, 4 * MiB, opts[k], err, sizeof(err)),
                        MG_ERR_DATA_LOSS);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, name));
        /* In one run: the ops beside the lost one are served. */
        for (int i = 0; i < 3; i++)
            ops[i] = (mg_dp_op){.target = id,
                                .offset = i == 1 ? 3 * MiB : (uint64_t)i * BLOCK,
                                .buf = back + i * BLOCK,
                                .len = BLOCK,
                                .err = errs[i],
                                .errcap = sizeof(errs[i])};
        memset(back, 0, 3 * BLOCK);
        CU_ASSERT_EQUAL(mg_dp_run(c, ops, 3, opts[k]), 0);
        CU_ASSERT_EQUAL(ops[0].rc, 0);
        CU_ASSERT_EQUAL(ops[1].rc, MG_ERR_DATA_LOSS);
        CU_ASSERT_EQUAL(ops[2].rc, 0);
        CU_ASSERT_EQUAL(memcmp(back, mem, BLOCK), 0);
        CU_ASSERT_EQUAL(memcmp(back + 2 * BLOCK, mem + 2 * BLOCK, BLOCK), 0);
        /* What is still there comes back whole on the same connection. */
        memset(back, 0, MiB);
        CU_ASSERT_EQUAL(mg_dp_read(c, id, 0, back, MiB, opts[k], err, sizeof(err)), 0);
        CU_ASSERT_EQUAL(memcmp(back, mem, MiB), 0);
    }
    mg_dp_server_get_stats(srv, &st);
    CU_ASSERT_EQUAL(st.conns_total, 1);
    mg_dp_close(c);
    stop();
}

/* A peer that answers HELLO and then reads nothing, until `quit`. */
typedef struct {
    int lfd;
    int quit;
} silent_peer;

static void *silent_main(void *arg)
{
    silent_peer *sp = arg;
    uint8_t hello[MG_DF_HEADER_BYTES + MG_DF_TOKEN_BYTES], ok[MG_DF_HEADER_BYTES];
    mg_df_header h = {.type = MG_DF_HELLO_OK};
    int fd = accept(sp->lfd, NULL, NULL);
    size_t got = 0;
    while (fd >= 0 && got < sizeof(hello)) {
        ssize_t n = read(fd, hello + got, sizeof(hello) - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    mg_df_encode(&h, ok);
    if (fd >= 0 && write(fd, ok, sizeof(ok)) == (ssize_t)sizeof(ok))
        while (!__atomic_load_n(&sp->quit, __ATOMIC_ACQUIRE))
            usleep(10000);
    if (fd >= 0)
        close(fd);
    return NULL;
}

typedef struct {
    int *word;
    int value;
    unsigned after_ms;
} later;

static void *set_later(void *arg)
{
    later *l = arg;
    usleep(l->after_ms * 1000);
    __atomic_store_n(l->word, l->value, __ATOMIC_RELEASE);
    return NULL;
}

/* The stop word ends a transfer to a peer that takes nothing, well before the I/O timeout,
 * and says how far it got. */
static void test_stop_word(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    silent_peer sp = {socket(AF_INET, SOCK_STREAM, 0), 0};
    int stop = 0;
    uint64_t progress = 0, len = 64 * MiB;
    uint8_t *buf = calloc(1, len);
    mg_dp_options o = {.slice_bytes = MiB, .stop = &stop, .progress = &progress};
    later l = {&stop, MG_ERR_CANCELLED, 300};
    mg_dp_conn *c = NULL;
    pthread_t peer, setter;
    char err[256];
    CU_ASSERT_EQUAL_FATAL(bind(sp.lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    CU_ASSERT_EQUAL_FATAL(listen(sp.lfd, 1), 0);
    CU_ASSERT_EQUAL_FATAL(getsockname(sp.lfd, (struct sockaddr *)&a, &al), 0);
    pthread_create(&peer, NULL, silent_main, &sp);
    CU_ASSERT_EQUAL_FATAL(mg_dp_connect(&c, "127.0.0.1", ntohs(a.sin_port), token_t, 30000, NULL,
                                        NULL, err, sizeof(err)),
                          0);
    pthread_create(&setter, NULL, set_later, &l);
    CU_ASSERT_EQUAL(mg_dp_write(c, 1, 0, buf, len, &o, err, sizeof(err)), MG_ERR_CANCELLED);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "stopped (cancelled) with 0 of 67108864 bytes"));
    CU_ASSERT_EQUAL(progress, 0);
    pthread_join(setter, NULL);
    /* Set before the call: nothing is sent. */
    CU_ASSERT_EQUAL(mg_dp_read(c, 1, 0, buf, 10, &o, err, sizeof(err)), MG_ERR_CANCELLED);
    mg_dp_close(c);
    __atomic_store_n(&sp.quit, 1, __ATOMIC_RELEASE);
    pthread_join(peer, NULL);
    close(sp.lfd);
    free(buf);
}

/* Session tokens: random, bound to their tenant, dead after their TTL (the time passed in), at
 * most `max` live at once (expired ones make room); a server checks them through
 * mg_dp_sessions_auth. */
static void test_sessions(void)
{
    mg_dp_sessions *t;
    uint8_t a[MG_DF_TOKEN_BYTES], b[MG_DF_TOKEN_BYTES], c[MG_DF_TOKEN_BYTES];
    char tenant[MG_SEG_NAME_MAX + 1];
    uint64_t expires = 0;
    CU_ASSERT_EQUAL(mg_dp_sessions_new(&t, 0), MG_ERR_INVALID);
    CU_ASSERT_EQUAL_FATAL(mg_dp_sessions_new(&t, 2), 0);
    CU_ASSERT_EQUAL(mg_dp_sessions_add(t, "t1", 1000, 500, a), 0);
    CU_ASSERT_EQUAL(mg_dp_sessions_add(t, "t2", 1000, 5000, b), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(a, b, sizeof(a)), 0);
    CU_ASSERT_EQUAL(mg_dp_sessions_find(t, a, 1499, tenant, &expires), 0);
    CU_ASSERT_STRING_EQUAL(tenant, "t1");
    CU_ASSERT_EQUAL(expires, 1500u);
    CU_ASSERT_EQUAL(mg_dp_sessions_find(t, a, 1500, tenant, NULL), MG_ERR_AUTH); /* expired */
    CU_ASSERT_EQUAL(mg_dp_sessions_add(t, "t3", 1400, 500, c), MG_ERR_FULL);
    CU_ASSERT_EQUAL(mg_dp_sessions_add(t, "t3", 1500, 500, c), 0); /* a's room */
    CU_ASSERT_EQUAL(mg_dp_sessions_find(t, c, 1600, tenant, NULL), 0);
    CU_ASSERT_STRING_EQUAL(tenant, "t3");
    CU_ASSERT_EQUAL(mg_dp_sessions_find(t, b, 1600, tenant, NULL), 0);
    CU_ASSERT_STRING_EQUAL(tenant, "t2");
    memset(a, 0, sizeof(a));
    CU_ASSERT_EQUAL(mg_dp_sessions_auth(t, a, tenant), MG_ERR_AUTH);
    mg_dp_sessions_del(t);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_bytes_land_and_come_back),
        MG_TEST(test_refusals_keep_the_stream),
        MG_TEST(test_auth_and_malformed_streams),
        MG_TEST(test_limits_unreachable_and_stop),
        MG_TEST(test_leases_as_targets),
        MG_TEST(test_stop_word),
        MG_TEST(test_run_many_on_one_stream),
        MG_TEST(test_mixed_sizes_on_one_stream),
        MG_TEST(test_wide_window_many_frames),
        MG_TEST(test_held_segments),
        MG_TEST(test_reads_of_a_shrunk_file),
        MG_TEST(test_process_memory_as_a_target),
        MG_TEST(test_local_memory_through_an_access),
        MG_TEST(test_checksummed_slices_share_sends),
        MG_TEST(test_idle_pool),
        MG_TEST(test_sessions),
    };
    return mg_test_run("dataplane", cases, sizeof(cases) / sizeof(cases[0]));
}
