/*
 * Unit tests for the data-plane frames (moongate/dataframe.h): CRC32C (and summed while
 * copied), header encode/decode and its validation (truncation, magic, version, checksum, type,
 * flags, lengths, offset overflow), and slice planning.
 */
#include "mg_test.h"
#include "moongate/dataframe.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { FIRST_USERS = 4, FIRST_ROUNDS = 10, FIRST_LEN = 3 * 8192 * 3 + 100 };
static pthread_barrier_t first_barrier;
static uint8_t first_buf[FIRST_LEN];

static void *first_use(void *arg)
{
    uint32_t *out = arg;
    pthread_barrier_wait(&first_barrier);
    out[0] = mg_crc32c_portable(0, first_buf, sizeof(first_buf)); /* the byte table */
    out[1] = mg_crc32c(0, first_buf, sizeof(first_buf));          /* the shift tables */
    return NULL;
}

/* In a child process whose tables are not made yet: FIRST_USERS threads sum at once. Exit
 * status 0 when every thread got the same CRC both ways. */
static int first_use_child(void)
{
    pthread_t th[FIRST_USERS];
    uint32_t got[FIRST_USERS][2];
    if (pthread_barrier_init(&first_barrier, NULL, FIRST_USERS) != 0)
        return 10;
    for (int i = 0; i < FIRST_USERS; i++)
        if (pthread_create(&th[i], NULL, first_use, got[i]) != 0)
            return 11;
    for (int i = 0; i < FIRST_USERS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < FIRST_USERS; i++)
        if (got[i][0] != got[0][0] || got[i][1] != got[0][0])
            return 12;
    return 0;
}

/* The first CRCs of a process, from several threads at once: the tables are made once and every
 * thread sums with complete ones. ThreadSanitizer's build reports a table written by two
 * threads, or read while another writes it, and the child exits with its exitcode. Each round
 * is a child forked before this process summed anything (this test runs first), so each starts
 * without tables. */
static void test_crc32c_first_use_from_threads(void)
{
    for (size_t i = 0; i < sizeof(first_buf); i++)
        first_buf[i] = (uint8_t)(i * 151 + 3);
    for (int round = 0; round < FIRST_ROUNDS; round++) {
        int status = -1;
        pid_t pid = fork();
        if (pid == 0)
            _exit(first_use_child());
        CU_ASSERT_FATAL(pid > 0);
        CU_ASSERT_EQUAL(waitpid(pid, &status, 0), pid);
        CU_ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    CU_ASSERT_EQUAL(first_use_child(), 0); /* and this process, once */
}

static void test_crc32c(void)
{
    static const char digits[] = "123456789";
    uint8_t buf[1000];
    uint32_t whole, parts;
    CU_ASSERT_EQUAL(mg_crc32c(0, digits, 9), 0xe3069283U); /* the standard check value */
    CU_ASSERT_EQUAL(mg_crc32c(0, "", 0), 0);
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)(i * 131 + 7);
    whole = mg_crc32c(0, buf, sizeof(buf));
    parts = mg_crc32c(mg_crc32c(0, buf, 333), buf + 333, sizeof(buf) - 333);
    CU_ASSERT_EQUAL(whole, parts); /* continues across pieces, odd lengths included */
    CU_ASSERT_EQUAL(mg_crc32c_portable(0, digits, 9), 0xe3069283U);
    for (size_t n = 0; n <= sizeof(buf); n += 37) /* both paths agree, every alignment */
        CU_ASSERT_EQUAL(mg_crc32c(5, buf + (n % 8), n - (n % 8)),
                        mg_crc32c_portable(5, buf + (n % 8), n - (n % 8)));
    buf[500] ^= 1;
    CU_ASSERT_NOT_EQUAL(mg_crc32c(0, buf, sizeof(buf)), whole);
}

/* Every length around the edges of the blocks each way sums in, at every alignment, against
 * the table. */
