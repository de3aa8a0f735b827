/* mg_peerdir: the peer directory and the start of each request toward its peer
 * (moongate/peerdir.h). */
#include "moongate/peerdir.h"

#include "mg_addr.h"
#include "mg_log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL_IDLE 8 /* idle data connections kept per peer */

struct mg_peerdir {
    mg_peerdir_config cfg;
    mg_peerdir_batch_ops bops;
    mg_xfer_sched *sched;
    mg_list peers; /* mg_xfer_peer.link, newest first */
    size_t n;
    int closing;
};

static void release_waiting(mg_xfer_peer *p);
static void rdma_setup(mg_xfer_peer *p);
static void rref_release(mg_xfer_peer *p, struct mg_rconn_ref *ref);

static mg_batch_req *req_of(mg_xfer_req *x)
{
    return mg_container_of(x, mg_batch_req, x);
}

/* ---- the scheduler's callbacks ---- */

/* The request took a job slot. */
static void req_started(void *arg, mg_xfer_req *x)
{
    (void)arg;
    if (mg_req_start(&req_of(x)->life) == 0)
        mg_batch_req_started(req_of(x));
}

/* A job of head's goes to a worker, or came back: it holds the RDMA connection meanwhile. */
static void job_started(void *arg, mg_xfer_req *head)
{
    mg_batch_req *r = req_of(head);
    (void)arg;
    if (r->rdma)
        r->rref->users++;
}

static void job_ended(void *arg, mg_xfer_req *head)
{
    mg_batch_req *r = req_of(head);
    (void)arg;
    if (r->rdma)
        rref_release(r->peer, r->rref);
}

/* Back to its peer while a new session is opened (once per request). */
static void session_retry(mg_batch_req *r)
{
    mg_xfer_peer *p = r->peer;
    mg_req_requeue(&r->life, MG_REQUEUE_SESSION);
    mg_xfer_req_reset(&r->x);
    if (p->state == MG_PEER_OPEN && !memcmp(p->token, r->token, sizeof(r->token))) {
        mg_info("peer_session_refused", "peer=%s epoch=%016" PRIx64, p->addr, p->epoch);
        p->state = MG_PEER_NONE; /* that token is dead: every request needs a new one */
    }
    mg_list_push_back(&p->waiting, &r->wait);
    if (p->state == MG_PEER_OPEN) {
        release_waiting(p); /* someone already opened a new session */
    } else if (p->state != MG_PEER_OPENING) {
        p->state = MG_PEER_OPENING;
        p->dir->cfg.open_session(p->dir->cfg.arg, p);
    }
}

/* The request's last part ended: it ends, or (a token the peer no longer knows, a data plane
 * not where the session said: it may have restarted) asks its peer again, once. */
static void req_moved(void *arg, mg_xfer_req *x, int result, const char *why)
{
    mg_batch_req *r = req_of(x);
    char msg[600];
    (void)arg;
    if (result != 0) /* a mover that said nothing still names what failed */
        mg_batch_req_say(r, why && *why ? why : mg_strerror(result));
    if ((result == MG_ERR_AUTH || result == MG_ERR_UNAVAILABLE) &&
        !(r->life.requeued & MG_REQUEUE_SESSION) && mg_xfer_req_stopped(&r->x) == 0) {
        session_retry(r); /* a dead peer fails there, by name */
        return;
    }
    if (result == MG_ERR_NOT_FOUND && r->agent && !(r->life.requeued & MG_REQUEUE_TARGET) &&
        r->peer->dir->bops.agent_stale && mg_xfer_req_stopped(&r->x) == 0) {
        mg_peer_cache_forget(r->peer->dir->cfg.descs, r->peer->key, r->remote_segment, 0);
        mg_req_requeue(&r->life, MG_REQUEUE_TARGET);
        mg_xfer_req_reset(&r->x);
        r->peer->dir->bops.agent_stale(r->peer->dir->bops.arg, r); /* where it is now */
        return;
    }
    if (result == 0 && r->rdma && r->b->digest && r->peer->dir->bops.verify) {
        r->peer->dir->bops.verify(r->peer->dir->bops.arg, r); /* it ends r */
        return;
    }
    if (result && r->msg && strstr(r->msg, r->peer->addr) == NULL)
        snprintf(msg, sizeof(msg), "peer %s: %.500s", r->peer->addr, r->msg);
    else
        snprintf(msg, sizeof(msg), "%.500s", r->msg ? r->msg : "");
    mg_batch_req_end(r, result, result ? msg : NULL);
}

