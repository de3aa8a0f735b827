/*
 * bench_checksum: what a CRC32C costs the data path, beside memcpy in the same run. For each
 * way this CPU sums (mg_crc32c_limit: the crc32 instruction's three streams, AVX-512 folding),
 * over --bytes of memory not in cache walked 256 KiB at a time (a slice as the data plane
 * sums it) and over one 256 KiB buffer that stays in cache:
 *   sum cold          mg_crc32c of the cold memory (Peer/Checksum over a range after a move)
 *   sum warm          mg_crc32c of the warm buffer (a slice that just landed)
 *   copy cold->warm   mg_crc32c_copy into the warm buffer (a sender staging a slice)
 *   copy warm->cold   mg_crc32c_copy, streaming stores, into cold memory (a receiver landing it)
 * and memcpy cold->warm and warm->cold as their references. Medians of --rounds (5), the ways
 * and memcpy alternated within each round. tests/bench/run.sh digest runs it.
 *
 *   bench_checksum [--bytes N] [--rounds N]
 */
#include "moongate/dataframe.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK      (256u << 10)
#define MAX_ROUNDS 21

enum { SUM_COLD, SUM_WARM, COPY_IN, COPY_OUT, MEASURES };
static const char *const measure_name[MEASURES] = {"sum cold", "sum warm", "copy cold->warm",
                                                   "copy warm->cold"};
static const char *const way_name[] = {"table", "crc32 x3", "fold"};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[n / 2];
}

static volatile uint32_t sink; /* the sums land here: none is optimized out */

/* GB/s of one measure over `bytes` (the warm sum over a sixteenth of them, as often as it
 * fits); way < 0: memcpy (the copies only). */
static double run(int measure, int way, uint8_t *cold, uint8_t *warm, size_t bytes)
{
    size_t moved = measure == SUM_WARM ? bytes / 16 : bytes;
    double t0;
    if (way >= 0)
        mg_crc32c_limit(way);
    t0 = now_s();
    for (size_t at = 0; at + CHUNK <= moved; at += CHUNK) {
        uint8_t *c = cold + at;
        if (measure == SUM_COLD)
            sink ^= mg_crc32c(0, c, CHUNK);
        else if (measure == SUM_WARM)
            sink ^= mg_crc32c(0, warm, CHUNK);
        else if (measure == COPY_IN)
            sink ^=
                way < 0 ? (memcpy(warm, c, CHUNK), warm[7]) : mg_crc32c_copy(0, warm, c, CHUNK, 0);
        else
            sink ^= way < 0 ? (memcpy(c, warm, CHUNK), c[7]) : mg_crc32c_copy(0, c, warm, CHUNK, 1);
    }
    return (double)moved / (now_s() - t0) / 1e9;
}

int main(int argc, char **argv)
{
    size_t bytes = (size_t)1 << 30;
    int rounds = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bytes") && i + 1 < argc)
            bytes = (size_t)strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else {
            int help = !strcmp(argv[i], "--help");
            fprintf(help ? stdout : stderr, "usage: bench_checksum [--bytes N] [--rounds N]\n");
            return help ? 0 : 64;
        }
    }
    bytes -= bytes % CHUNK;
    if (bytes < 64 * (size_t)CHUNK || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "bench_checksum: --bytes at least 16 MiB, --rounds 1-%d\n", MAX_ROUNDS);
        return 64;
    }
    uint8_t *cold = aligned_alloc(4096, bytes), *warm = aligned_alloc(4096, CHUNK);
    if (cold == NULL || warm == NULL) {
        fprintf(stderr, "bench_checksum: no memory for %zu bytes\n", bytes);
        return 1;
    }
    memset(cold, 0x5a, bytes); /* prefaulted, as the references' buffers are */
    memset(warm, 0xa5, CHUNK);
    int best = mg_crc32c_limit(MG_CRC_FOLD), nways = best - MG_CRC_SSE42 + 1;
    if (nways < 1) {
        fprintf(stderr, "bench_checksum: this CPU has no crc32 instruction\n");
        return 1;
    }
    /* [measure][way - MG_CRC_SSE42, or nways for memcpy][round] */
    static double gbs[MEASURES][3][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        for (int m = 0; m < MEASURES; m++)
            for (int k = 0; k <= nways; k++) {
                int w = (k + r) % (nways + 1); /* the order rotating round by round */
                if (w < nways)
                    gbs[m][w][r] = run(m, MG_CRC_SSE42 + w, cold, warm, bytes);
                else if (m == COPY_IN || m == COPY_OUT)
                    gbs[m][w][r] = run(m, -1, cold, warm, bytes);
            }
    mg_crc32c_limit(MG_CRC_FOLD);
    printf("CRC32C GB/s, %zu MiB walked in 256 KiB pieces, medians of %d\n", bytes >> 20, rounds);
    printf("  %-16s", "");
    for (int w = 0; w < nways; w++)
        printf(" %10s", way_name[MG_CRC_SSE42 + w]);
    printf(" %10s\n", "memcpy");
    for (int m = 0; m < MEASURES; m++) {
        printf("  %-16s", measure_name[m]);
        for (int w = 0; w <= nways; w++) {
            if (w == nways && (m == SUM_COLD || m == SUM_WARM))
                printf(" %10s", "-");
            else
                printf(" %10.2f", median(gbs[m][w], rounds));
        }
        printf("\n");
    }
    free(cold);
    free(warm);
    return 0;
}