static void test_crc32c_long(void)
{
    enum { N = 3 * 8192 * 2 + 3 * 256 * 3 + 64 };
    static uint8_t big[N + 8];
    static const size_t lens[] = {0,
                                  767,
                                  768,
                                  769,
                                  3 * 8192 - 1,
                                  3 * 8192,
                                  3 * 8192 + 1,
                                  1023,
                                  1024,
                                  1024 + 255,
                                  1024 + 256,
                                  1024 + 257,
                                  3 * 8192 + 3 * 256 + 7,
                                  2 * 3 * 8192,
                                  N};
    uint32_t seed = 12345;
    for (size_t i = 0; i < sizeof(big); i++) {
        seed = seed * 1103515245u + 12345u;
        big[i] = (uint8_t)(seed >> 16);
    }
    static uint8_t copy[N + 16];
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++)
        for (size_t a = 0; a < 8; a++) {
            uint32_t want = mg_crc32c_portable(0x1234, big + a, lens[k]);
            CU_ASSERT_EQUAL(mg_crc32c(0x1234, big + a, lens[k]), want);
            /* summed while copied (cached and streamed stores), to any alignment: the same
             * sum, every byte there and no byte past the end touched */
            for (int stream = 0; stream < 2; stream++) {
                memset(copy, 0xee, sizeof(copy));
                CU_ASSERT_EQUAL(mg_crc32c_copy(0x1234, copy + 7 - a, big + a, lens[k], stream),
                                want);
                CU_ASSERT_EQUAL(memcmp(copy + 7 - a, big + a, lens[k]), 0);
                CU_ASSERT_EQUAL(copy[7 - a + lens[k]], 0xee);
                CU_ASSERT_TRUE(7 - a == 0 || copy[6 - a] == 0xee);
            }
        }
    /* A flipped bit in any of the three streams changes it. */
    for (size_t at = 100; at < 3 * 8192; at += 8192) {
        uint32_t before = mg_crc32c(0, big, 3 * 8192);
        big[at] ^= 4;
        CU_ASSERT_NOT_EQUAL(mg_crc32c(0, big, 3 * 8192), before);
        big[at] ^= 4;
    }
}

/* Long inputs take the three-stream path (blocks of 8 KiB and of 256 bytes joined by shifts),
 * or past 1 KiB the folding one (steps of 256 bytes after a head up to where the copy is 64-byte
 * aligned): each way the CPU has, every length around their edges, at every alignment, agrees
 * with the table. */
static void test_crc32c_each_way(void)
{
    int best = mg_crc32c_limit(MG_CRC_FOLD);
    for (int way = MG_CRC_TABLE; way <= best; way++) {
        CU_ASSERT_EQUAL(mg_crc32c_limit(way), way);
        test_crc32c_long();
    }
    mg_crc32c_limit(MG_CRC_FOLD);
}

static mg_df_header hdr(uint8_t type, uint16_t flags, uint64_t offset, uint32_t length)
{
    mg_df_header h = {MG_DF_VERSION, type,   flags, 77,         0x1234567890abcdefULL,
                      offset,        length, 0,     0xabcdef01U};
    return h;
}

static int decode_of(const mg_df_header *h, uint32_t max)
{
    uint8_t b[MG_DF_HEADER_BYTES];
    mg_df_header out;
    mg_df_encode(h, b);
    return mg_df_decode(b, sizeof(b), max, &out);
}