int mg_peerdir_new(mg_peerdir **out, const mg_peerdir_config *cfg)
{
    mg_peerdir *d;
    mg_xfer_sched_config sc = cfg->sched;
    int rc;
    *out = NULL;
    if (cfg->max_peers == 0 || cfg->open_session == NULL || cfg->connect_rdma == NULL)
        return MG_ERR_INVALID;
    d = calloc(1, sizeof(*d));
    if (d == NULL)
        return MG_ERR_NOMEM;
    d->cfg = *cfg;
    sc.arg = d;
    sc.started = req_started;
    sc.job_started = job_started;
    sc.job_ended = job_ended;
    sc.ended = req_moved;
    if ((rc = mg_xfer_sched_new(&d->sched, &sc)) != 0) {
        free(d);
        return rc;
    }
    mg_list_init(&d->peers);
    *out = d;
    return 0;
}

mg_xfer_sched *mg_peerdir_sched(const mg_peerdir *d)
{
    return d->sched;
}

void *mg_peerdir_arg(const mg_peerdir *d)
{
    return d->cfg.arg;
}

void mg_peerdir_set_batch_ops(mg_peerdir *d, const mg_peerdir_batch_ops *ops)
{
    d->bops = ops ? *ops : (mg_peerdir_batch_ops){0};
}

void mg_peerdir_close(mg_peerdir *d)
{
    d->closing = 1;
    mg_xfer_sched_close(d->sched);
}

int mg_peerdir_closed(const mg_peerdir *d)
{
    return d->closing;
}

static mg_xfer_peer *peer_of(const mg_list_node *n)
{
    return mg_container_of(n, mg_xfer_peer, link);
}

mg_xfer_peer *mg_peerdir_get(mg_peerdir *d, const char *addr, const char *tenant)
{
    mg_xfer_peer *p;
    mg_list_foreach (&d->peers, n) {
        p = peer_of(n);
        if (!strcmp(p->addr, addr) && !strcmp(p->tenant, tenant))
            return p;
    }
    if (d->n >= d->cfg.max_peers || (p = calloc(1, sizeof(*p) + d->cfg.front_bytes)) == NULL)
        return NULL;
    p->front = d->cfg.front_bytes ? p + 1 : NULL;
    snprintf(p->addr, sizeof(p->addr), "%s", addr);
    snprintf(p->tenant, sizeof(p->tenant), "%s", tenant);
    snprintf(p->key, sizeof(p->key), "%s@%s", tenant, addr);
    p->dir = d;
    if (addr[0] == '\0') { /* this daemon: copies on the workers, no session */
        p->state = MG_PEER_OPEN;
        p->expires_ms = UINT64_MAX;
    }
    mg_list_init(&p->waiting);
    mg_dp_pool_init(&p->idle, POOL_IDLE);
    mg_xfer_line_init(d->sched, &p->line, addr[0] != '\0');
    mg_list_push_front(&d->peers, &p->link);
    d->n++;
    return p;
}

mg_xfer_peer *mg_peerdir_first(const mg_peerdir *d)
{
    mg_list_node *n = d ? mg_list_first(&d->peers) : NULL;
    return n ? peer_of(n) : NULL;
}

mg_xfer_peer *mg_peerdir_next(const mg_peerdir *d, const mg_xfer_peer *p)
{
    return p->link.next != &d->peers ? peer_of(p->link.next) : NULL;
}

size_t mg_peerdir_queued(const mg_xfer_peer *p)
{
    size_t queued = mg_xfer_line_ready(&p->line);
    mg_list_foreach (&p->waiting, n)
        queued++;
    return queued;
}

/* ---- starting requests ---- */

