/*
 * Unit tests for GPU memory staged by its own process (engine/src/mg_seg_staged.c), with the
 * process played by a thread of this test on the other end of the copy channel: its "device
 * memory" a buffer of its own at a made-up device address, the staging buffer mapped from the
 * HELLO's memfd as the client library maps it. Writes land, in pieces, only once sync says so;
 * reads come back; writes from two threads at once all land; and the channel's failures — a
 * copy the process refuses, the process gone, an answer out of turn, a HELLO refused — fail by
 * name and keep failing.
 */
#include "mg_seg_kind.h"
#include "mg_test.h"
#include "moongate/stagewire.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define DEV_ADDR 0x7e0000000000ull /* where the fake device memory lies in the "process" */
#define DEV_SIZE (3u << 20)

static char dir[64];

/* The process's side: how it behaves, and what it saw. */
typedef struct fake {
    int fd;
    uint8_t *dev; /* its device memory */
    uint8_t *stage;
    size_t stage_len;
    int refuse_hello;   /* answers HELLO with an error */
    int fail_copy_at;   /* the n-th copy order (1-based) fails; 0: none */
    int quit_at;        /* closes the channel instead of answering the n-th order */
    int out_of_turn_at; /* answers the n-th order with another seq */
    int orders;
    pthread_t thread;
} fake;

