/*
 * mg_reload: --auth-file and the TLS files (certificate, key, --peer-ca, --client-ca), read at
 * start-up and re-read when they change.
 *
 * Every --reload-interval seconds the loop hands one job to a worker: it stats the files and,
 * for those whose identity (device, inode, size, mtime, ctime) moved, reads and parses them
 * into a new auth table or a new SSL_CTX. The loop then swaps the new one in; connections made
 * before keep the context they started with (OpenSSL counts its references). Kubernetes
 * replaces a mounted Secret by switching a symlink, which stat() follows: the swap is seen as a
 * change of inode. A file that fails to load leaves the old table or context in place, logged
 * once per change, and counted in moongate_reload_errors_total.
 */
#include "mg_server_int.h"

#include "mg_auth.h"
#include "mg_log.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define AUTH_FILE_MAX (16u << 20)

enum { F_AUTH, F_CERT, F_KEY, F_PEER_CA, F_CLIENT_CA, F_N };

typedef struct fingerprint {
    int exists;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
} fingerprint;

struct mg_reload {
    mg_gateway *gw;
    struct event *timer;
    int busy;
    fingerprint seen[F_N];
    /* the job's results, handed over to the loop */
    fingerprint now[F_N];
    int auth_changed, tls_changed;
    mg_auth *new_auth;
    void *new_ctx;
    char auth_err[320];
};

static void stat_file(const char *path, fingerprint *fp)
{
    struct stat st;
    memset(fp, 0, sizeof(*fp));
    if (path == NULL || path[0] == '\0' || stat(path, &st) != 0)
        return;
    fp->exists = 1;
    fp->dev = st.st_dev;
    fp->ino = st.st_ino;
    fp->size = st.st_size;
    fp->mtime = st.st_mtim;
    fp->ctime = st.st_ctim;
}

static int fp_same(const fingerprint *a, const fingerprint *b)
{
    return a->exists == b->exists && a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec &&
           a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec;
}