static int rdma_wanted(const mg_xfer_peer *p)
{
    return p->dir->cfg.rdma != NULL && p->peer_rdma && p->addr[0] != '\0';
}

/* RDMA for r when the peer's queue pairs are ready, the local memory is registered with the
 * device and the peer described the target with a key (a remote lease: its own key). */
static void req_transport(mg_batch_req *r)
{
    mg_xfer_peer *p = r->peer;
    mg_remote_desc d;
    int known;
    r->rdma = 0;
    known = !r->local_copy && mg_peer_cache_get(p->dir->cfg.descs, p->key, r->remote_segment,
                                                r->remote_lease, &d, NULL) == 0;
    r->rdma_only = known && !(d.transports & (1u << MG_TRANSPORT_TCP));
    if (r->b->digest && p->dir->bops.verify == NULL) /* checked slice by slice: over TCP */
        return;
    if (p->rdma_state != MG_PEER_RDMA_READY || p->rref == NULL || !known ||
        !(d.transports & (1u << MG_TRANSPORT_RDMA)))
        return;
    for (unsigned k = 0; k < p->rref->n; k++) { /* connection k: our device k, the peer's k */
        if (mg_segment_rdma_lkey(r->local, (int)k, &r->lkeys[k]) != 0)
            return;
        if (k < d.rdma_nkeys)
            r->rkeys[k] = d.rdma_rkeys[k];
        else if (k == 0)
            r->rkeys[k] = d.rdma_rkey;
        else
            return;
    }
    r->rdma = 1;
    r->rref = p->rref;
    r->raddr = d.rdma_addr + r->remote_offset;
}

/* What the scheduler and the movers need of r: its ranges and how its jobs reach the peer. */
static void req_link(mg_batch_req *r)
{
    const mg_peerdir_config *cfg = &r->peer->dir->cfg;
    mg_xfer_req *x = &r->x;
    x->kind = r->local_copy ? MG_XFER_COPY : r->rdma ? MG_XFER_RDMA : MG_XFER_TCP;
    x->batch = r->b;
    x->write = r->write;
    x->local = r->local_addr;
    /* a client process's memory, GPU memory staged by its process: moved with its kind's ops */
    x->unmapped = r->local && (mg_segment_caps(r->local) & (MG_SEG_CAP_MAPPED | MG_SEG_CAP_TCP)) ==
                                  MG_SEG_CAP_TCP
                      ? r->local
                      : NULL;
    x->other = r->other_addr;
    x->length = r->length;
    x->lease = r->remote_lease;
    x->target = r->remote_segment;
    x->remote = r->rdma ? r->raddr : r->remote_offset;
    x->lkeys = r->lkeys;
    x->rkeys = r->rkeys;
    x->link = (mg_xfer_link){.stop = &x->stop,
                             .slice_bytes = (uint32_t)cfg->sched.slice_bytes,
                             .io_timeout_ms = cfg->io_timeout_ms,
                             .crc = cfg->crc || r->b->digest,
                             .peer = r->peer->addr,
                             .idle = &r->peer->idle,
                             .tcp = {cfg->congestion, cfg->send_buffer},
                             .token = r->token,
                             .host = r->data_host,
                             .port = r->data_port};
    if (r->rdma) {
        x->link.conns = r->rref->c;
        x->link.nconns = r->rref->n;
        x->link.lock = &r->peer->line.rdma_lock;
    }
}

/* The session is open: the request takes its details and joins the line for a job slot
 * (after the RDMA connection, while one is being set up). */
