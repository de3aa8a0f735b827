/*
 * mg_client_keep: a client of mg_client_open outlives its daemon (mg_client.h: "Outliving the
 * daemon"). One table, in the order things were made: the agents the client registered and the
 * segments it registered. Each row knows how it is made again, or that it cannot be; a call on
 * a broken connection reconnects first (within MOONGATE_RECONNECT_S, with a back-off up to
 * MOONGATE_RECONNECT_BACKOFF_MS) and replays the table. Everything runs on the caller's thread,
 * inside its call: a blocking client has no other.
 */
#include "mg_client_int.h"

#include "moongate/v1/agent.pb-c.h"
#include "moongate/v1/daemon.pb-c.h"
#include "moongate/v1/memory.pb-c.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define AGENT_PATH  "/moongate.v1.Agent/"
#define MEMORY_PATH "/moongate.v1.Memory/"

typedef enum { ROW_AGENT, ROW_SEGMENT, ROW_LOST } row_kind;

typedef struct keep_row {
    row_kind kind;
    char name[160]; /* the agent's or the segment's */
    uint64_t id;    /* a segment: the id the program was handed */
    uint64_t now;   /* its id on the daemon now */
    uint8_t *req;   /* the request that makes it again (agents, process memory), or NULL */
    size_t req_len;
    mgc_redo_fn redo; /* or this */
    void (*drop)(void *arg);
    void *arg;
    int per_connection; /* ends with the connection (agents, GPU memory), not only a restart */
    struct keep_row *next;
} keep_row;

