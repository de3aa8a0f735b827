/*
 * Mooncake's C API (transfer_engine_c.h) on moongate: engines, segments, batches, notifications.
 * Memory registration is in te_memory.c.
 */
#include "te_internal.h"

#include "mg_addr.h"

#include "moongate/v1/agent.pb-c.h"
#include "moongate/v1/notify.pb-c.h"
#include "moongate/v1/transfer.pb-c.h"

#include <jansson.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TE_TIMEOUT_MS             30000
#define ERR_INVALID_ARGUMENT      (-1)
#define ERR_TOO_MANY_REQUESTS     (-2)
#define ERR_SOCKET                (-102)
#define ERR_REJECT_HANDSHAKE      (-104)
#define ERR_ENDPOINT              (-201)
#define ERR_MEMORY                (-302)
#define ST_INVALID_ARGUMENT       1
#define ST_TOO_MANY_REQUESTS      2
#define ST_ADDRESS_NOT_REGISTERED 3
#define ST_BATCH_BUSY             4

static unsigned long te_names;

/* Mooncake's error code (its error.h) for a call the daemon answered with gRPC status st: the
 * daemon away or the call timed out, a refused token, a peer or agent unknown, a limit. */
static int te_error_of(int st)
{
    switch (st) {
    case MG_GRPC_UNAVAILABLE:
    case MG_GRPC_DEADLINE_EXCEEDED:
        return ERR_SOCKET;
    case MG_GRPC_UNAUTHENTICATED:
    case MG_GRPC_PERMISSION_DENIED:
        return ERR_REJECT_HANDSHAKE;
    case MG_GRPC_NOT_FOUND:
        return ERR_ENDPOINT;
    case MG_GRPC_RESOURCE_EXHAUSTED:
        return ERR_TOO_MANY_REQUESTS;
    default:
        return ERR_INVALID_ARGUMENT;
    }
}

/* ---- engines ---- */

static void token_of_env(te_engine *e)
{
    const char *t = getenv("MOONGATE_TOKEN"), *path = getenv("MOONGATE_TOKEN_FILE");
    FILE *f;
    if (t != NULL && *t) {
        snprintf(e->token, sizeof(e->token), "%s", t);
        return;
    }
    if (path == NULL || *path == '\0' || (f = fopen(path, "r")) == NULL)
        return;
    if (fgets(e->token, sizeof(e->token), f) == NULL)
        e->token[0] = '\0';
    e->token[strcspn(e->token, "\r\n")] = '\0';
    fclose(f);
}

int te_register_agent(te_engine *e, uint64_t port, char *msg, size_t msgcap)
{
    Moongate__V1__RegisterAgentRequest q = MOONGATE__V1__REGISTER_AGENT_REQUEST__INIT;
    Moongate__V1__AgentInfo *info;
    uint8_t *resp = NULL;
    size_t len = 0;
    int st;
    q.name = e->name;
    q.port = (uint32_t)port;
    st = te_call_run(e, "/moongate.v1.Agent/RegisterAgent", &q.base, TE_TIMEOUT_MS, &resp, &len,
                     msg, msgcap);
    if (st != 0)
        return st;
    info = moongate__v1__agent_info__unpack(NULL, len, resp);
    free(resp);
    if (info == NULL) {
        snprintf(msg, msgcap, "the daemon's AgentInfo did not decode");
        return MG_GRPC_INTERNAL;
    }
    if (e->port != info->port) /* at creation; registered again, it asked for this very port */
        e->port = info->port;
    moongate__v1__agent_info__free_unpacked(info, NULL);
    return 0;
}

static int register_agent(te_engine *e, uint64_t port)
{
    char msg[512];
    int st = te_register_agent(e, port, msg, sizeof(msg));
    if (st != 0)
        te_log(st == MG_GRPC_UNAVAILABLE ? "no moongate daemon answers at %s (MOONGATE_SOCKET): %s"
                                         : "the daemon at %s refused the engine: %s",
               e->target, msg);
    return st ? -1 : 0;
}