static void req_go(mg_batch_req *r)
{
    mg_xfer_peer *p = r->peer;
    if (!r->local_copy && rdma_wanted(p) &&
        (p->rdma_state == MG_PEER_RDMA_NONE || p->rdma_state == MG_PEER_RDMA_SETUP)) {
        mg_list_push_back(&p->waiting, &r->wait);
        if (p->rdma_state == MG_PEER_RDMA_NONE)
            rdma_setup(p);
        return;
    }
    req_transport(r);
    if ((r->rdma_only || (r->local && mg_segment_gpu(r->local))) && r->b->digest) {
        mg_batch_req_end(r, MG_ERR_UNSUPPORTED,
                         "a digest (SubmitRequest.digest) needs CRC32C of both ranges, and GPU "
                         "memory is not readable by the daemons");
        return;
    }
    if (!r->rdma && (r->rdma_only || (r->local && mg_segment_gpu(r->local)))) { /* never TCP */
        mg_batch_req_end(r, MG_ERR_STATE,
                         r->rdma_only ? "the target is GPU memory, which moves over RDMA only, "
                                        "and there is no RDMA connection to this peer for it "
                                        "(ListPeers says why)"
                                      : "the local memory is GPU memory, which moves over RDMA "
                                        "only, and there is no RDMA connection to this peer for "
                                        "it (ListPeers says why)");
        return;
    }
    memcpy(r->token, p->token, sizeof(r->token));
    snprintf(r->data_host, sizeof(r->data_host), "%s", p->data_host);
    r->data_port = p->data_port;
    req_link(r);
    mg_xfer_sched_add(&p->line, &r->x);
}

/* RDMA that failed to set up is tried again by a request after a backoff: 1 s, doubling to
 * 60 s (a peer that restarted may not have been ready, and GPU memory has no other path). */
static void rdma_retry(mg_xfer_peer *p, uint64_t now_ms)
{
    if (p->rdma_state != MG_PEER_RDMA_OFF || !rdma_wanted(p))
        return;
    if (p->rdma_retry_ms == 0) {
        p->rdma_backoff_ms = p->rdma_backoff_ms ? p->rdma_backoff_ms * 2 : 1000;
        if (p->rdma_backoff_ms > 60000)
            p->rdma_backoff_ms = 60000;
        p->rdma_retry_ms = now_ms + p->rdma_backoff_ms;
    } else if (now_ms >= p->rdma_retry_ms) {
        p->rdma_retry_ms = 0;
        p->rdma_state = MG_PEER_RDMA_NONE; /* this request sets it up again */
    }
}

void mg_peerdir_start(mg_batch_req *r, uint64_t now_ms)
{
    mg_xfer_peer *p = r->peer;
    rdma_retry(p, now_ms);
    if (p->state == MG_PEER_OPEN && now_ms < p->expires_ms) {
        req_go(r);
        return;
    }
    mg_list_push_back(&p->waiting, &r->wait);
    if (p->state != MG_PEER_OPENING) {
        p->state = MG_PEER_OPENING;
        p->dir->cfg.open_session(p->dir->cfg.arg, p);
    }
}

void mg_peerdir_request_ended(const mg_batch_req *r)
{
    mg_xfer_peer *p = r->peer;
    int err = r->err;
    if (err == MG_ERR_NOT_FOUND)
        mg_peer_cache_forget(p->dir->cfg.descs, p->key, r->remote_segment, r->remote_lease);
    p->ended[r->write != 0][err != 0]++;
    if (!err && r->rdma)
        p->rdma_bytes[r->write != 0] += r->length;
    else if (!err)
        p->bytes[r->write != 0] += r->length;
}

/* ---- sessions ---- */

/* The session opened or failed: start or fail the requests that waited for it. */
static void release_waiting(mg_xfer_peer *p)
{
    mg_list todo; /* requests that wait again (RDMA set-up) join p->waiting anew */
    mg_list_init(&todo);
    while (!mg_list_empty(&p->waiting)) {
        mg_list_node *node = mg_list_first(&p->waiting);
        mg_list_remove(node);
        mg_list_push_back(&todo, node);
    }
    while (!mg_list_empty(&todo)) {
        mg_batch_req *r = mg_container_of(mg_list_first(&todo), mg_batch_req, wait);
        mg_list_remove(&r->wait);
        if (p->state == MG_PEER_OPEN) {
            req_go(r);
        } else if ((r->life.requeued & MG_REQUEUE_SESSION) &&
                   r->msg) { /* both: why it asked again, and what then */
            char both[600];
            snprintf(both, sizeof(both), "%.180s; then a new session: %.200s", r->msg, p->err);
            mg_batch_req_end(r, p->err_code, both);
        } else {
            mg_batch_req_end(r, p->err_code, p->err);
        }
    }
}