struct mg_keep {
    uint64_t bound_ms, backoff_ms;
    uint64_t epoch; /* the daemon's, when last seen; 0: not asked yet */
    unsigned restarts;
    long owner; /* the uid owning the daemon's socket file when opened; -1: not a socket */
    int restoring, gave_up;
    int fatal; /* the daemon back refuses this client: not tried again */
    char gone[600];
    keep_row *rows, **tail;
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static uint64_t env_ms(const char *name, uint64_t dflt, double scale, char *err, size_t errcap)
{
    const char *v = getenv(name);
    char *end;
    double d;
    if (v == NULL || *v == '\0')
        return dflt;
    errno = 0;
    d = strtod(v, &end);
    if (errno != 0 || *end != '\0' || d < 0 || d > 1e9) {
        snprintf(err, errcap, "%s=\"%.40s\" is not a number: %g used", name, v,
                 (double)dflt / scale);
        return dflt;
    }
    return (uint64_t)(d * scale);
}

int mg_client_reconnect_env(uint64_t *bound_ms, uint64_t *backoff_ms, char *err, size_t errcap)
{
    err[0] = '\0';
    *bound_ms = env_ms("MOONGATE_RECONNECT_S", 30000, 1000, err, errcap);
    *backoff_ms = env_ms("MOONGATE_RECONNECT_BACKOFF_MS", 1000, 1, err, errcap);
    if (*backoff_ms < 10)
        *backoff_ms = 10;
    return err[0] ? -1 : 0;
}

long mg_client_socket_owner(const char *target)
{
    struct stat st;
    return strncmp(target, "unix:", 5) == 0 && stat(target + 5, &st) == 0 ? (long)st.st_uid : -1;
}

mg_keep *mgc_keep_new(mg_client *c)
{
    mg_keep *k = calloc(1, sizeof(*k));
    char err[160];
    if (k == NULL)
        return NULL;
    if (mg_client_reconnect_env(&k->bound_ms, &k->backoff_ms, err, sizeof(err)) != 0)
        fprintf(stderr, "moongate client: %s\n", err);
    k->owner = mg_client_socket_owner(mg_client_target(c));
    k->tail = &k->rows;
    return k;
}

static void row_free(keep_row *r)
{
    if (r->drop)
        r->drop(r->arg);
    free(r->req);
    free(r);
}

void mgc_keep_free(mg_keep *k)
{
    if (k == NULL)
        return;
    while (k->rows) {
        keep_row *r = k->rows;
        k->rows = r->next;
        row_free(r);
    }
    free(k);
}

int mgc_keep_refused(const mg_keep *k)
{
    return k->fatal;
}

/* ---- the table ---- */

static keep_row *row_add(mg_keep *k, row_kind kind, const char *name)
{
    keep_row *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL; /* then it does not come back: nothing else is lost */
    r->kind = kind;
    snprintf(r->name, sizeof(r->name), "%s", name ? name : "");
    *k->tail = r;
    k->tail = &r->next;
    return r;
}

static void row_remove(mg_keep *k, keep_row *r)
{
    keep_row **p = &k->rows;
    while (*p != r)
        p = &(*p)->next;
    *p = r->next;
    if (k->tail == &r->next)
        k->tail = p;
    row_free(r);
}

static keep_row *segment_row(mg_keep *k, uint64_t id)
{
    for (keep_row *r = k->rows; r; r = r->next)
        if (r->kind != ROW_AGENT && (r->id == id || r->now == id))
            return r;
    return NULL;
}

static int keep_request(keep_row *r, const uint8_t *req, size_t len)
{
    if ((r->req = malloc(len ? len : 1)) == NULL)
        return -1;
    memcpy(r->req, req, len);
    r->req_len = len;
    return 0;
}

/* The daemon's epoch (Daemon/Info), on c. Returns a gRPC status, err set. */
static int daemon_epoch(mg_client *c, uint64_t timeout_ms, uint64_t *epoch, char *err, size_t cap)
{
    Moongate__V1__InfoRequest q = MOONGATE__V1__INFO_REQUEST__INIT;
    Moongate__V1__InfoResponse *info;
    int st;
    info = mg_client_call_msg(c, "/moongate.v1.Daemon/Info", &q.base,
                              &moongate__v1__info_response__descriptor, timeout_ms, &st, err, cap);
    if (info == NULL)
        return st;
    *epoch = info->epoch;
    moongate__v1__info_response__free_unpacked(info, NULL);
    return MG_GRPC_OK;
}

static void agent_called(mg_keep *k, const char *method, const uint8_t *req, size_t req_len,
                         const uint8_t *resp, size_t resp_len)
{
    if (strcmp(method, "RegisterAgent") == 0) {
        Moongate__V1__RegisterAgentRequest *q =
            moongate__v1__register_agent_request__unpack(NULL, req_len, req);
        Moongate__V1__AgentInfo *a = moongate__v1__agent_info__unpack(NULL, resp_len, resp);
        keep_row *r = q && a ? row_add(k, ROW_AGENT, q->name) : NULL;
        if (r) { /* made again with the port it has now: the daemon holds it meanwhile */
            size_t n;
            r->per_connection = 1;
            q->port = a->port;
            n = moongate__v1__register_agent_request__get_packed_size(q);
            if ((r->req = malloc(n ? n : 1)) != NULL)
                r->req_len = moongate__v1__register_agent_request__pack(q, r->req);
        }
        moongate__v1__register_agent_request__free_unpacked(q, NULL);
        moongate__v1__agent_info__free_unpacked(a, NULL);
    } else if (strcmp(method, "UnregisterAgent") == 0) {
        Moongate__V1__UnregisterAgentRequest *q =
            moongate__v1__unregister_agent_request__unpack(NULL, req_len, req);
        for (keep_row *r = k->rows; q && r; r = r->next)
            if (r->kind == ROW_AGENT && strcmp(r->name, q->name) == 0) {
                row_remove(k, r);
                break;
            }
        moongate__v1__unregister_agent_request__free_unpacked(q, NULL);
    }
}

static void memory_called(mg_keep *k, const char *method, const uint8_t *req, size_t req_len,
                          const uint8_t *resp, size_t resp_len)
{
    if (strcmp(method, "RegisterSegment") == 0) {
        Moongate__V1__RegisterRequest *q =
            moongate__v1__register_request__unpack(NULL, req_len, req);
        Moongate__V1__RegisterResponse *a =
            moongate__v1__register_response__unpack(NULL, resp_len, resp);
        keep_row *r = q && a && a->segment ? row_add(k, ROW_SEGMENT, q->name) : NULL;
        if (r) {
            r->id = r->now = a->segment->id;
            /* memory of this process named by its address alone (process memory) is
             * registered again as it was; a descriptor passed (a handle) is good once, and the
             * daemon's own files are gone: those need their maker's mgc_keep_redo() */
            if (q->client_address != 0 && q->fd_handle == 0 && q->shm_file[0] == '\0')
                keep_request(r, req, req_len);
        }
        moongate__v1__register_request__free_unpacked(q, NULL);
        moongate__v1__register_response__free_unpacked(a, NULL);
    } else if (strcmp(method, "UnregisterSegment") == 0) {
        Moongate__V1__UnregisterRequest *q =
            moongate__v1__unregister_request__unpack(NULL, req_len, req);
        keep_row *r = q ? segment_row(k, q->id) : NULL;
        if (r)
            row_remove(k, r);
        moongate__v1__unregister_request__free_unpacked(q, NULL);
    }
}

void mgc_keep_called(mg_client *c, const char *path, const uint8_t *req, size_t req_len,
                     const uint8_t *resp, size_t resp_len)
{
    mg_keep *k = mgc_keep_of(c);
    char err[200];
    if (k->restoring)
        return; /* the table's own calls */
    if (strncmp(path, AGENT_PATH, strlen(AGENT_PATH)) == 0)
        agent_called(k, path + strlen(AGENT_PATH), req, req_len, resp, resp_len);
    else if (strncmp(path, MEMORY_PATH, strlen(MEMORY_PATH)) == 0)
        memory_called(k, path + strlen(MEMORY_PATH), req, req_len, resp, resp_len);
    else
        return;
    if (k->epoch == 0 && k->rows) { /* the epoch they were made in, to tell a restart by */
        k->restoring = 1;
        daemon_epoch(c, 5000, &k->epoch, err, sizeof(err));
        k->restoring = 0;
    }
}

void mgc_keep_redo(mg_client *c, uint64_t id, mgc_redo_fn redo, void (*drop)(void *arg), void *arg,
                   int per_connection)
{
    mg_keep *k = mgc_keep_of(c);
    keep_row *r = k ? segment_row(k, id) : NULL;
    if (r == NULL || r->kind != ROW_SEGMENT) {
        if (drop)
            drop(arg);
        return;
    }
    r->redo = redo;
    r->drop = drop;
    r->arg = arg;
    r->per_connection = per_connection;
}

uint64_t mg_client_segment_now(mg_client *c, uint64_t id)
{
    mg_keep *k = mgc_keep_of(c);
    keep_row *r;
    char msg[600];
    int st;
    if (k && !k->restoring) /* after a restart, what came back first: ids are mapped then */
        mgc_ready(c, &st, msg, sizeof(msg));
    r = k ? segment_row(k, id) : NULL;
    return r == NULL ? id : r->kind == ROW_LOST ? 0 : r->now;
}

int mgc_keep_forget(mg_client *c, uint64_t id)
{
    mg_keep *k = mgc_keep_of(c);
    keep_row *r = k ? segment_row(k, id) : NULL;
    if (r == NULL || r->kind != ROW_LOST)
        return 0;
    row_remove(k, r);
    return 1;
}

uint64_t mg_client_epoch(const mg_client *c)
{
    mg_keep *k = mgc_keep_of(c);
    return k ? k->epoch : 0;
}

unsigned mg_client_restarts(const mg_client *c)
{
    mg_keep *k = mgc_keep_of(c);
    return k ? k->restarts : 0;
}

/* ---- making it again ---- */

static int redo_request(mg_client *c, keep_row *r, char *err, size_t errcap)
{
    int st;
    if (r->kind == ROW_AGENT) {
        Moongate__V1__RegisterAgentRequest *q =
            moongate__v1__register_agent_request__unpack(NULL, r->req_len, r->req);
        Moongate__V1__AgentInfo *a =
            q ? mg_client_call_msg(c, AGENT_PATH "RegisterAgent", &q->base,
                                   &moongate__v1__agent_info__descriptor, 10000, &st, err, errcap)
              : NULL;
        moongate__v1__register_agent_request__free_unpacked(q, NULL);
        if (a == NULL)
            return -1;
        moongate__v1__agent_info__free_unpacked(a, NULL);
        return 0;
    } else {
        Moongate__V1__RegisterRequest *q =
            moongate__v1__register_request__unpack(NULL, r->req_len, r->req);
        Moongate__V1__RegisterResponse *a =
            q ? mg_client_call_msg(c, MEMORY_PATH "RegisterSegment", &q->base,
                                   &moongate__v1__register_response__descriptor, 30000, &st, err,
                                   errcap)
              : NULL;
        moongate__v1__register_request__free_unpacked(q, NULL);
        if (a == NULL || a->segment == NULL) {
            if (a)
                snprintf(err, errcap, "the daemon's answer holds no segment");
            moongate__v1__register_response__free_unpacked(a, NULL);
            return -1;
        }
        r->now = a->segment->id;
        moongate__v1__register_response__free_unpacked(a, NULL);
        return 0;
    }
}

/* Makes every row again, in order; a row that cannot come back is lost (its id says so). The
 * same daemon (a connection broken, not a restart) still has most segments: only what ended with
 * the connection (agents, GPU memory) is made again. */
static void replay(mg_client *c, mg_keep *k, int restarted)
{
    char err[300];
    for (keep_row *r = k->rows; r; r = r->next) {
        int rc;
        if (r->kind == ROW_LOST || (!restarted && !r->per_connection))
            continue;
        err[0] = '\0';
        if (r->redo)
            rc = r->redo(c, r->arg, &r->now, err, sizeof(err));
        else if (r->req)
            rc = redo_request(c, r, err, sizeof(err));
        else
            rc = -1; /* the daemon's own (ANON, SHM) or a descriptor the library does not keep */
        if (rc == 0)
            continue;
        if (err[0])
            fprintf(stderr, "moongate client: %s %s did not come back: %s\n",
                    r->kind == ROW_AGENT ? "agent" : "segment", r->name, err);
        if (r->drop)
            r->drop(r->arg);
        r->drop = NULL;
        r->redo = NULL;
        free(r->req);
        r->req = NULL;
        r->kind = ROW_LOST;
    }
}

/* Connects again until the daemon answers, within the bound. Returns 0 with *epoch, else -1
 * with *status and msg. */
static int reconnect(mg_client *c, mg_keep *k, uint64_t *epoch, int *status, char *msg, size_t cap)
{
    uint64_t t0 = mono_ms(), deadline = t0 + (k->gave_up ? 0 : k->bound_ms), wait = 50;
    char err[400] = "";
    for (;;) {
        uint64_t now = mono_ms(), left = deadline > now ? deadline - now : 0;
        long owner = mg_client_socket_owner(mg_client_target(c));
        if (k->owner >= 0 && owner >= 0 && owner != k->owner) { /* before the token goes there */
            k->fatal = 1;
            snprintf(k->gone, sizeof(k->gone),
                     "the daemon came back as another user's (its socket %s belongs to uid %ld "
                     "now, not %ld): refused",
                     mg_client_target(c) + 5, owner, k->owner);
            break;
        }
        if (mgc_reconnect(c, err, sizeof(err)) == 0) {
            int st =
                daemon_epoch(c, left < 1000 ? (left ? left : 1000) : 1000, epoch, err, sizeof(err));
            if (st == MG_GRPC_OK)
                return 0;
            if (st == MG_GRPC_UNAUTHENTICATED || st == MG_GRPC_PERMISSION_DENIED) {
                k->fatal = 1;
                snprintf(k->gone, sizeof(k->gone),
                         "the daemon came back and refuses this client's credentials: %s", err);
                break;
            }
        }
        now = mono_ms();
        if (now >= deadline) {
            k->gave_up = 1;
            *status = MG_GRPC_UNAVAILABLE;
            snprintf(msg, cap, "the daemon did not come back within MOONGATE_RECONNECT_S=%g s (%s)",
                     (double)k->bound_ms / 1000, err);
            return -1;
        }
        sleep_ms(wait < deadline - now ? wait : deadline - now);
        wait = wait * 2 < k->backoff_ms ? wait * 2 : k->backoff_ms;
    }
    *status = MG_GRPC_UNAVAILABLE;
    snprintf(msg, cap, "%s", k->gone);
    return -1;
}

int mgc_keep_restore(mg_client *c, int *status, char *msg, size_t cap)
{
    mg_keep *k = mgc_keep_of(c);
    uint64_t epoch = 0;
    int rc;
    if (k->restoring)
        return 0; /* the table's own calls meet the broken connection themselves */
    if (k->fatal) {
        *status = MG_GRPC_UNAVAILABLE;
        snprintf(msg, cap, "%s", k->gone);
        return -1;
    }
    if (k->bound_ms == 0) {
        *status = MG_GRPC_UNAVAILABLE;
        snprintf(msg, cap, "%s (MOONGATE_RECONNECT_S=0: this client does not reconnect)",
                 mgc_fail_msg(c));
        return -1;
    }
    k->restoring = 1;
    rc = reconnect(c, k, &epoch, status, msg, cap);
    if (rc == 0) {
        replay(c, k, epoch != k->epoch);
        k->restarts += k->epoch != 0 && epoch != k->epoch;
        k->epoch = epoch;
        k->gave_up = 0;
    }
    k->restoring = 0;
    return rc;
}