transfer_engine_t createTransferEngine(const char *metadata_conn_string,
                                       const char *local_server_name, const char *ip_or_host_name,
                                       uint64_t rpc_port, int auto_discover)
{
    te_engine *e = calloc(1, sizeof(*e));
    const char *sock = getenv("MOONGATE_SOCKET"), *straddle;
    const char *conn = metadata_conn_string ? metadata_conn_string : "";
    const char *local = local_server_name ? local_server_name : "";
    uint64_t port = 0;
    int lport = 0;
    if (e == NULL)
        return NULL;
    e->efd = -1;
    e->test_straddle = (straddle = getenv("MG_TE_TEST_STRADDLE")) != NULL && !strcmp(straddle, "1");
    snprintf(e->target, sizeof(e->target), "unix:%s",
             sock && *sock ? sock : "/run/moongate/moongate.sock");
    token_of_env(e);
    if (mg_split_host_port(local, e->host, sizeof(e->host), &lport) == 0)
        port = (uint64_t)lport; /* "host:port", else a name alone */
    else
        snprintf(e->host, sizeof(e->host), "%s", local);
    if (ip_or_host_name != NULL && *ip_or_host_name)
        snprintf(e->host, sizeof(e->host), "%s", ip_or_host_name);
    if (e->host[0] == '\0' && gethostname(e->host, sizeof(e->host) - 1) != 0)
        snprintf(e->host, sizeof(e->host), "localhost");
    if (strcmp(conn, "P2PHANDSHAKE") == 0) {
        port = 0; /* the daemon assigns it: getLocalIpAndPort reads it back */
        /* "-c-": apart from the Python door's names, should one process hold engines of both */
        snprintf(e->name, sizeof(e->name), "mooncake-c-%d-%lu", (int)getpid(),
                 __atomic_add_fetch(&te_names, 1, __ATOMIC_RELAXED));
    } else {
        TE_LOG_ONCE("metadata server \"%s\" not needed: peers are found through their daemons",
                    conn);
        snprintf(e->name, sizeof(e->name), "%s", local);
        if (rpc_port != 0)
            port = rpc_port;
    }
    if (te_start(e) != 0 || register_agent(e, port) != 0) {
        te_stop(e);
        free(e);
        return NULL;
    }
    te_restore_init(e);
    return e;
}

void destroyTransferEngine(transfer_engine_t engine)
{
    te_engine *e = engine;
    if (e == NULL)
        return;
    te_stop(e); /* the connection ends: so does the agent, and its process memory */
    for (size_t i = 0; i < e->n_batches; i++) {
        te_batch *b = &e->chunks[i / TE_CHUNK][i % TE_CHUNK];
        free(b->tasks);
        free(b->note_to);
        free(b->note_payload);
    }
    for (size_t c = 0; c < TE_MAX_CHUNKS && e->chunks[c] != NULL; c++)
        free(e->chunks[c]);
    for (size_t i = 0; i < e->n_segs; i++)
        free(e->segs[i]);
    free(e->segs);
    free(e->regions);
    free(e);
}

int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len)
{
    te_engine *e = engine;
    int n;
    if (e == NULL || buf_out == NULL)
        return ERR_INVALID_ARGUMENT;
    n = snprintf(buf_out, buf_len, strchr(e->host, ':') ? "[%s]:%u" : "%s:%u", e->host, e->port);
    return n < 0 || (size_t)n >= buf_len ? ERR_INVALID_ARGUMENT : 0;
}

/* ---- segments: names of peers' engines ("host:port") ---- */

static int describe(te_engine *e, const char *name)
{
    Moongate__V1__DescribeAgentRequest q = MOONGATE__V1__DESCRIBE_AGENT_REQUEST__INIT;
    char msg[512], host[256];
    int st, port = 0;
    q.agent = (char *)name;
    st = te_call_run(e, "/moongate.v1.Agent/DescribeAgent", &q.base, TE_TIMEOUT_MS, NULL, NULL, msg,
                     sizeof(msg));
    if ((st == MG_GRPC_UNAVAILABLE || st == MG_GRPC_DEADLINE_EXCEEDED) &&
        mg_split_host_port(name, host, sizeof(host), &port) == 0)
        /* the daemon's message names the daemon's endpoint: say which engine was asked for */
        te_log("segment \"%s\": the engine at port %d of %s cannot be reached: the daemon of %s "
               "does not answer (%s)",
               name, port, host, host, msg);
    else if (st != 0)
        te_log("segment \"%s\": %s", name, msg);
    return st;
}