void mg_peerdir_failed(mg_xfer_peer *p, int code, const char *why)
{
    p->state = MG_PEER_FAILED;
    p->err_code = code;
    snprintf(p->err, sizeof(p->err), "peer %.80s: %.160s", p->addr, why);
    mg_warn("peer_session_failed", "peer=%s error=\"%s\"", p->addr, p->err);
    release_waiting(p);
}

/* The data plane's own address when it listens on a wildcard: the host of the one we reached. */
static void data_endpoint(mg_xfer_peer *p, const mg_peer_session *s)
{
    if (s->data_host[0] == '\0' || !strcmp(s->data_host, "::") ||
        !strcmp(s->data_host, "0.0.0.0")) {
        int port;
        if (mg_split_host_port(s->via ? s->via : p->addr, p->data_host, sizeof(p->data_host),
                               &port) != 0)
            p->data_host[0] = '\0';
    } else {
        snprintf(p->data_host, sizeof(p->data_host), "%s", s->data_host);
    }
    p->data_port = s->data_port;
}

void mg_peerdir_opened(mg_xfer_peer *p, const mg_peer_session *s, uint64_t now_ms)
{
    const mg_peerdir_config *cfg = &p->dir->cfg;
    memcpy(p->token, s->token, MG_DF_TOKEN_BYTES);
    data_endpoint(p, s);
    if (p->epoch && p->epoch != s->epoch) { /* the peer restarted: old connections go */
        p->restarts_seen++;
        mg_dp_pool_clear(&p->idle);
        if (p->rref) { /* its queue pairs went with it */
            struct mg_rconn_ref *old = p->rref;
            p->rref = NULL;
            p->rdma_state = MG_PEER_RDMA_NONE;
            old->retired = 1;
            old->users++; /* released at once: deleted now if no job holds it */
            rref_release(p, old);
        }
    }
    p->peer_rdma = s->rdma;
    p->peer_rdma_devices = s->rdma_devices;
    if (p->rdma_state == MG_PEER_RDMA_OFF) { /* a new session: try again */
        p->rdma_state = MG_PEER_RDMA_NONE;
        p->rdma_retry_ms = 0;
    }
    if (cfg->rdma == NULL)
        snprintf(p->rdma_why, sizeof(p->rdma_why), "this daemon has no RDMA device: %.180s",
                 cfg->rdma_why ? cfg->rdma_why : "");
    else if (!s->rdma)
        snprintf(p->rdma_why, sizeof(p->rdma_why), "the peer has no RDMA device");
    p->epoch = s->epoch;
    mg_peer_cache_epoch(cfg->descs, p->key, s->epoch, now_ms);
    p->expires_ms =
        now_ms + (s->expires_in_ms > 60000 ? s->expires_in_ms - 30000 : s->expires_in_ms);
    p->state = MG_PEER_OPEN;
    mg_info("peer_session", "peer=%s data=%s:%d epoch=%016" PRIx64, p->addr, p->data_host,
            p->data_port, p->epoch);
    release_waiting(p);
}

/* ---- RDMA queue pairs ---- */

typedef struct rdma_setup_job {
    mg_xfer_peer *p;
    unsigned k, ndev;         /* the device being connected, of how many */
    struct mg_rconn_ref *ref; /* the connections made so far (the peer's once setup ends) */
    mg_rdma_conn *c;          /* device k's, being made */
    mg_rdma_ep local, remote;
    int connect; /* 0: create, 1: connect */
    int rc;
    char why[256];
} rdma_setup_job;

static int conn_del_work(void *arg)
{
    struct mg_rconn_ref *ref = arg;
    for (unsigned i = 0; i < ref->n; i++) {
        mg_rdma_conn_del(ref->c[i]);
        ref->c[i] = NULL;
    }
    return 0;
}

