/*
 * An in-process daemon for the unit suites that drive the gateway with the C client: the real
 * config parser, engine and gateway, the loop in a thread of this process, listening on a Unix
 * socket and, when asked, h2c on a free TCP port of 127.0.0.1.
 */
#ifndef MG_TEST_GATEWAY_H
#define MG_TEST_GATEWAY_H

#include "mg_config.h"
#include "mg_core.h"
#include "mg_log.h"

#include <arpa/inet.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
    mg_config cfg;
    mg_engine *engine;
    mg_gateway *gw;
    struct event_base *base;
    pthread_t thread;
    void (*on_loop_thread)(void); /* run first on the loop's thread, or NULL */
    char shm_dir[64];
    char sock_target[128]; /* "unix:/tmp/..." */
    char tcp_target[64];   /* "127.0.0.1:PORT", or "" without h2c */
} mg_test_gw;

static inline int mg_test_free_port(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port;
    bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    getsockname(fd, (struct sockaddr *)&sa, &len);
    port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

static inline void *mg_test_gw_main(void *arg)
{
    mg_test_gw *g = arg;
    if (g->on_loop_thread)
        g->on_loop_thread();
    event_base_dispatch(g->base);
    return NULL;
}

/* Starts it: `tag` names its files, `tcp` adds h2c, `debug` serves moongate.v1.Debug. The
 * engine has 2 workers and a queue of queue_depth. Returns 0 or -1 (reason on stderr). */
static inline int mg_test_gw_start(mg_test_gw *g, const char *tag, int tcp, int debug,
                                   unsigned queue_depth, mg_log_level level)
{
    char err[512], sock[96], h2c[64] = "--h2c-listen=", shm[96];
    char *argv[] = {"moongate",
                    shm, /* the agents' state file goes there, as the segments do */
                    "--listen=",
                    "--ops-listen=",
                    "--access-log=false",
                    "--workers=2",
                    "--pool-bytes=0",
                    "--data-listen=",
                    "--allow-anonymous",
                    sock,
                    h2c,
                    "--debug-service"};
    int argc = (int)(sizeof(argv) / sizeof(argv[0])) - (debug ? 0 : 1);
    mg_engine_config ec = {.workers = 2,
                           .queue_depth = queue_depth,
                           .registry = {.shm_dir = g->shm_dir,
                                        .file_mode = 0600,
                                        .max_segments = 64,
                                        .max_registered_bytes = 1 << 30}};
    snprintf(g->shm_dir, sizeof(g->shm_dir), "/tmp/mg-test-%s-shm-XXXXXX", tag);
    if (mkdtemp(g->shm_dir) == NULL)
        return -1;
    snprintf(shm, sizeof(shm), "--shm-dir=%s", g->shm_dir);
    snprintf(sock, sizeof(sock), "--unix-socket=/tmp/mg-test-%s-%d.sock", tag, (int)getpid());
    snprintf(g->sock_target, sizeof(g->sock_target), "unix:/tmp/mg-test-%s-%d.sock", tag,
             (int)getpid());
    g->tcp_target[0] = '\0';
    if (tcp) {
        int port = mg_test_free_port();
        snprintf(h2c, sizeof(h2c), "--h2c-listen=127.0.0.1:%d", port);
        snprintf(g->tcp_target, sizeof(g->tcp_target), "127.0.0.1:%d", port);
    }
    if (mg_config_load(&g->cfg, argc, argv, stdout, err, sizeof(err)) != MG_CONFIG_OK) {
        fprintf(stderr, "config: %s\n", err);
        return -1;
    }
    mg_log_set_level(level);
    if (mg_engine_new(&g->engine, &ec) != 0 || (g->base = event_base_new()) == NULL)
        return -1;
    {
        mg_gateway_parts parts = {.engine = g->engine};
        if (mg_gateway_new(&g->gw, g->base, &g->cfg, &parts) != 0)
            return -1;
    }
    mg_gateway_set_serving(g->gw);
    return pthread_create(&g->thread, NULL, mg_test_gw_main, g);
}

static inline void mg_test_gw_stop(mg_test_gw *g)
{
    event_base_loopbreak(g->base);
    pthread_join(g->thread, NULL);
    mg_engine_stop(g->engine);
    mg_gateway_del(g->gw);
    mg_engine_del(g->engine);
    event_base_loop(g->base, EVLOOP_NONBLOCK); /* deferred frees of closed connections */
    event_base_free(g->base);
    mg_config_free(&g->cfg);
    {
        char state[128];
        snprintf(state, sizeof(state), "%s/.moongate.agents", g->shm_dir);
        unlink(state);
    }
    rmdir(g->shm_dir);
}

#endif