static segment_id_t open_segment(te_engine *e, const char *name, int ask)
{
    segment_id_t id = -1;
    char **grown;
    if (e == NULL || name == NULL || *name == '\0')
        return ERR_INVALID_ARGUMENT;
    while (*name == '/')
        name++;
    pthread_mutex_lock(&e->mu);
    for (size_t i = 0; i < e->n_segs; i++)
        if (e->segs[i] != NULL && strcmp(e->segs[i], name) == 0)
            id = (segment_id_t)(i + 1);
    pthread_mutex_unlock(&e->mu);
    if (id > 0 && !ask)
        return id; /* opened before */
    if (describe(e, name) != 0)
        return -1; /* no such engine there, or no daemon answering there */
    if (id > 0)
        return id;
    pthread_mutex_lock(&e->mu);
    grown = realloc(e->segs, (e->n_segs + 1) * sizeof(*grown));
    if (grown != NULL && (grown[e->n_segs] = strdup(name)) != NULL) {
        e->segs = grown;
        id = (segment_id_t)++e->n_segs;
    } else if (grown != NULL) {
        e->segs = grown;
    }
    pthread_mutex_unlock(&e->mu);
    return id;
}

segment_id_t openSegment(transfer_engine_t engine, const char *segment_name)
{
    return open_segment(engine, segment_name, 0);
}

segment_id_t openSegmentNoCache(transfer_engine_t engine, const char *segment_name)
{
    return open_segment(engine, segment_name, 1);
}

int closeSegment(transfer_engine_t engine, segment_id_t segment_id)
{
    return 0; /* as Mooncake's: the id stays valid */
}

int removeLocalSegment(transfer_engine_t engine, const char *segment_name)
{
    te_engine *e = engine;
    int rc = -1;
    if (e == NULL || segment_name == NULL)
        return ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&e->mu);
    for (size_t i = 0; i < e->n_segs; i++)
        if (e->segs[i] != NULL && strcmp(e->segs[i], segment_name) == 0) {
            free(e->segs[i]);
            e->segs[i] = NULL;
            rc = 0;
        }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int syncSegmentCache(transfer_engine_t engine)
{
    te_engine *e = engine;
    size_t n;
    if (e == NULL)
        return ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&e->mu);
    n = e->n_segs;
    pthread_mutex_unlock(&e->mu);
    for (size_t i = 0; i < n; i++) {
        char *name = NULL;
        pthread_mutex_lock(&e->mu);
        if (e->segs[i] != NULL)
            name = strdup(e->segs[i]);
        pthread_mutex_unlock(&e->mu);
        if (name != NULL)
            describe(e, name); /* a peer gone or restarted is said now */
        free(name);
    }
    return 0;
}

/* A segment id's name, copied (NULL: none). LOCAL_SEGMENT is this engine. With e->mu held. */
static char *segment_name(te_engine *e, int64_t id)
{
    char self[300];
    if (id == LOCAL_SEGMENT) {
        getLocalIpAndPort(e, self, sizeof(self));
        return strdup(self);
    }
    if (id < 1 || (uint64_t)id > e->n_segs || e->segs[id - 1] == NULL)
        return NULL;
    return strdup(e->segs[id - 1]);
}

/* ---- batches ---- */

te_batch *te_batch_find(te_engine *e, uint64_t id, size_t *slot)
{
    uint64_t s = (id & 0xffffffffu);
    te_batch *b = s == 0 ? NULL : te_slot(e, (size_t)(s - 1), (uint32_t)(id >> 32));
    if (b != NULL && slot != NULL)
        *slot = (size_t)(s - 1);
    return b;
}