static void conn_del_done(void *arg, int result)
{
    struct mg_rconn_ref *ref = arg;
    (void)result;
    for (unsigned i = 0; i < ref->n; i++) /* the engine stopped first */
        mg_rdma_conn_del(ref->c[i]);
    free(ref);
}

static int ref_broken(const struct mg_rconn_ref *ref)
{
    for (unsigned i = 0; i < ref->n; i++) {
        if (mg_rdma_conn_broken(ref->c[i]))
            return 1;
    }
    return 0;
}

/* A job using ref ended: a broken connection is retired; a retired one with no job left goes. */
static void rref_release(mg_xfer_peer *p, struct mg_rconn_ref *ref)
{
    const mg_peerdir_config *cfg = &p->dir->cfg;
    ref->users--;
    if (!ref->retired && ref_broken(ref)) {
        ref->retired = 1;
        if (p->rref == ref) {
            p->rref = NULL;
            p->rdma_state = MG_PEER_RDMA_NONE; /* the next request sets up a new one */
            mg_info("rdma_conn_retired", "peer=%s", p->addr);
        }
    }
    if (ref->retired && ref->users == 0 &&
        mg_engine_submit(cfg->engine, cfg->cq, conn_del_work, conn_del_done, ref) != 0)
        conn_del_done(ref, 0);
}

/* Connections no request holds go (deleted on a worker). */
static void ref_drop(mg_xfer_peer *p, struct mg_rconn_ref *ref)
{
    ref->retired = 1;
    ref->users++;
    rref_release(p, ref);
}

static void rdma_off(mg_xfer_peer *p, const char *why)
{
    p->rdma_state = MG_PEER_RDMA_OFF;
    snprintf(p->rdma_why, sizeof(p->rdma_why), "RDMA setup failed: %.200s", why);
    mg_warn("rdma_setup_failed", "peer=%s error=\"%s\" transport=tcp", p->addr, why);
    release_waiting(p);
}

static int rdma_setup_work(void *arg)
{
    rdma_setup_job *j = arg;
    if (!j->connect)
        return j->rc = mg_rdma_conn_new(j->p->dir->cfg.rdma, (int)j->k, j->p->rdma_qps, &j->c,
                                        &j->local, j->why, sizeof(j->why));
    return j->rc = mg_rdma_conn_connect(j->c, &j->remote, j->why, sizeof(j->why));
}

static void rdma_setup_done(void *arg, int result);

static void rdma_job_drop(rdma_setup_job *j)
{
    if (j->c) { /* a connection not finished: deleted on a worker */
        struct mg_rconn_ref *ref = calloc(1, sizeof(*ref));
        if (ref) {
            ref->c[ref->n++] = j->c;
            ref_drop(j->p, ref);
        } else {
            mg_rdma_conn_del(j->c);
        }
    }
    if (j->ref)
        ref_drop(j->p, j->ref);
    free(j);
}

/* Setup ends: with the connections made so far (a later device that fails leaves fewer), or,
 * with none, TCP until the next session. */
static void rdma_setup_end(rdma_setup_job *j, const char *why)
{
    mg_xfer_peer *p = j->p;
    struct mg_rconn_ref *ref = j->ref;
    if (ref == NULL || ref->n == 0) {
        rdma_off(p, why ? why : "no device connected");
        rdma_job_drop(j);
        return;
    }
    if (why)
        mg_warn("rdma_device_skipped", "peer=%s device=%u error=\"%s\" devices=%u", p->addr, j->k,
                why, ref->n);
    j->ref = NULL;
    p->rref = ref;
    p->rdma_state = MG_PEER_RDMA_READY;
    p->rdma_why[0] = '\0';
    p->rdma_backoff_ms = 0;
    mg_info("rdma_ready", "peer=%s devices=%u qps=%u mtu=%u", p->addr, ref->n, j->local.nqps,
            j->remote.mtu < j->local.mtu ? j->remote.mtu : j->local.mtu);
    rdma_job_drop(j);
    release_waiting(p);
}