static void test_round_trip(void)
{
    static const uint8_t types[] = {MG_DF_WRITE, MG_DF_WRITE_ACK, MG_DF_READ, MG_DF_READ_DATA};
    uint8_t b[MG_DF_HEADER_BYTES];
    mg_df_header h = hdr(MG_DF_HELLO, 0, 0, MG_DF_TOKEN_BYTES), out;
    mg_df_encode(&h, b);
    CU_ASSERT_EQUAL(mg_df_decode(b, sizeof(b), 1 << 20, &out), MG_DF_OK);
    CU_ASSERT_EQUAL(mg_df_payload_bytes(&out), MG_DF_TOKEN_BYTES);
    CU_ASSERT_EQUAL(memcmp(b, "MGDP", 4), 0);
    for (size_t i = 0; i < sizeof(types); i++) {
        h = hdr(types[i], types[i] == MG_DF_WRITE_ACK ? MG_DF_LEASE : MG_DF_CRC | MG_DF_LEASE, 4096,
                65536);
        mg_df_encode(&h, b);
        CU_ASSERT_EQUAL_FATAL(mg_df_decode(b, sizeof(b), 1 << 20, &out), MG_DF_OK);
        CU_ASSERT_EQUAL(out.type, h.type);
        CU_ASSERT_EQUAL(out.flags, h.flags);
        CU_ASSERT_EQUAL(out.slice, 77);
        CU_ASSERT_EQUAL(out.target, 0x1234567890abcdefULL);
        CU_ASSERT_EQUAL(out.offset, 4096);
        CU_ASSERT_EQUAL(out.length, 65536);
        CU_ASSERT_EQUAL(out.payload_crc, 0xabcdef01U);
        CU_ASSERT_EQUAL(mg_df_payload_bytes(&out),
                        types[i] == MG_DF_WRITE || types[i] == MG_DF_READ_DATA ? 65536 : 0);
    }
}

static void test_truncation_magic_version_checksum(void)
{
    uint8_t b[MG_DF_HEADER_BYTES];
    mg_df_header h = hdr(MG_DF_WRITE, 0, 0, 10), out;
    mg_df_encode(&h, b);
    for (size_t n = 0; n < MG_DF_HEADER_BYTES; n++)
        CU_ASSERT_EQUAL(mg_df_decode(b, n, 1 << 20, &out), MG_DF_NEED_MORE);
    b[0] = 'X';
    CU_ASSERT_EQUAL(mg_df_decode(b, 4, 1 << 20, &out), MG_DF_BAD_MAGIC); /* known early */
    mg_df_encode(&h, b);
    b[4] = MG_DF_VERSION + 1; /* a newer peer: refused as soon as the version byte is there */
    CU_ASSERT_EQUAL(mg_df_decode(b, 5, 1 << 20, &out), MG_DF_BAD_VERSION);
    CU_ASSERT_EQUAL(out.version, MG_DF_VERSION + 1);
    b[4] = MG_DF_VERSION_MIN - 1; /* older than any this build speaks */
    CU_ASSERT_EQUAL(mg_df_decode(b, 5, 1 << 20, &out), MG_DF_BAD_VERSION);
    for (unsigned v = MG_DF_VERSION_MIN; v <= MG_DF_VERSION; v++) { /* each spoken one */
        b[4] = (uint8_t)v;
        CU_ASSERT_EQUAL(mg_df_decode(b, 5, 1 << 20, &out), MG_DF_NEED_MORE);
    }
    mg_df_encode(&h, b);
    b[30] ^= 0x40; /* a flipped bit anywhere in the header */
    CU_ASSERT_EQUAL(mg_df_decode(b, sizeof(b), 1 << 20, &out), MG_DF_BAD_CRC);
}