/* With e->mu held: a free slot (its address never changes), or NULL. */
static te_batch *free_slot(te_engine *e)
{
    size_t s;
    for (s = 0; s < e->n_batches; s++)
        if (e->chunks[s / TE_CHUNK][s % TE_CHUNK].gen == 0)
            return &e->chunks[s / TE_CHUNK][s % TE_CHUNK];
    if (s / TE_CHUNK >= TE_MAX_CHUNKS)
        return NULL;
    if (e->chunks[s / TE_CHUNK] == NULL) {
        te_batch *chunk = calloc(TE_CHUNK, sizeof(*chunk));
        if (chunk == NULL)
            return NULL;
        TE_SET(e->chunks[s / TE_CHUNK], chunk); /* publish: zeroed slots, then the pointer */
    }
    e->n_batches++;
    e->chunks[s / TE_CHUNK][s % TE_CHUNK].slot = s;
    return &e->chunks[s / TE_CHUNK][s % TE_CHUNK];
}

batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size)
{
    te_engine *e = engine;
    te_batch *b;
    batch_id_t id = INVALID_BATCH;
    if (e == NULL || batch_size == 0)
        return INVALID_BATCH;
    pthread_mutex_lock(&e->mu);
    b = free_slot(e);
    if (b != NULL && (b->tasks = calloc(batch_size, sizeof(te_task))) != NULL) {
        if (++e->next_gen == 0)
            e->next_gen = 1;
        b->cap = batch_size;
        TE_SET(b->n, 0);
        TE_SET(b->note_state, TE_NOTE_NONE);
        TE_SET(b->gen, e->next_gen); /* publish: its fields, then gen (te_slot reads gen) */
        id = ((uint64_t)b->gen << 32) | (uint64_t)(b->slot + 1);
    }
    pthread_mutex_unlock(&e->mu);
    return id;
}

/* A refused Submit as Mooncake's status: a range in no registered memory (here or at the
 * target) is AddressNotRegistered, anything else InvalidArgument. */
static int submit_status(int st, const char *msg)
{
    if (st == MG_GRPC_OUT_OF_RANGE || (st != 0 && strstr(msg, "no region") != NULL))
        return ST_ADDRESS_NOT_REGISTERED;
    return ST_INVALID_ARGUMENT;
}

/* Entries of one opcode and one target go as one compact Blocks group (its blocks are numbered
 * in entry order, as requests would be): 1, or 0 when they differ. */
static int one_group(const struct transfer_request *entries, size_t count)
{
    for (size_t i = 1; i < count; i++)
        if (entries[i].opcode != entries[0].opcode || entries[i].target_id != entries[0].target_id)
            return 0;
    return count > 1;
}

static int fill_blocks(Moongate__V1__Blocks *g, const struct transfer_request *entries,
                       size_t count, char *agent)
{
    uint64_t lo = UINT64_MAX, ro = UINT64_MAX;
    g->local_offsets = calloc(count, sizeof(uint64_t));
    g->remote_offsets = calloc(count, sizeof(uint64_t));
    g->lengths = calloc(count, sizeof(uint64_t));
    if (g->local_offsets == NULL || g->remote_offsets == NULL || g->lengths == NULL)
        return -1;
    for (size_t i = 0; i < count; i++) {
        lo = (uint64_t)(uintptr_t)entries[i].source < lo ? (uint64_t)(uintptr_t)entries[i].source
                                                         : lo;
        ro = entries[i].target_offset < ro ? entries[i].target_offset : ro;
    }
    for (size_t i = 0; i < count; i++) {
        g->local_offsets[i] = (uint64_t)(uintptr_t)entries[i].source - lo;
        g->remote_offsets[i] = entries[i].target_offset - ro;
        g->lengths[i] = entries[i].length;
    }
    g->n_local_offsets = g->n_remote_offsets = g->n_lengths = count;
    g->op = entries[0].opcode == OPCODE_WRITE ? MOONGATE__V1__TRANSFER_OP__WRITE
                                              : MOONGATE__V1__TRANSFER_OP__READ;
    g->local_address = lo;
    g->remote_agent = agent;
    g->remote_address = ro;
    return 0;
}