/* The next step of j on a worker: create device k's queue pairs, or connect them. */
static void rdma_step(rdma_setup_job *j)
{
    const mg_peerdir_config *cfg = &j->p->dir->cfg;
    if (mg_engine_submit(cfg->engine, cfg->cq, rdma_setup_work, rdma_setup_done, j) != 0)
        rdma_setup_end(j, "the engine's queue is full (--queue-depth)");
}

void mg_peerdir_rdma_answered(void *job, const mg_rdma_ep *remote, const char *why,
                              int session_gone)
{
    rdma_setup_job *j = job;
    mg_xfer_peer *p = j->p;
    if (p->dir->closing) {
        rdma_job_drop(j);
        return;
    }
    if (remote == NULL && session_gone) { /* the peer restarted under us: a new session */
        mg_info("peer_session_refused", "peer=%s epoch=%016" PRIx64 " during=rdma_setup", p->addr,
                p->epoch);
        rdma_job_drop(j);
        p->rdma_state = MG_PEER_RDMA_NONE;
        if (p->state == MG_PEER_OPEN)
            p->state = MG_PEER_NONE; /* that token is dead */
        if (!mg_list_empty(&p->waiting) && p->state != MG_PEER_OPENING) {
            p->state = MG_PEER_OPENING; /* the requests waiting go on in it */
            p->dir->cfg.open_session(p->dir->cfg.arg, p);
        }
        return;
    }
    if (remote == NULL) {
        rdma_setup_end(j, why);
        return;
    }
    j->remote = *remote;
    j->connect = 1;
    rdma_step(j);
}

static void rdma_setup_done(void *arg, int result)
{
    rdma_setup_job *j = arg;
    mg_xfer_peer *p = j->p;
    const mg_peerdir_config *cfg = &p->dir->cfg;
    char why[256];
    if (p->dir->closing) {
        rdma_job_drop(j);
        return;
    }
    if (result != 0) {
        rdma_setup_end(j, j->rc ? j->why : "the daemon is stopping");
        return;
    }
    if (!j->connect) { /* our queue pairs exist: the peer's answer brings its own */
        if (cfg->connect_rdma(cfg->arg, p, j->k, &j->local, j, why, sizeof(why)) != 0)
            rdma_setup_end(j, why);
        return;
    }
    j->ref->c[j->ref->n++] = j->c; /* device k connected */
    j->c = NULL;
    if (++j->k >= j->ndev) {
        rdma_setup_end(j, NULL);
        return;
    }
    j->connect = 0; /* the next device */
    rdma_step(j);
}

static void rdma_setup(mg_xfer_peer *p)
{
    const mg_peerdir_config *cfg = &p->dir->cfg;
    rdma_setup_job *j = calloc(1, sizeof(*j));
    unsigned ours = (unsigned)mg_rdma_device_count(cfg->rdma);
    unsigned theirs = p->peer_rdma_devices ? p->peer_rdma_devices : 1;
    p->rdma_state = MG_PEER_RDMA_SETUP;
    p->rdma_qps = cfg->rdma_qps;
    if (j == NULL || (j->ref = calloc(1, sizeof(*j->ref))) == NULL) {
        free(j);
        rdma_off(p, "out of memory");
        return;
    }
    j->p = p;
    j->ndev = ours < theirs ? ours : theirs; /* device k with the peer's device k */
    if (j->ndev > MG_RDMA_MAX_DEVICES)
        j->ndev = MG_RDMA_MAX_DEVICES;
    if (mg_engine_submit(cfg->engine, cfg->cq, rdma_setup_work, rdma_setup_done, j) != 0) {
        free(j->ref);
        free(j);
        rdma_off(p, "the engine's queue is full (--queue-depth)");
    }
}

void mg_peerdir_del(mg_peerdir *d)
{
    if (d == NULL)
        return;
    while (!mg_list_empty(&d->peers)) {
        mg_xfer_peer *p = peer_of(mg_list_first(&d->peers));
        mg_list_remove(&p->link);
        if (p->rref) /* the workers have stopped: teardown here */
            conn_del_done(p->rref, 0);
        mg_dp_pool_free(&p->idle);
        mg_xfer_line_del(&p->line);
        free(p);
    }
    mg_xfer_sched_del(d->sched);
    free(d);
}