/* Reads and parses the auth file. Returns the table, or NULL with err set. */
static mg_auth *load_auth(const char *path, char *err, size_t errcap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    char *buf = NULL, why[256];
    size_t got = 0;
    mg_auth *a = NULL;
    if (fd < 0) {
        snprintf(err, errcap, "cannot open: %s", strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > AUTH_FILE_MAX) {
        snprintf(err, errcap, "not a regular file of at most %u bytes", AUTH_FILE_MAX);
        goto out;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (buf == NULL) {
        snprintf(err, errcap, "out of memory");
        goto out;
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            snprintf(err, errcap, "cannot read: %s", n < 0 ? strerror(errno) : "file shrank");
            goto out;
        }
        got += (size_t)n;
    }
    a = mg_auth_parse(buf, got, why, sizeof(why));
    if (a == NULL)
        snprintf(err, errcap, "%s", why);
out:
    if (buf) {
        memset(buf, 0, got); /* token hashes only, but keep the habit */
        free(buf);
    }
    close(fd);
    return a;
}

static void tls_paths(const mg_config *cfg, const char *p[F_N])
{
    p[F_AUTH] = cfg->auth_file;
    p[F_CERT] = cfg->tls_cert;
    p[F_KEY] = cfg->tls_key;
    p[F_PEER_CA] = cfg->peer_ca;
    p[F_CLIENT_CA] = cfg->client_ca;
}

/* Worker: what changed, loaded. */
static int check_work(void *arg)
{
    struct mg_reload *r = arg;
    const mg_config *cfg = r->gw->cfg;
    const char *p[F_N];
    tls_paths(cfg, p);
    for (int i = 0; i < F_N; i++)
        stat_file(p[i], &r->now[i]);
    r->auth_changed = cfg->auth_file[0] && !fp_same(&r->now[F_AUTH], &r->seen[F_AUTH]);
    r->tls_changed = 0;
    for (int i = F_CERT; i < F_N && cfg->tls_cert[0]; i++)
        if (!fp_same(&r->now[i], &r->seen[i]))
            r->tls_changed = 1;
    if (r->auth_changed)
        r->new_auth = load_auth(cfg->auth_file, r->auth_err, sizeof(r->auth_err));
    if (r->tls_changed)
        r->new_ctx = mg_tls_server_ctx(cfg->tls_cert, cfg->tls_key, cfg->peer_ca, cfg->client_ca);
    return 0;
}

static void arm(struct mg_reload *r)
{
    struct timeval tv = {(time_t)r->gw->cfg->reload_interval, 0};
    if (r->gw->cfg->reload_interval > 0)
        evtimer_add(r->timer, &tv);
}

/* Loop: swap in what loaded. */
static void check_done(void *arg, int result)
{
    struct mg_reload *r = arg;
    mg_gateway *gw = r->gw;
    (void)result;
    r->busy = 0;
    if (r->auth_changed) {
        r->seen[F_AUTH] = r->now[F_AUTH];
        if (r->new_auth) {
            mg_auth_free(gw->core->auth);
            gw->core->auth = r->new_auth;
            gw->core->stats.reloads[0]++;
            mg_info("auth_reloaded", "file=%s principals=%zu", gw->cfg->auth_file,
                    mg_auth_count(gw->core->auth));
        } else {
            gw->core->stats.reload_errors[0]++;
            mg_error("auth_reload_failed", "file=%s reason=\"%s\" keeping=\"the previous table\"",
                     gw->cfg->auth_file, r->auth_err);
        }
    }
    if (r->tls_changed) {
        for (int i = F_CERT; i < F_N; i++)
            r->seen[i] = r->now[i];
        if (r->new_ctx) {
            mg_tls_ctx_free(gw->core->ssl_ctx);
            gw->core->ssl_ctx = r->new_ctx;
            gw->core->stats.reloads[1]++;
            mg_info("tls_reloaded", "cert=%s", gw->cfg->tls_cert);
        } else {
            gw->core->stats.reload_errors[1]++;
            mg_error("tls_reload_failed", "cert=%s keeping=\"the previous certificate\"",
                     gw->cfg->tls_cert);
        }
    }
    r->new_auth = NULL;
    r->new_ctx = NULL;
    if (gw->state != MG_STATE_DRAINING)
        arm(r);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct mg_reload *r = arg;
    (void)fd;
    (void)what;
    if (r->busy)
        return;
    if (mg_engine_submit(r->gw->engine, r->gw->cq, check_work, check_done, r) == 0)
        r->busy = 1;
    else
        arm(r); /* the queue is full: next time */
}

int mg_reload_start(mg_gateway *gw)
{
    const mg_config *cfg = gw->cfg;
    struct mg_reload *r = calloc(1, sizeof(*r));
    const char *p[F_N];
    char err[320];
    if (r == NULL)
        return MG_ERR_NOMEM;
    r->gw = gw;
    gw->core->reload = r;
    tls_paths(cfg, p);
    /* What start-up reads is what later checks compare with. */
    for (int i = 0; i < F_N; i++)
        stat_file(p[i], &r->seen[i]);
    if (cfg->auth_file[0]) {
        gw->core->auth = load_auth(cfg->auth_file, err, sizeof(err));
        if (gw->core->auth == NULL) {
            mg_error("auth_file", "file=%s reason=\"%s\"", cfg->auth_file, err);
            return MG_ERR_INVALID;
        }
        mg_info("auth_loaded", "file=%s principals=%zu", cfg->auth_file,
                mg_auth_count(gw->core->auth));
    }
    if (!cfg->auth_file[0] && !cfg->client_ca[0] && !cfg->allow_anonymous)
        mg_warn("auth_none", "note=\"no --auth-file, --client-ca or --allow-anonymous: only "
                             "health checks, reflection and peer daemons can call\"");
    if (cfg->client_ca[0] && cfg->peer_ca[0] && strcmp(cfg->client_ca, cfg->peer_ca) == 0)
        mg_warn("auth_same_ca", "note=\"--client-ca and --peer-ca are the same file: every "
                                "client certificate is also a peer certificate\"");
    r->timer = evtimer_new(gw->base, timer_cb, r);
    if (r->timer == NULL)
        return MG_ERR_NOMEM;
    arm(r);
    return 0;
}

void mg_reload_free(mg_gateway *gw)
{
    struct mg_reload *r = gw->core->reload;
    if (r == NULL)
        return;
    /* A check still on a worker came back through mg_cq_settle before this runs. */
    if (r->timer)
        event_free(r->timer);
    mg_auth_free(r->new_auth);
    mg_tls_ctx_free(r->new_ctx);
    free(r);
    gw->core->reload = NULL;
    mg_auth_free(gw->core->auth);
    gw->core->auth = NULL;
}