static int fill_requests(te_engine *e, Moongate__V1__TransferRequest *reqs,
                         Moongate__V1__TransferRequest **rp, const struct transfer_request *entries,
                         size_t count, char **names)
{
    for (size_t i = 0; i < count; i++) {
        moongate__v1__transfer_request__init(&reqs[i]);
        reqs[i].op = entries[i].opcode == OPCODE_WRITE ? MOONGATE__V1__TRANSFER_OP__WRITE
                                                       : MOONGATE__V1__TRANSFER_OP__READ;
        reqs[i].local_address = (uint64_t)(uintptr_t)entries[i].source;
        reqs[i].remote_agent = entries[i].target_id == LOCAL_SEGMENT ? e->name : names[i];
        reqs[i].remote_address = entries[i].target_offset;
        reqs[i].length = entries[i].length;
        rp[i] = &reqs[i];
    }
    return 0;
}

/* The Submit of entries as tasks [first, first + count) of batch `slot`. LOCAL_SEGMENT is this
 * engine: its agent by name on this daemon (peer ""), a copy. */
static int submit(te_engine *e, size_t slot, uint32_t gen, size_t first,
                  struct transfer_request *entries, size_t count, char **names)
{
    Moongate__V1__SubmitRequest q = MOONGATE__V1__SUBMIT_REQUEST__INIT;
    Moongate__V1__Blocks g = MOONGATE__V1__BLOCKS__INIT, *gp = &g;
    int grouped = one_group(entries, count);
    Moongate__V1__TransferRequest *reqs = grouped ? NULL : calloc(count, sizeof(*reqs));
    Moongate__V1__TransferRequest **rp = grouped ? NULL : calloc(count, sizeof(*rp));
    char msg[512];
    int st = MG_GRPC_RESOURCE_EXHAUSTED;
    int ok = grouped ? fill_blocks(&g, entries, count,
                                   entries[0].target_id == LOCAL_SEGMENT ? e->name : names[0])
                     : (reqs && rp ? fill_requests(e, reqs, rp, entries, count, names) : -1);
    if (ok == 0) {
        q.blocks = grouped ? &gp : NULL;
        q.n_blocks = grouped ? 1 : 0;
        q.requests = rp;
        q.n_requests = grouped ? 0 : count;
        q.wait = 1; /* one call: answered with the batch once it is over */
        st = te_call_submit(e, &q.base, slot, gen, first, count, msg, sizeof(msg));
    } else {
        snprintf(msg, sizeof(msg), "out of memory");
    }
    free(g.local_offsets);
    free(g.remote_offsets);
    free(g.lengths);
    free(reqs);
    free(rp);
    if (st != 0)
        te_log("submitTransfer: %s", msg);
    return st == 0 ? 0 : submit_status(st, msg);
}