static void *fake_main(void *arg)
{
    fake *f = arg;
    for (;;) {
        mg_stage_order o;
        mg_stage_answer a = {.magic = MG_STAGE_MAGIC};
        char ctl[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {.iov_base = &o, .iov_len = sizeof(o)};
        struct msghdr m = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
        ssize_t n = recvmsg(f->fd, &m, 0);
        if (n != (ssize_t)sizeof(o))
            break;
        a.seq = o.seq;
        if (o.type == MG_STAGE_HELLO) {
            struct cmsghdr *c = CMSG_FIRSTHDR(&m);
            int mfd;
            memcpy(&mfd, CMSG_DATA(c), sizeof(int));
            f->stage = mmap(NULL, o.len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
            f->stage_len = o.len;
            close(mfd);
            if (f->refuse_hello) {
                a.status = 3;
                snprintf(a.why, sizeof(a.why), "not device memory of this process");
            }
        } else {
            uint8_t *d = f->dev + (o.addr - DEV_ADDR);
            f->orders++;
            if (f->quit_at == f->orders)
                break;
            if (f->out_of_turn_at == f->orders)
                a.seq += 7;
            if (f->fail_copy_at == f->orders) {
                a.status = 13;
                snprintf(a.why, sizeof(a.why), "cuMemcpyHtoD: CUDA_ERROR_ILLEGAL_ADDRESS");
            } else if (o.type == MG_STAGE_TO_DEVICE) {
                memcpy(d, f->stage + o.slot_off, o.len);
            } else {
                memcpy(f->stage + o.slot_off, d, o.len);
            }
        }
        if (send(f->fd, &a, sizeof(a), MSG_NOSIGNAL) != (ssize_t)sizeof(a))
            break;
    }
    close(f->fd);
    return NULL;
}

static mg_registry *open_reg(void)
{
    mg_registry_config cfg = {.shm_dir = dir,
                              .file_mode = 0600,
                              .max_segments = 16,
                              .max_registered_bytes = 1 << 26,
                              .tcp_targets = 1};
    mg_registry *reg = NULL;
    snprintf(dir, sizeof(dir), "/tmp/mgstaged-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    CU_ASSERT_EQUAL_FATAL(mg_registry_new(&reg, &cfg), 0);
    return reg;
}

static void close_reg(mg_registry *reg)
{
    mg_registry_del(reg);
    rmdir(dir);
}

/* A staged segment over DEV_SIZE bytes of f's device memory: reserved and mapped (HELLO). The
 * map's result in *rc, its error in err. */
static mg_segment *staged(mg_registry *reg, fake *f, int *rc, char *err)
{
    int sv[2];
    mg_segment *seg = NULL;
    mg_segment_spec spec = {.tenant = "t",
                            .name = "gpu",
                            .source = MG_SEG_STAGED,
                            .size = DEV_SIZE,
                            .client_addr = DEV_ADDR,
                            .location = "cuda:0",
                            .remote_accessible = 1,
                            .client = {getpid(), 0}};
    CU_ASSERT_EQUAL_FATAL(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    f->fd = sv[1];
    f->dev = calloc(1, DEV_SIZE);
    CU_ASSERT_EQUAL_FATAL(pthread_create(&f->thread, NULL, fake_main, f), 0);
    spec.fd = sv[0];
    CU_ASSERT_EQUAL_FATAL(mg_registry_reserve(reg, &spec, &seg, err), 0);
    *rc = mg_segment_map(seg);
    snprintf(err, MG_SEG_ERROR_MAX, "%s", mg_segment_error(seg));
    mg_registry_commit(reg, seg, *rc);
    return *rc == 0 ? seg : NULL;
}

static void done(mg_registry *reg, fake *f)
{
    close_reg(reg); /* the daemon's end closes: the fake's thread ends */
    pthread_join(f->thread, NULL);
    if (f->stage)
        munmap(f->stage, f->stage_len);
    free(f->dev);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 7 + seed);
}

static void test_written_in_pieces_and_read_back(void)
{
    mg_registry *reg = open_reg();
    fake f = {0};
    char err[MG_SEG_ERROR_MAX], why[256];
    size_t n = (1u << 20) + 4097; /* more than the staging buffer, not a multiple of a slot */
    uint8_t *data = malloc(n), *back = calloc(1, n);
    int rc;
    mg_segment *seg = staged(reg, &f, &rc, err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(seg);
    CU_ASSERT_EQUAL(mg_segment_caps(seg) & (MG_SEG_CAP_TCP | MG_SEG_CAP_MAPPED), MG_SEG_CAP_TCP);
    fill(data, n, 3);
    CU_ASSERT_EQUAL(mg_segment_write(seg, 1000, data, n, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_segment_sync(seg, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(memcmp(f.dev + 1000, data, n), 0); /* all of it, once sync returned */
    CU_ASSERT_EQUAL(mg_segment_read(seg, 1000, back, n, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(memcmp(back, data, n), 0);
    /* past the end: refused before any order */
    CU_ASSERT_EQUAL(mg_segment_write(seg, DEV_SIZE - 10, data, 11, why, sizeof(why)), MG_ERR_RANGE);
    done(reg, &f);
    free(data);
    free(back);
}

/* A WRITE landed straight in the slots, as the data plane lands one: each held, filled and
 * committed (one given back unused, one past the end refused and given back), then synced. */
static void test_landed_in_the_slots(void)
{
    mg_registry *reg = open_reg();
    fake f = {0};
    char err[MG_SEG_ERROR_MAX], why[256];
    uint8_t want[3 * 1000];
    size_t cap;
    int rc, ticket;
    mg_segment *seg = staged(reg, &f, &rc, err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(seg);
    CU_ASSERT(mg_segment_lands(seg));
    fill(want, sizeof(want), 5);
    for (int i = 0; i < 3; i++) {
        uint8_t *p = mg_segment_land(seg, &cap, &ticket, why, sizeof(why));
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        CU_ASSERT(cap >= 1000);
        memcpy(p, want + i * 1000, 1000);
        CU_ASSERT_EQUAL(
            mg_segment_commit(seg, ticket, 77 + (uint64_t)i * 1000, 1000, why, sizeof(why)), 0);
    }
    for (int i = 0; i < 8; i++) { /* given back: never a slot lost (there are fewer than 8) */
        CU_ASSERT_PTR_NOT_NULL_FATAL(mg_segment_land(seg, &cap, &ticket, why, sizeof(why)));
        CU_ASSERT_EQUAL(mg_segment_commit(seg, ticket, 0, 0, why, sizeof(why)), 0);
    }
    CU_ASSERT_PTR_NOT_NULL_FATAL(mg_segment_land(seg, &cap, &ticket, why, sizeof(why)));
    CU_ASSERT_EQUAL(mg_segment_commit(seg, ticket, DEV_SIZE - 1, 2, why, sizeof(why)),
                    MG_ERR_RANGE);
    CU_ASSERT_EQUAL(mg_segment_sync(seg, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(memcmp(f.dev + 77, want, sizeof(want)), 0);
    done(reg, &f);
}

/* Reads fetched ahead: taken by the read they were for, and, not taken, let go of with their
 * token, answered or not, every slot back (four held at once after). */
static void test_read_ahead_taken_or_let_go(void)
{
    mg_registry *reg = open_reg();
    fake f = {0};
    char err[MG_SEG_ERROR_MAX], why[256];
    uint8_t back[4096];
    size_t cap;
    int rc, tickets[4], a, b;
    mg_segment *seg = staged(reg, &f, &rc, err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(seg);
    fill(f.dev, DEV_SIZE, 9);
    mg_segment_prefetch(seg, &a, 8192, sizeof(back));
    mg_segment_prefetch(seg, &a, 8192, sizeof(back)); /* on its way already: once */
    CU_ASSERT_EQUAL(mg_segment_read(seg, 8192, back, sizeof(back), why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(memcmp(back, f.dev + 8192, sizeof(back)), 0);
    mg_segment_prefetch(seg, &b, 0, 4096); /* never read: */
    mg_segment_prefetch(seg, &b, 4096, 4096);
    CU_ASSERT_EQUAL(mg_segment_sync(seg, why, sizeof(why)), 0); /* one answered, say */
    mg_segment_prefetch(seg, &b, 65536, 4096);
    mg_segment_prefetch_drop(seg, &b);
    for (int i = 0; i < 4; i++) /* every slot free again, sooner or later */
        CU_ASSERT_PTR_NOT_NULL(mg_segment_land(seg, &cap, &tickets[i], why, sizeof(why)));
    for (int i = 0; i < 4; i++)
        CU_ASSERT_EQUAL(mg_segment_commit(seg, tickets[i], 0, 0, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_segment_read(seg, 0, back, sizeof(back), why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(memcmp(back, f.dev, sizeof(back)), 0);
    done(reg, &f);
}

typedef struct {
    mg_segment *seg;
    uint64_t off;
    unsigned seed;
    int rc;
} writer;

static void *write_main(void *arg)
{
    writer *w = arg;
    uint8_t *data = malloc(1u << 20);
    char why[256];
    fill(data, 1u << 20, w->seed);
    for (int i = 0; i < 4 && w->rc == 0; i++) /* a slice at a time, as the data plane lands */
        if ((w->rc = mg_segment_write(w->seg, w->off, data, 1u << 20, why, sizeof(why))) == 0)
            w->rc = mg_segment_sync(w->seg, why, sizeof(why));
    free(data);
    return NULL;
}

static void test_two_writers_at_once_all_land(void)
{
    mg_registry *reg = open_reg();
    fake f = {0};
    char err[MG_SEG_ERROR_MAX];
    uint8_t *want = malloc(1u << 20);
    writer w[2];
    pthread_t t[2];
    int rc;
    mg_segment *seg = staged(reg, &f, &rc, err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(seg);
    for (int i = 0; i < 2; i++) {
        w[i] = (writer){seg, (uint64_t)i << 20, 11u * (unsigned)(i + 1), 0};
        CU_ASSERT_EQUAL_FATAL(pthread_create(&t[i], NULL, write_main, &w[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        CU_ASSERT_EQUAL(w[i].rc, 0);
        fill(want, 1u << 20, w[i].seed);
        CU_ASSERT_EQUAL(memcmp(f.dev + ((size_t)i << 20), want, 1u << 20), 0);
    }
    done(reg, &f);
    free(want);
}

/* One failure of the channel, then: the op that met it fails with `rc` naming `words`, and so
 * does every op after it. */
static void broken_by(fake f, int rc_want, const char *words)
{
    mg_registry *reg = open_reg();
    char err[MG_SEG_ERROR_MAX], why[256];
    uint8_t data[4096] = {0};
    int rc = 0;
    mg_segment *seg = staged(reg, &f, &rc, err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(seg);
    rc = mg_segment_write(seg, 0, data, sizeof(data), why, sizeof(why));
    if (rc == 0)
        rc = mg_segment_sync(seg, why, sizeof(why));
    CU_ASSERT_EQUAL(rc, rc_want);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, words));
    if (!strstr(why, words))
        fprintf(stderr, "said: %s\n", why);
    CU_ASSERT_NOT_EQUAL(mg_segment_read(seg, 0, data, 16, why, sizeof(why)), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, words)); /* the first reason, again */
    done(reg, &f);
}

static void test_the_channels_failures_are_named_and_stay(void)
{
    broken_by((fake){.fail_copy_at = 1}, MG_ERR_SYSTEM, "CUDA_ERROR_ILLEGAL_ADDRESS");
    broken_by((fake){.quit_at = 1}, MG_ERR_STATE, "ended, or closed its copy channel");
    broken_by((fake){.out_of_turn_at = 1}, MG_ERR_STATE, "out of turn");
}

static void test_a_hello_refused_fails_the_registration(void)
{
    mg_registry *reg = open_reg();
    fake f = {.refuse_hello = 1};
    char err[MG_SEG_ERROR_MAX];
    int rc;
    CU_ASSERT_PTR_NULL(staged(reg, &f, &rc, err));
    CU_ASSERT_EQUAL(rc, MG_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "not device memory of this process"));
    done(reg, &f);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_written_in_pieces_and_read_back),
        MG_TEST(test_landed_in_the_slots),
        MG_TEST(test_read_ahead_taken_or_let_go),
        MG_TEST(test_two_writers_at_once_all_land),
        MG_TEST(test_the_channels_failures_are_named_and_stay),
        MG_TEST(test_a_hello_refused_fails_the_registration),
    };
    return mg_test_run("staged GPU memory", cases, sizeof(cases) / sizeof(cases[0]));
}
