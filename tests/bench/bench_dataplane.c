/*
 * bench_dataplane: TCP data-plane throughput over loopback, one connection: a server on a real
 * registry in this process (its own threads) and the client API, moving --bytes into and out of
 * a registered segment in slices. Prints GB/s for WRITE and READ, without and with CRC32C.
 * tests/bench/run.sh dataplane prints iperf3's single-stream figure beside it.
 *
 *   bench_dataplane [--bytes N] [--slice N] [--window N]
 */
#include "moongate/dataplane.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const uint8_t token[MG_DF_TOKEN_BYTES] = "bench";

static int auth(void *arg, const uint8_t t[MG_DF_TOKEN_BYTES], char *tenant)
{
    snprintf(tenant, MG_SEG_NAME_MAX + 1, "bench");
    return memcmp(t, token, MG_DF_TOKEN_BYTES) == 0 ? 0 : MG_ERR_AUTH;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    uint64_t bytes = 1ULL << 30;
    uint32_t slice = 1u << 20;
    unsigned window = 16;
    char dir[64] = "/dev/shm/mg-bench-dp-XXXXXX", err[256];
    mg_registry_config rc = {.shm_dir = dir, .file_mode = 0600, .max_segments = 4};
    mg_registry *reg;
    mg_segment *seg;
    mg_segment_info info;
    mg_dp_server *srv;
    mg_dp_conn *c;
    uint8_t *buf;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bytes"))
            bytes = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--slice"))
            slice = (uint32_t)strtoul(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--window"))
            window = (unsigned)strtoul(argv[i + 1], NULL, 0);
    }
    if (mkdtemp(dir) == NULL || mg_registry_new(&reg, &rc) != 0)
        return 1;
    {
        mg_segment_spec spec = {.tenant = "bench",
                                .name = "dst",
                                .source = MG_SEG_ANON,
                                .size = bytes,
                                .remote_accessible = 1,
                                .prefault = 1};
        if (mg_registry_reserve(reg, &spec, &seg, err) != 0)
            return 1;
        mg_registry_commit(reg, seg, mg_segment_map(seg));
        mg_segment_get_info(reg, seg, &info);
    }
    {
        mg_dp_server_config sc = {.host = "127.0.0.1",
                                  .registry = reg,
                                  .max_slice = slice,
                                  .max_conns = 4,
                                  .io_timeout_ms = 10000,
                                  .auth = auth};
        if (mg_dp_server_start(&srv, &sc, err, sizeof(err)) != 0 ||
            mg_dp_connect(&c, "127.0.0.1", mg_dp_server_port(srv), token, 5000, NULL, NULL, err,
                          sizeof(err)) != 0) {
            fprintf(stderr, "bench_dataplane: %s\n", err);
            return 1;
        }
    }
    buf = malloc(bytes);
    memset(buf, 0x5a, bytes); /* faulted in before timing */
    printf("moongate data plane, 1 connection over loopback, %.2f GiB, %u KiB slices, %u in "
           "flight\n",
           (double)bytes / (1 << 30), slice >> 10, window);
    for (int crc = 0; crc <= 1; crc++) {
        mg_dp_options o = {.slice_bytes = slice, .window = window, .crc = crc};
        double t0 = now_s(), tw, tr;
        if (mg_dp_write(c, info.id, 0, buf, bytes, &o, err, sizeof(err)) != 0)
            goto fail;
        tw = now_s() - t0;
        t0 = now_s();
        if (mg_dp_read(c, info.id, 0, buf, bytes, &o, err, sizeof(err)) != 0)
            goto fail;
        tr = now_s() - t0;
        printf("%-16s WRITE %6.2f GB/s   READ %6.2f GB/s\n", crc ? "with CRC32C" : "no CRC",
               (double)bytes / tw / 1e9, (double)bytes / tr / 1e9);
    }
    mg_dp_close(c);
    mg_dp_server_stop(srv);
    mg_registry_del(reg);
    rmdir(dir);
    free(buf);
    return 0;
fail:
    fprintf(stderr, "bench_dataplane: %s\n", err);
    return 1;
}