/* Checks the entries and reserves their tasks; fills names. Returns 0 or a status code. */
static int reserve(te_engine *e, batch_id_t batch_id, struct transfer_request *entries,
                   size_t count, char **names, size_t *slot, uint32_t *gen, size_t *first)
{
    te_batch *b = te_batch_find(e, batch_id, slot);
    if (b == NULL) {
        te_log("submitTransfer: batch %#llx is not one of this engine's",
               (unsigned long long)batch_id);
        return ST_INVALID_ARGUMENT;
    }
    if (count > b->cap - b->n) {
        te_log("submitTransfer: %zu more tasks in a batch of %zu holding %zu", count, b->cap, b->n);
        return ST_TOO_MANY_REQUESTS;
    }
    for (size_t i = 0; i < count; i++) {
        if (entries[i].opcode != OPCODE_READ && entries[i].opcode != OPCODE_WRITE) {
            te_log("submitTransfer: entry %zu: opcode %d is neither OPCODE_READ (0) nor "
                   "OPCODE_WRITE (1)",
                   i, entries[i].opcode);
            return ST_INVALID_ARGUMENT;
        }
        if ((names[i] = segment_name(e, entries[i].target_id)) == NULL) {
            te_log("submitTransfer: entry %zu: no segment opened with id %d", i,
                   entries[i].target_id);
            return ST_INVALID_ARGUMENT;
        }
        if (!te_holds(e, (uintptr_t)entries[i].source, entries[i].length)) {
            te_log("submitTransfer: entry %zu: [%p, +%llu) lies in no region this engine "
                   "registered (registerLocalMemory)",
                   i, entries[i].source, (unsigned long long)entries[i].length);
            return ST_ADDRESS_NOT_REGISTERED;
        }
    }
    *gen = b->gen;
    *first = b->n;
    for (size_t i = 0; i < count; i++) { /* publish: bytes, then status, then n */
        TE_SET(b->tasks[b->n + i].bytes, 0);
        TE_SET(b->tasks[b->n + i].status, STATUS_WAITING);
    }
    TE_SET(b->n, b->n + count); /* the tasks are there before they are counted */
    b->streams++;
    return 0;
}

static int submit_transfer(te_engine *e, batch_id_t batch_id, struct transfer_request *entries,
                           size_t count, const notify_msg_t *note)
{
    char **names;
    size_t slot = 0, first = 0;
    uint32_t gen = 0;
    int rc;
    if (e == NULL || (entries == NULL && count > 0)) {
        te_log("submitTransfer: %s", e == NULL ? "no engine (NULL)" : "no entries (NULL)");
        return ST_INVALID_ARGUMENT;
    }
    if (count == 0)
        return 0;
    if ((names = calloc(count, sizeof(*names))) == NULL)
        return ST_INVALID_ARGUMENT;
    pthread_mutex_lock(&e->mu);
    rc = reserve(e, batch_id, entries, count, names, &slot, &gen, &first);
    if (rc == 0 && note != NULL) {
        te_batch *b = te_slot(e, slot, gen);
        free(b->note_to);
        free(b->note_payload);
        b->note_to = strdup(names[0]);
        b->note_payload = te_note_payload(note->name, note->msg);
        /* publish: before the Submit whose answer moves the tasks' statuses, so that a
         * poll that loads a COMPLETED status loads this (or a later) note_state after it */
        TE_SET(b->note_state, b->note_to && b->note_payload ? TE_NOTE_WAITING : TE_NOTE_FAILED);
    }
    pthread_mutex_unlock(&e->mu);
    if (rc == 0) {
        rc = submit(e, slot, gen, first, entries, count, names);
        pthread_mutex_lock(&e->mu);
        te_batch *b = rc != 0 ? te_slot(e, slot, gen) : NULL;
        if (b != NULL) { /* refused: the tasks never were */
            if (b->n == first + count)
                TE_SET(b->n, first);
            b->streams--;
            if (note != NULL)
                TE_SET(b->note_state, TE_NOTE_NONE);
        }
        pthread_mutex_unlock(&e->mu);
    }
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
    return rc;
}

int submitTransfer(transfer_engine_t engine, batch_id_t batch_id, struct transfer_request *entries,
                   size_t count)
{
    return submit_transfer(engine, batch_id, entries, count, NULL);
}

int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id,
                             struct transfer_request *entries, size_t count,
                             notify_msg_t notify_msg)
{
    return submit_transfer(engine, batch_id, entries, count, &notify_msg);
}