static void test_type_flags_lengths_range(void)
{
    mg_df_header h;
    h = hdr(0, 0, 0, 1);
    CU_ASSERT_EQUAL(decode_of(&h, 100), MG_DF_BAD_TYPE);
    h = hdr(MG_DF_ERROR + 1, 0, 0, 1);
    CU_ASSERT_EQUAL(decode_of(&h, 100), MG_DF_BAD_TYPE);
    h = hdr(MG_DF_HELLO, MG_DF_CRC, 0, MG_DF_TOKEN_BYTES);
    CU_ASSERT_EQUAL(decode_of(&h, 100), MG_DF_BAD_FLAGS);
    h = hdr(MG_DF_WRITE, 0x8, 0, 1);
    CU_ASSERT_EQUAL(decode_of(&h, 100), MG_DF_BAD_FLAGS);
    h = hdr(MG_DF_HELLO, 0, 0, MG_DF_TOKEN_BYTES - 1);
    CU_ASSERT_EQUAL(decode_of(&h, 100), MG_DF_BAD_LENGTH);
    h = hdr(MG_DF_HELLO_OK, 0, 0, 1);
    CU_ASSERT_EQUAL(decode_of(&h, 100), MG_DF_BAD_LENGTH);
    h = hdr(MG_DF_WRITE, 0, 0, 0);
    CU_ASSERT_EQUAL(decode_of(&h, 100), MG_DF_BAD_LENGTH);
    h = hdr(MG_DF_WRITE, 0, 0, 101); /* over the slice limit */
    CU_ASSERT_EQUAL(decode_of(&h, 100), MG_DF_BAD_LENGTH);
    h = hdr(MG_DF_READ, 0, 0, 100);
    CU_ASSERT_EQUAL(decode_of(&h, 100), MG_DF_OK);
    h = hdr(MG_DF_READ_DATA, 0, 0, 0);
    CU_ASSERT_EQUAL(decode_of(&h, 100), MG_DF_OK); /* an empty answer */
    h = hdr(MG_DF_READ_DATA, 0, 0, 5);
    h.status = 11; /* a failed read carries no data */
    CU_ASSERT_EQUAL(decode_of(&h, 100), MG_DF_BAD_LENGTH);
    h = hdr(MG_DF_ERROR, 0, 0, 1025);
    CU_ASSERT_EQUAL(decode_of(&h, 1 << 20), MG_DF_BAD_LENGTH);
    h = hdr(MG_DF_WRITE, 0, UINT64_MAX - 10, 11); /* offset + length wraps */
    CU_ASSERT_EQUAL(decode_of(&h, 100), MG_DF_BAD_RANGE);
    h = hdr(MG_DF_WRITE, 0, UINT64_MAX - 10, 10);
    CU_ASSERT_EQUAL(decode_of(&h, 100), MG_DF_OK);
    CU_ASSERT_STRING_EQUAL(mg_df_strerror(MG_DF_BAD_VERSION),
                           "unsupported data-plane protocol version");
}

static void test_slices(void)
{
    mg_slice s[8];
    uint64_t sum = 0;
    CU_ASSERT_EQUAL(mg_slice_count(0, 4096), 0);
    CU_ASSERT_EQUAL(mg_slice_count(1, 4096), 1);
    CU_ASSERT_EQUAL(mg_slice_count(4096, 4096), 1);
    CU_ASSERT_EQUAL(mg_slice_count(4097, 4096), 2);
    CU_ASSERT_EQUAL(mg_slice_count(1ULL << 40, 4u << 20), 1ULL << 18);
    CU_ASSERT_EQUAL(mg_slice_count(10, 0), 0);
    CU_ASSERT_EQUAL(mg_slice_plan(100, 7, 10000, 4096, 0, s, 8), 3);
    CU_ASSERT_EQUAL(s[0].local_offset, 100);
    CU_ASSERT_EQUAL(s[0].remote_offset, 7);
    CU_ASSERT_EQUAL(s[2].local_offset, 100 + 8192);
    CU_ASSERT_EQUAL(s[2].remote_offset, 7 + 8192);
    CU_ASSERT_EQUAL(s[2].length, 10000 - 8192);
    for (int i = 0; i < 3; i++)
        sum += s[i].length;
    CU_ASSERT_EQUAL(sum, 10000);
    /* A window in the middle of a long transfer. */
    CU_ASSERT_EQUAL(mg_slice_plan(0, 0, 1ULL << 33, 1u << 20, 8190, s, 8), 2);
    CU_ASSERT_EQUAL(s[1].local_offset, 8191ULL << 20);
    CU_ASSERT_EQUAL(s[1].length, 1u << 20);
    CU_ASSERT_EQUAL(mg_slice_plan(0, 0, 100, 64, 5, s, 8), 0); /* past the end */
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_crc32c_first_use_from_threads), /* first: nothing summed before it */
        MG_TEST(test_crc32c),
        MG_TEST(test_crc32c_each_way),
        MG_TEST(test_round_trip),
        MG_TEST(test_truncation_magic_version_checksum),
        MG_TEST(test_type_flags_lengths_range),
        MG_TEST(test_slices),
    };
    return mg_test_run("dataframe", cases, sizeof(cases) / sizeof(cases[0]));
}