int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id, size_t task_id,
                      struct transfer_status *status)
{
    te_engine *e = engine;
    te_batch *b;
    int rc = ST_INVALID_ARGUMENT;
    if (e == NULL || status == NULL)
        return rc;
    /* the snapshot the submits' answers make, read without the lock: no call to the daemon, and
     * nothing a tight loop of polls holds the loop thread up with */
    b = te_batch_find(e, batch_id, NULL);
    if (b != NULL && task_id < TE_GET(b->n)) {
        /* the status first, then the bytes: the loop thread stores the bytes, then the status
         * (te_loop.c), so the bytes read here are at least those the status was published
         * with; read the other way round, a COMPLETED could come with an older count */
        int s = te_task_status(b, task_id);
        te_test_straddle(e, b, task_id); /* test only: nothing unless MG_TE_TEST_STRADDLE=1 */
        status->transferred_bytes = TE_GET(b->tasks[task_id].bytes);
        status->status = s;
        rc = 0;
        /* not ended: give the CPU to whoever is ready (the threads moving these bytes, here and
         * in the daemons), so that a caller's tight loop of polls does not hold them off */
        if (status->status < STATUS_CANCELED)
            sched_yield();
    }
    return rc;
}

/* A task not yet ended, or the batch's notification not yet sent. */
static int batch_busy(const te_batch *b)
{
    for (size_t k = 0; k < b->n; k++)
        if (b->tasks[k].status < STATUS_CANCELED)
            return 1;
    return b->note_state == TE_NOTE_WAITING || b->note_state == TE_NOTE_SENDING;
}

int freeBatchID(transfer_engine_t engine, batch_id_t batch_id)
{
    te_engine *e = engine;
    te_batch *b;
    int rc = 0;
    if (e == NULL)
        return ST_INVALID_ARGUMENT;
    pthread_mutex_lock(&e->mu);
    b = te_batch_find(e, batch_id, NULL);
    if (b == NULL) {
        rc = ST_INVALID_ARGUMENT;
    } else if (batch_busy(b)) {
        rc = ST_BATCH_BUSY;
    } else {               /* a Submit answered late finds its slot gone (or reused: another gen) */
        TE_SET(b->gen, 0); /* unpublish first: te_slot then finds no batch here */
        free(b->tasks);
        free(b->note_to);
        free(b->note_payload);
        b->tasks = NULL;
        b->note_to = b->note_payload = NULL;
        b->cap = 0;
        b->streams = 0;
        TE_SET(b->n, 0);
        TE_SET(b->note_state, TE_NOTE_NONE);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* ---- notifications ---- */

int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id, notify_msg_t notify_msg)
{
    te_engine *e = engine;
    Moongate__V1__SendRequest q = MOONGATE__V1__SEND_REQUEST__INIT;
    char topic[64], msg[512], *to, *payload = NULL;
    const char *colon;
    int st;
    if (e == NULL) {
        te_log("genNotifyInEngine: no engine (NULL: createTransferEngine failed, or none made)");
        return ERR_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&e->mu);
    to = target_id > INT32_MAX ? NULL : segment_name(e, (int64_t)target_id);
    pthread_mutex_unlock(&e->mu);
    colon = to ? strrchr(to, ':') : NULL;
    if (colon == NULL) {
        te_log("genNotifyInEngine: no \"host:port\" segment opened with id %llu",
               (unsigned long long)target_id);
        free(to);
        return ERR_INVALID_ARGUMENT;
    }
    if ((payload = te_note_payload(notify_msg.name, notify_msg.msg)) == NULL) {
        te_log("genNotifyInEngine to %s: no memory for the notification", to);
        free(to);
        return ERR_MEMORY;
    }
    te_note_topic(topic, sizeof(topic), (uint32_t)strtoul(colon + 1, NULL, 10));
    q.agent = to;
    q.topic = topic;
    q.payload.data = (uint8_t *)payload;
    q.payload.len = strlen(payload);
    st = te_call_run(e, "/moongate.v1.Notify/Send", &q.base, TE_TIMEOUT_MS, NULL, NULL, msg,
                     sizeof(msg));
    if (st != 0)
        te_log("genNotifyInEngine to %s: %s (%s)", to, msg, mg_grpc_code_name(st));
    free(to);
    free(payload);
    return st == 0 ? 0 : te_error_of(st);
}

/* Appends the notifications of one Poll answer to *out. Returns how many Poll gave. */
static size_t take_notes(const uint8_t *resp, size_t len, notify_msg_t **out, int *n)
{
    Moongate__V1__PollResponse *r = moongate__v1__poll_response__unpack(NULL, len, resp);
    size_t got = r ? r->n_notifications : 0, polled = got;
    notify_msg_t *grown = got ? realloc(*out, ((size_t)*n + got) * sizeof(**out)) : *out;
    if (grown == NULL)
        got = 0;
    else
        *out = grown;
    for (size_t i = 0; i < got; i++) {
        const ProtobufCBinaryData *p = &r->notifications[i]->payload;
        json_t *o = json_loadb((const char *)p->data, p->len, 0, NULL);
        char *name = te_note_text(o, "name"), *msg = te_note_text(o, "msg");
        if (name != NULL && msg != NULL) {
            (*out)[*n].name = name;
            (*out)[*n].msg = msg;
            (*n)++;
        } else {
            te_log("getNotifsFromEngine: a notification that is not a transfer engine's (%zu "
                   "bytes, no \"name\" and \"msg\") skipped",
                   p->len);
            free(name);
            free(msg);
        }
        json_decref(o);
    }
    if (r != NULL)
        moongate__v1__poll_response__free_unpacked(r, NULL);
    return polled;
}

notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size)
{
    te_engine *e = engine;
    Moongate__V1__PollRequest q = MOONGATE__V1__POLL_REQUEST__INIT;
    notify_msg_t *out = NULL;
    char topic[64], msg[512];
    size_t got;
    int n = 0;
    if (size != NULL)
        *size = 0;
    if (e == NULL || size == NULL)
        return NULL;
    te_note_topic(topic, sizeof(topic), e->port);
    q.topic = topic;
    q.max = 1000;
    do {
        uint8_t *resp = NULL;
        size_t len = 0;
        int st = te_call_run(e, "/moongate.v1.Notify/Poll", &q.base, TE_TIMEOUT_MS, &resp, &len,
                             msg, sizeof(msg));
        if (st != 0) {
            te_log("getNotifsFromEngine: %s", msg);
            break;
        }
        got = take_notes(resp, len, &out, &n);
        free(resp);
    } while (got == q.max);
    if (n == 0) { /* nothing: NULL, as Mooncake's */
        free(out);
        out = NULL;
    }
    *size = n;
    return out;
}

int freeNotifsMsgBuf(notify_msg_t *msg, int size)
{
    for (int i = 0; msg != NULL && i < size; i++) {
        free(msg[i].name);
        free(msg[i].msg);
    }
    free(msg);
    return 0;
}

/* ---- what the daemon owns ---- */

int discoverTopology(transfer_engine_t engine)
{
    TE_LOG_ONCE("discoverTopology: the daemon owns the devices (mgctl doctor shows them); -1");
    return -1;
}

transport_t installTransport(transfer_engine_t engine, const char *proto, void **args)
{
    if (engine != NULL && proto != NULL && (!strcmp(proto, "rdma") || !strcmp(proto, "tcp"))) {
        TE_LOG_ONCE("installTransport(\"%s\"): the daemon chooses the transport (RDMA where both "
                    "daemons have a device, else TCP)",
                    proto);
        return engine; /* a handle the caller only checks against NULL */
    }
    te_log("installTransport(\"%s\"): not a transport of moongate", proto ? proto : "");
    return NULL;
}

int uninstallTransport(transfer_engine_t engine, const char *proto)
{
    return 0;
}

int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats, size_t *count)
{
    if (count != NULL)
        *count = 0;
    TE_LOG_ONCE("getNicLoadStats: the daemon owns the NICs (its /metrics has their bytes); -1");
    return -1;
}

void enableGracefulShutdown(transfer_engine_t engine)
{
    /* nothing to turn on: destroyTransferEngine always lets the daemon end what it started */
}

int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len, int json)
{
    TE_LOG_ONCE("showLinks: the daemon owns the links (mgctl peers shows them); -1");
    return -1;
}

int warmupEfaSegment(transfer_engine_t engine, const char *segment_name)
{
    return 0; /* no EFA transport: nothing to warm, as Mooncake's builds without EFA */
}
