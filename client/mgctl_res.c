/*
 * mgctl's resource commands: segments, leases, pools, peers, transfers, watch, status and
 * doctor. Each calls a unary method with a JSON request (the protos' JSON mapping, mg_json),
 * then prints the JSON reply as a table, or as it is with --json. The streaming ones (transfers
 * wait, watch) run on the client's event loop. Included by mgctl.c (it shares its statics).
 */
#include "mg_shm.h"

#include <dirent.h>
#include <errno.h>
#include <openssl/pem.h>
#include <stdarg.h>
#include <openssl/x509.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* Calls `method` ("Service/Method") with `req` (taken over); *out: the reply as JSON. Returns
 * the gRPC status (errors reported). */
static int call_json(const ctl *c, const char *method, json_t *req, json_t **out)
{
    char path[300], err[512];
    const ProtobufCMethodDescriptor *md = find_method(method, path, sizeof(path));
    ProtobufCMessage *msg, *reply;
    int st;
    *out = NULL;
    if (md == NULL || req == NULL) {
        json_decref(req);
        return report_error(c, MG_GRPC_INTERNAL, "no such method or out of memory");
    }
    msg = mg_json_to_message(md->input, req, err, sizeof(err));
    json_decref(req);
    if (msg == NULL) {
        fprintf(stderr, "mgctl: %s\n", err);
        return EXIT_USAGE;
    }
    st = unary(c, path, msg, md->output, &reply);
    protobuf_c_message_free_unpacked(msg, NULL);
    if (st != MG_GRPC_OK)
        return st;
    *out = mg_json_from_message(reply);
    protobuf_c_message_free_unpacked(reply, NULL);
    return *out ? MG_GRPC_OK : report_error(c, MG_GRPC_INTERNAL, "out of memory");
}

static void dump(json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    printf("%s\n", s ? s : "{}");
    free(s);
}

/* ---- tables ---- */

enum { TEXT, BYTES, MS, BOOL, LIST };

typedef struct {
    const char *head;
    const char *key; /* the JSON name (camelCase) */
    int kind;
} col;

static void human_bytes(char *out, size_t cap, double v)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(out, cap, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

static void cell(char *out, size_t cap, json_t *v, int kind)
{
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    double num = json_is_number(v) ? json_number_value(v) : s ? strtod(s, NULL) : 0;
    out[0] = '\0';
    switch (kind) {
    case BYTES:
        human_bytes(out, cap, num);
        break;
    case MS: /* 0 is none (no expiry, no answer yet, the deadline passed): "-" */
        if (num > 0)
            snprintf(out, cap, "%.1f s", num / 1000.0);
        break;
    case BOOL:
        snprintf(out, cap, "%s", json_is_true(v) ? "yes" : "no");
        break;
    case LIST: {
        size_t i, used = 0;
        json_t *e;
        json_array_foreach(v, i, e)
        {
            if (json_is_string(e) && used + strlen(json_string_value(e)) + 2 < cap)
                used += (size_t)snprintf(out + used, cap - used, "%s%s", i ? "," : "",
                                         json_string_value(e));
        }
        break;
    }
    default:
        if (s)
            snprintf(out, cap, "%s", s);
        else if (json_is_integer(v))
            snprintf(out, cap, "%lld", (long long)json_integer_value(v));
        else if (json_is_real(v))
            snprintf(out, cap, "%.3g", json_real_value(v));
        else if (json_is_boolean(v))
            snprintf(out, cap, "%s", json_is_true(v) ? "true" : "false");
    }
    if (out[0] == '\0')
        snprintf(out, cap, "-");
}

/* Prints the objects of `rows` under the columns, aligned. */
static void table(json_t *rows, const col *cols, size_t ncols)
{
    size_t n = json_array_size(rows), w[16] = {0};
    char(*cells)[16][160] = calloc(n ? n : 1, sizeof(*cells));
    if (cells == NULL)
        return;
    for (size_t k = 0; k < ncols && k < 16; k++)
        w[k] = strlen(cols[k].head);
    for (size_t r = 0; r < n; r++)
        for (size_t k = 0; k < ncols && k < 16; k++) {
            cell(cells[r][k], sizeof(cells[r][k]),
                 json_object_get(json_array_get(rows, r), cols[k].key), cols[k].kind);
            if (strlen(cells[r][k]) > w[k])
                w[k] = strlen(cells[r][k]);
        }
    for (size_t k = 0; k < ncols; k++) /* the last column unpadded: no trailing blanks */
        printf("%-*s%s", k + 1 < ncols ? (int)w[k] : 0, cols[k].head, k + 1 < ncols ? "  " : "\n");
    for (size_t r = 0; r < n; r++)
        for (size_t k = 0; k < ncols; k++)
            printf("%-*s%s", k + 1 < ncols ? (int)w[k] : 0, cells[r][k],
                   k + 1 < ncols ? "  " : "\n");
    if (n == 0)
        printf("(none)\n");
    free(cells);
}

/* One object as "key  value" lines. */
static void fields(json_t *obj, const col *cols, size_t ncols)
{
    for (size_t k = 0; k < ncols; k++) {
        char v[600];
        cell(v, sizeof(v), json_object_get(obj, cols[k].key), cols[k].kind);
        printf("%-12s %s\n", cols[k].head, v);
    }
}

static const col seg_cols[] = {
    {"ID", "id", TEXT},
    {"NAME", "name", TEXT},
    {"TENANT", "tenant", TEXT},
    {"SIZE", "size", BYTES},
    {"STATE", "state", TEXT},
    {"HOLDERS", "holders", TEXT},
    {"REMOTE", "remoteAccessible", BOOL},
    {"TRANSPORTS", "transports", LIST},
    {"PATH", "path", TEXT},
};
static const col lease_cols[] = {
    {"ID", "id", TEXT},
    {"POOL", "pool", TEXT},
    {"TENANT", "tenant", TEXT},
    {"OFFSET", "offset", TEXT},
    {"SIZE", "requested", BYTES},
    {"EXPIRES", "expiresInMs", MS},
    {"REMOTE", "remoteAccessible", BOOL},
    {"USERS", "users", TEXT},
};
static const col pool_cols[] = {
    {"POOL", "name", TEXT},
    {"CAPACITY", "capacity", BYTES},
    {"IN USE", "inUse", BYTES},
    {"FREE", "free", BYTES},
    {"LARGEST", "largestLease", BYTES},
    {"LEASES", "leases", TEXT},
    {"WAITERS", "waiters", TEXT},
    {"EXHAUSTED", "exhaustedTotal", TEXT},
    {"FRAG", "fragmentation", TEXT},
};
static const col peer_cols[] = {
    {"PEER", "address", TEXT},      {"TENANT", "tenant", TEXT},
    {"STATE", "state", TEXT},       {"EPOCH", "epoch", TEXT},
    {"DATA", "dataEndpoint", TEXT}, {"TRANSPORTS", "transports", LIST},
    {"QUEUED", "queued", TEXT},     {"JOBS", "jobs", TEXT},
    {"RDMA", "rdma", TEXT},         {"LAST ERROR", "lastError", TEXT},
};
static const col agent_cols[] = {
    {"NAME", "name", TEXT},
    {"PORT", "port", TEXT},
    {"TENANT", "tenant", TEXT},
    {"ID", "agentId", TEXT},
};
static const col expect_cols[] = {
    {"ID", "id", TEXT},
    {"TOPIC", "topic", TEXT},
    {"PEER", "peer", TEXT},
    {"AGENT", "agent", TEXT},
    {"EPOCH", "epoch", TEXT},
    {"DEADLINE IN", "deadlineLeftMs", MS},
    {"ANSWERED AGO", "lastAnswerMs", MS},
};
static const col region_cols[] = {
    {"ADDRESS", "address", TEXT},
    {"LENGTH", "length", BYTES},
    {"SEGMENT", "segment", TEXT},
    {"REMOTE", "remoteAccessible", BOOL},
};
static const col req_cols[] = {
    {"#", "index", TEXT},   {"STATE", "state", TEXT},     {"DONE", "bytesDone", BYTES},
    {"CODE", "code", TEXT}, {"MESSAGE", "message", TEXT},
};

/* A List method, every page. */
static int list_all(const ctl *c, const char *method, const char *field, json_t **all)
{
    char token[64] = "";
    *all = json_array();
    for (;;) {
        json_t *page;
        int st = call_json(c, method, json_pack("{s:i,s:s}", "pageSize", 1000, "pageToken", token),
                           &page);
        if (st != MG_GRPC_OK) {
            json_decref(*all);
            *all = NULL;
            return st;
        }
        json_array_extend(*all, json_object_get(page, field));
        snprintf(token, sizeof(token), "%s",
                 json_string_value(json_object_get(page, "nextPageToken"))
                     ? json_string_value(json_object_get(page, "nextPageToken"))
                     : "");
        json_decref(page);
        if (token[0] == '\0')
            return MG_GRPC_OK;
    }
}

static int show(const ctl *c, int st, json_t *j, const char *field, const col *cols, size_t n,
                int one)
{
    if (st != MG_GRPC_OK)
        return st;
    if (c->json)
        dump(j);
    else if (one)
        fields(field ? json_object_get(j, field) : j, cols, n);
    else
        table(field ? json_object_get(j, field) : j, cols, n);
    json_decref(j);
    return 0;
}

#define NCOLS(a) (sizeof(a) / sizeof((a)[0]))

static int need_id(const char *s, const char *what)
{
    char *end;
    if (s == NULL || strtoull(s, &end, 10) == 0 || *end) {
        fprintf(stderr, "mgctl: %s needs an id (a number)\n", what);
        return -1;
    }
    return 0;
}

/* "4096", "64K", "1M", "2G" (binary) as a decimal string; -1 for anything else. */
static int size_arg(const char *s, char out[32])
{
    char *end;
    unsigned long long v;
    int shift = 0;
    if (s == NULL || s[0] < '0' || s[0] > '9')
        return -1;
    v = strtoull(s, &end, 10);
    if (*end == 'K' || *end == 'k')
        shift = 10;
    else if (*end == 'M' || *end == 'm')
        shift = 20;
    else if (*end == 'G' || *end == 'g')
        shift = 30;
    else if (*end != '\0')
        return -1;
    if (shift && (end[1] != '\0' || v > (~0ULL >> shift)))
        return -1;
    snprintf(out, 32, "%llu", v << shift);
    return 0;
}

/* segments register-file NAME PATH: the file opened here and passed to the daemon on its fd
 * socket, then registered by the handle (the daemon maps the same pages; docs/api.md). */
static int register_file(const ctl *c, const char *name, const char *path, int remote, json_t **j)
{
    char sock[128], err[512], handle_s[24];
    uint64_t handle, ttl_ms;
    int status, fd;
    if (mg_fd_socket_of(c->copt.target, sock, sizeof(sock)) != 0) {
        fprintf(stderr, "mgctl: register-file passes the file's descriptor on the daemon's fd "
                        "socket: use a unix:PATH target\n");
        return EXIT_USAGE;
    }
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "mgctl: cannot open %s for reading and writing: %s\n", path,
                strerror(errno));
        return 1;
    }
    if (mg_fd_pass(sock, fd, c->copt.token, &handle, &ttl_ms, &status, err, sizeof(err)) != 0) {
        close(fd);
        return report_error(c, status, err);
    }
    close(fd); /* the daemon has its own */
    snprintf(handle_s, sizeof(handle_s), "%llu", (unsigned long long)handle);
    return call_json(c, "Memory/RegisterSegment",
                     json_pack("{s:s,s:s,s:s,s:b}", "name", name, "source", "FD", "fdHandle",
                               handle_s, "remoteAccessible", remote),
                     j);
}

static int cmd_segments(const ctl *c, const char *verb, const char *a1, const char *a2, int remote)
{
    json_t *j;
    char size[32];
    if (verb == NULL || !strcmp(verb, "list")) {
        int st = list_all(c, "Memory/ListSegments", "segments", &j);
        return show(c, st, j, NULL, seg_cols, NCOLS(seg_cols), 0);
    }
    if (!strcmp(verb, "get") && need_id(a1, "segments get") == 0) {
        int st_ = call_json(c, "Memory/GetSegment", json_pack("{s:s}", "id", a1), &j);
        return show(c, st_, j, NULL, seg_cols, NCOLS(seg_cols), 1);
    }
    if (!strcmp(verb, "register") && a1 && size_arg(a2, size) == 0) {
        int st_ = call_json(
            c, "Memory/RegisterSegment",
            json_pack("{s:s,s:s,s:b}", "name", a1, "size", size, "remoteAccessible", remote), &j);
        return show(c, st_, j, "segment", seg_cols, NCOLS(seg_cols), 1);
    }
    if (!strcmp(verb, "register-file") && a1 && a2) {
        int st_ = register_file(c, a1, a2, remote, &j);
        return show(c, st_, j, "segment", seg_cols, NCOLS(seg_cols), 1);
    }
    if (!strcmp(verb, "unregister") && need_id(a1, "segments unregister") == 0) {
        int st = call_json(c, "Memory/UnregisterSegment", json_pack("{s:s}", "id", a1), &j);
        if (st == MG_GRPC_OK && !c->json)
            printf("segment %s unregistered\n", a1);
        return show(c, st, j, NULL, NULL, 0, c->json ? 1 : -1);
    }
    fprintf(stderr, "mgctl: segments [list | get ID | register NAME SIZE [--remote] | "
                    "register-file NAME PATH [--remote] | unregister ID]\n");
    return EXIT_USAGE;
}

static int cmd_leases(const ctl *c, const char *verb, const char *a1, uint64_t ttl, int remote)
{
    json_t *j;
    char size[32];
    if (verb == NULL || !strcmp(verb, "list")) {
        int st = list_all(c, "Pool/ListLeases", "leases", &j);
        return show(c, st, j, NULL, lease_cols, NCOLS(lease_cols), 0);
    }
    if (!strcmp(verb, "get") && need_id(a1, "leases get") == 0) {
        int st_ = call_json(c, "Pool/GetLease", json_pack("{s:s}", "id", a1), &j);
        return show(c, st_, j, NULL, lease_cols, NCOLS(lease_cols), 1);
    }
    if (!strcmp(verb, "acquire") && size_arg(a1, size) == 0) {
        int st_ = call_json(c, "Pool/AcquireLease",
                            json_pack("{s:s,s:I,s:b}", "size", size, "ttlMs", (json_int_t)ttl,
                                      "remoteAccessible", remote),
                            &j);
        return show(c, st_, j, NULL, lease_cols, NCOLS(lease_cols), 1);
    }
    if (!strcmp(verb, "release") && need_id(a1, "leases release") == 0) {
        int st = call_json(c, "Pool/ReleaseLease", json_pack("{s:s}", "id", a1), &j);
        if (st == MG_GRPC_OK && !c->json)
            printf("lease %s released\n", a1);
        return show(c, st, j, NULL, NULL, 0, c->json ? 1 : -1);
    }
    fprintf(stderr, "mgctl: leases [list | get ID | acquire SIZE [--ttl MS] [--remote] | "
                    "release ID]\n");
    return EXIT_USAGE;
}

static int cmd_pools(const ctl *c)
{
    json_t *j;
    {
        int st_ = call_json(c, "Pool/PoolStats", json_object(), &j);
        return show(c, st_, j, "pools", pool_cols, NCOLS(pool_cols), 0);
    }
}

static int cmd_peers(const ctl *c)
{
    json_t *j;
    {
        int st_ = call_json(c, "Transfer/ListPeers", json_object(), &j);
        return show(c, st_, j, "peers", peer_cols, NCOLS(peer_cols), 0);
    }
}

/* Agents: the tenant's here, or one (here or on a peer) with its regions. */
static int cmd_agents(const ctl *c, const char *verb, const char *agent, const char *peer)
{
    json_t *j;
    int st;
    if (verb == NULL || !strcmp(verb, "list")) {
        st = call_json(c, "Agent/ListAgents", json_object(), &j);
        return show(c, st, j, "agents", agent_cols, NCOLS(agent_cols), 0);
    }
    if (strcmp(verb, "describe") != 0 || agent == NULL) {
        fprintf(stderr, "mgctl: agents [list] | agents describe AGENT [PEER]\n");
        return EXIT_USAGE;
    }
    st = call_json(c, "Agent/DescribeAgent",
                   json_pack("{s:s,s:s}", "agent", agent, "peer", peer ? peer : ""), &j);
    if (st != MG_GRPC_OK || c->json)
        return show(c, st, j, NULL, agent_cols, NCOLS(agent_cols), 1);
    fields(j, agent_cols, NCOLS(agent_cols));
    printf("epoch       %s\nfirst       %s\n", json_string_value(json_object_get(j, "epoch")),
           json_string_value(json_object_get(j, "firstAddress"))
               ? json_string_value(json_object_get(j, "firstAddress"))
               : "0");
    table(json_object_get(j, "regions"), region_cols, NCOLS(region_cols));
    json_decref(j);
    return 0;
}

/* Expectations: what this daemon's receivers of the tenant wait for (the sender's daemon's last
 * answer, how long until the deadline), or one taken back. */
static int cmd_expectations(const ctl *c, const char *verb, const char *id)
{
    json_t *j;
    int st;
    if (verb == NULL || !strcmp(verb, "list")) {
        st = call_json(c, "Notify/ListExpectations", json_object(), &j);
        return show(c, st, j, "expectations", expect_cols, NCOLS(expect_cols), 0);
    }
    if (!strcmp(verb, "cancel") && need_id(id, "expectations cancel") == 0) {
        st = call_json(c, "Notify/Unexpect", json_pack("{s:s}", "id", id), &j);
        if (st == MG_GRPC_OK && !c->json)
            printf("expectation %s taken back\n", id);
        return show(c, st, j, NULL, NULL, 0, c->json ? 1 : -1);
    }
    fprintf(stderr, "mgctl: expectations [list | cancel ID]\n");
    return EXIT_USAGE;
}

/* A batch: its state line, then its requests (numbered). */
static void print_batch(json_t *b)
{
    json_t *reqs = json_object_get(b, "requests"), *r;
    const char *tag = json_string_value(json_object_get(b, "tag")); /* "" for none */
    size_t i;
    printf("batch %s: %s, %lld done, %lld failed%s%s\n",
           json_string_value(json_object_get(b, "id")),
           json_string_value(json_object_get(b, "state")),
           (long long)json_integer_value(json_object_get(b, "done")),
           (long long)json_integer_value(json_object_get(b, "failed")),
           tag && *tag ? ", tagged " : "", tag && *tag ? tag : "");
    json_array_foreach(reqs, i, r) json_object_set_new(r, "index", json_integer((json_int_t)i));
    table(reqs, req_cols, NCOLS(req_cols));
}

static int batch_status(json_t *b)
{
    const char *st = json_string_value(json_object_get(b, "state"));
    return st && !strcmp(st, "DONE") ? 0 : MG_GRPC_ABORTED;
}

/* ---- streams: transfers wait, watch ---- */

typedef struct {
    const ctl *c;
    struct event_base *base;
    const ProtobufCMessageDescriptor *out;
    int (*on_msg)(void *arg, json_t *msg);
    void *arg;
    int status;
} stream_state;

static void stream_msg(mg_rpc *rpc, const uint8_t *msg, size_t len, void *arg)
{
    stream_state *s = arg;
    ProtobufCMessage *m = protobuf_c_message_unpack(s->out, NULL, len, msg);
    json_t *j = m ? mg_json_from_message(m) : NULL;
    if (j)
        s->on_msg(s->arg, j);
    json_decref(j);
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
}

static void stream_close(mg_rpc *rpc, int status, const char *message, void *arg)
{
    stream_state *s = arg;
    s->status = status;
    if (status != MG_GRPC_OK && status != MG_GRPC_DEADLINE_EXCEEDED)
        report_error(s->c, status, message);
    event_base_loopbreak(s->base);
}

/* A server-streaming call with a JSON request; each message goes to on_msg as JSON. */
static int stream_json(const ctl *c, const char *method, json_t *req,
                       int (*on_msg)(void *, json_t *), void *arg)
{
    static const mg_rpc_handlers h = {stream_msg, stream_close};
    char path[300], err[512];
    const ProtobufCMethodDescriptor *md = find_method(method, path, sizeof(path));
    stream_state s = {c, event_base_new(), NULL, on_msg, arg, MG_GRPC_UNAVAILABLE};
    ProtobufCMessage *msg = md && req ? mg_json_to_message(md->input, req, err, sizeof(err)) : NULL;
    mg_client *cl;
    mg_rpc *rpc;
    uint8_t *buf;
    size_t len;
    json_decref(req);
    if (s.base == NULL || msg == NULL) {
        if (s.base)
            event_base_free(s.base);
        if (msg)
            protobuf_c_message_free_unpacked(msg, NULL);
        return report_error(c, MG_GRPC_INTERNAL, "bad request");
    }
    s.out = md->output;
    len = protobuf_c_message_get_packed_size(msg);
    buf = malloc(len ? len : 1);
    if (buf)
        protobuf_c_message_pack(msg, buf);
    protobuf_c_message_free_unpacked(msg, NULL);
    if (buf == NULL || mg_client_new(&cl, s.base, &c->copt, err, sizeof(err)) != 0) {
        free(buf);
        event_base_free(s.base);
        return report_error(c, MG_GRPC_UNAVAILABLE, buf ? err : "out of memory");
    }
    rpc = mg_rpc_start(cl, path, NULL, 0, c->timeout_ms, &h, &s);
    if (rpc) {
        mg_rpc_send(rpc, buf, len);
        mg_rpc_close_send(rpc);
        event_base_dispatch(s.base);
    }
    free(buf);
    mg_client_del(cl);
    event_base_loop(s.base, EVLOOP_NONBLOCK);
    event_base_free(s.base);
    return s.status;
}

typedef struct {
    const ctl *c;
    json_t *last;
    int tty;
} wait_state;

/* A progress bar on standard error (a terminal only), the batch's bytes done of its total. */
static int wait_msg(void *arg, json_t *b)
{
    wait_state *w = arg;
    json_t *r;
    size_t i;
    double done = 0, total = 0;
    json_array_foreach(json_object_get(b, "requests"), i, r)
    {
        json_t *bd = json_object_get(r, "bytesDone"), *ln = json_object_get(r, "length");
        done += json_is_string(bd) ? strtod(json_string_value(bd), NULL) : 0;
        total += json_is_string(ln) ? strtod(json_string_value(ln), NULL) : 0;
    }
    if (w->tty && !w->c->json) {
        char d[32], t[32];
        int fill = total > 0 ? (int)(30 * done / total) : 0;
        human_bytes(d, sizeof(d), done);
        human_bytes(t, sizeof(t), total);
        fprintf(stderr, "\r[%-30.*s] %5.1f%%  %s of %s", fill, "##############################",
                total > 0 ? 100 * done / total : 0, d, total > 0 ? t : "?");
    }
    json_decref(w->last);
    w->last = json_incref(b);
    return 0;
}

static int cmd_transfers(const ctl *c, const char *verb, const char *id)
{
    json_t *j;
    int st;
    if (verb == NULL || need_id(id, "transfers") != 0) {
        fprintf(stderr, "mgctl: transfers get ID | cancel ID | wait ID\n");
        return EXIT_USAGE;
    }
    if (!strcmp(verb, "get") || !strcmp(verb, "cancel")) {
        st = call_json(c, !strcmp(verb, "get") ? "Transfer/GetBatch" : "Transfer/Cancel",
                       json_pack("{s:s}", "id", id), &j);
        if (st != MG_GRPC_OK)
            return st;
        c->json ? dump(j) : print_batch(j);
        st = !strcmp(verb, "get") ? batch_status(j) : 0;
        json_decref(j);
        return st;
    }
    if (!strcmp(verb, "wait")) {
        wait_state w = {c, NULL, isatty(2)};
        st = stream_json(c, "Transfer/Wait", json_pack("{s:s}", "id", id), wait_msg, &w);
        if (w.tty && !c->json)
            fprintf(stderr, "\n");
        if (w.last == NULL)
            return st ? st : MG_GRPC_UNAVAILABLE;
        c->json ? dump(w.last) : print_batch(w.last);
        st = st == MG_GRPC_OK ? batch_status(w.last) : st;
        json_decref(w.last);
        return st;
    }
    fprintf(stderr, "mgctl: transfers get ID | cancel ID | wait ID\n");
    return EXIT_USAGE;
}

static int watch_note(void *arg, json_t *n)
{
    const ctl *c = arg;
    if (c->json) {
        char *s = json_dumps(n, JSON_COMPACT | JSON_PRESERVE_ORDER);
        printf("%s\n", s ? s : "{}");
        free(s);
    } else {
        /* the payload is base64 in JSON: shown as such, with the sender and batch */
        printf("%s  from %s  batch %s  payload %s\n",
               json_string_value(json_object_get(n, "topic")),
               json_string_value(json_object_get(n, "from")),
               json_string_value(json_object_get(n, "batchId")),
               json_string_value(json_object_get(n, "payload")));
    }
    fflush(stdout);
    return 0;
}

static int cmd_watch_topic(const ctl *c, const char *topic)
{
    int st;
    if (topic == NULL) {
        fprintf(stderr, "mgctl: watch TOPIC\n");
        return EXIT_USAGE;
    }
    st = stream_json(c, "Notify/Watch", json_pack("{s:s}", "topic", topic), watch_note, (void *)c);
    return st == MG_GRPC_DEADLINE_EXCEEDED ? 0 : st; /* --timeout ends a watch as asked */
}

/* ---- status: the daemon at a glance ---- */

static int cmd_status(const ctl *c)
{
    json_t *info, *pools = NULL, *peers = NULL, *segs = NULL, *all;
    int st = call_json(c, "Daemon/Info", json_object(), &info);
    if (st != MG_GRPC_OK)
        return st;
    call_json(c, "Pool/PoolStats", json_object(), &pools); /* optional parts: errors shown */
    call_json(c, "Transfer/ListPeers", json_object(), &peers);
    list_all(c, "Memory/ListSegments", "segments", &segs);
    if (c->json) {
        all = json_pack("{s:O,s:O,s:O,s:O}", "info", info, "pools",
                        pools ? json_object_get(pools, "pools") : json_null(), "peers",
                        peers ? json_object_get(peers, "peers") : json_null(), "segments",
                        segs ? segs : json_null());
        dump(all);
        json_decref(all);
    } else {
        json_t *t;
        size_t i;
        printf("moongate %s  state %s  up %.0f s  epoch %s\n",
               json_string_value(json_object_get(info, "version")),
               json_string_value(json_object_get(info, "state")),
               strtod(json_string_value(json_object_get(info, "uptimeMs")), NULL) / 1000,
               json_string_value(json_object_get(info, "epoch")));
        json_array_foreach(json_object_get(info, "transports"), i, t)
        {
            const char *why = json_string_value(json_object_get(t, "reason"));
            printf("transport %-5s %s%s%s\n", json_string_value(json_object_get(t, "name")),
                   json_is_true(json_object_get(t, "available")) ? "available" : "unavailable",
                   why && *why ? ": " : "", why ? why : "");
        }
        printf("segments  %zu\n\n", json_array_size(segs));
        if (pools)
            table(json_object_get(pools, "pools"), pool_cols, NCOLS(pool_cols));
        printf("\n");
        if (peers)
            table(json_object_get(peers, "peers"), peer_cols, 5);
    }
    json_decref(info);
    json_decref(pools);
    json_decref(peers);
    json_decref(segs);
    return 0;
}

/* ---- doctor: what on this node stands in the daemon's way, and what to do ---- */

typedef struct {
    int fails, warns;
    int json;
    json_t *checks;
} doc;

static void report(doc *d, int level, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void report(doc *d, int level, const char *what, const char *fmt, ...)
{
    static const char *const names[] = {"ok", "warn", "FAIL"};
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    d->fails += level == 2;
    d->warns += level == 1;
    if (d->json)
        json_array_append_new(d->checks,
                              json_pack("{s:s,s:s,s:s}", "check", what, "result",
                                        level == 2 ? "fail" : names[level], "detail", msg));
    else
        printf("%-5s %-13s %s\n", names[level], what, msg);
}

/* The first line of /sys/class/infiniband/DEV/ports/1/LEAF, or "". */
static void read_line(const char *dev, const char *leaf, char *out, size_t cap)
{
    char path[512];
    FILE *f;
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/%s", dev, leaf);
    out[0] = '\0';
    if ((f = fopen(path, "r")) != NULL) {
        if (fgets(out, (int)cap, f))
            out[strcspn(out, "\n")] = '\0';
        fclose(f);
    }
}

static void check_cert(doc *d, const char *what, const char *file)
{
    FILE *f = fopen(file, "r");
    X509 *x = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
    int days = 0, secs = 0;
    if (f)
        fclose(f);
    if (x == NULL) {
        report(d, 2, what, "cannot read a certificate from %s", file);
        return;
    }
    if (ASN1_TIME_diff(&days, &secs, NULL, X509_get0_notAfter(x)) != 1)
        report(d, 1, what, "%s: cannot read its expiry", file);
    else if (days < 0 || (days == 0 && secs <= 0))
        report(d, 2, what, "%s expired %d days ago: renew it", file, -days);
    else if (days < 14)
        report(d, 1, what, "%s expires in %d days: renew it soon", file, days);
    else
        report(d, 0, what, "%s valid for %d more days", file, days);
    X509_free(x);
}

static int cmd_doctor(const ctl *c, const char *shm_dir)
{
    doc d = {0, 0, c->json, json_array()};
    struct rlimit rl;
    struct statvfs vfs;
    json_t *info = NULL, *peers = NULL, *t;
    size_t i;
    char a[32], b[32];

    /* the daemon */
    if (call_json(c, "Daemon/Info", json_object(), &info) == MG_GRPC_OK) {
        report(&d, 0, "daemon", "%s answers: moongate %s, %s", c->copt.target,
               json_string_value(json_object_get(info, "version")),
               json_string_value(json_object_get(info, "state")));
        json_array_foreach(json_object_get(info, "transports"), i, t)
        {
            const char *name = json_string_value(json_object_get(t, "name"));
            const char *why = json_string_value(json_object_get(t, "reason"));
            if (json_is_true(json_object_get(t, "available")))
                report(&d, 0, name, "available (%zu device%s)",
                       json_array_size(json_object_get(t, "devices")),
                       json_array_size(json_object_get(t, "devices")) == 1 ? "" : "s");
            else if (!strcmp(name, "process_vm") && why && !strncmp(why, "off on this daemon", 18))
                report(&d, 0, name, "%s: process memory is refused at registration, by choice",
                       why); /* the operator's setting (the helm chart's default), not a fault */
            else
                report(&d, !strcmp(name, "rdma") ? 1 : 2, name, "unavailable: %s%s", why ? why : "",
                       !strcmp(name, "rdma") ? " (transfers go over TCP)" : "");
        }
        t = json_object_get(info, "openFilesLimit");
        if (json_is_string(t)) {
            unsigned long long n = strtoull(json_string_value(t), NULL, 10);
            report(&d, n < 8192 ? 1 : 0, "open-files", "the daemon may open %llu descriptors%s", n,
                   n < 8192 ? ": few for a node's clients, peers and data connections; raise its "
                              "hard limit (LimitNOFILE= for systemd, ulimit -Hn, the container "
                              "runtime's nofile)"
                            : "");
        }
    } else {
        report(&d, 2, "daemon",
               "%s does not answer Daemon/Info (see the error above): is it "
               "running, and are --target and the credentials right?",
               c->copt.target);
    }
    /* this node */
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY)
            report(&d, 0, "memlock", "unlimited");
        else {
            human_bytes(a, sizeof(a), (double)rl.rlim_cur);
            report(&d, rl.rlim_cur < (64ULL << 20) ? 1 : 0, "memlock",
                   "%s locked memory per process%s", a,
                   rl.rlim_cur < (64ULL << 20)
                       ? ": too little to pin a pool for RDMA; raise it (LimitMEMLOCK=infinity "
                         "for containerd or systemd, ulimit -l) or give the daemon CAP_IPC_LOCK"
                       : "");
        }
    }
    if (statvfs(shm_dir, &vfs) == 0) {
        human_bytes(a, sizeof(a), (double)vfs.f_bavail * (double)vfs.f_frsize);
        human_bytes(b, sizeof(b), (double)vfs.f_blocks * (double)vfs.f_frsize);
        report(&d, access(shm_dir, W_OK) == 0 ? 0 : 1, "shm-dir", "%s: %s free of %s%s", shm_dir, a,
               b, access(shm_dir, W_OK) == 0 ? "" : " (not writable by this user)");
    } else {
        report(&d, 1, "shm-dir", "%s: %s (the daemon creates it at start)", shm_dir,
               strerror(errno));
    }
    {
        char fs[160];
        int huge = mg_shm_pages(shm_dir, fs, sizeof(fs));
        if (huge == 1)
            report(&d, 0, "shm-pages", "%s: huge pages", fs);
        else if (huge == 0)
            report(&d, 1, "shm-pages",
                   "%s: 4 KiB pages; every pass over a segment pays a TLB miss per page, the "
                   "first one a fault per page (benchmarks.md: 18%% faster 1 GiB WRITEs, 4x "
                   "faster first passes with huge pages): mount it tmpfs huge=within_size",
                   fs);
    }
    {
        DIR *dir = opendir("/sys/class/infiniband");
        struct dirent *e;
        int n = 0;
        while (dir && (e = readdir(dir)) != NULL) {
            char state[64] = "", gid[64] = "";
            if (e->d_name[0] == '.')
                continue;
            n++;
            read_line(e->d_name, "state", state, sizeof(state));
            read_line(e->d_name, "gids/0", gid, sizeof(gid));
            report(&d, strstr(state, "ACTIVE") ? 0 : 1, "rdma-device", "%s port 1 %s, GID 0 %s%s",
                   e->d_name, state[0] ? state : "unknown", gid[0] ? gid : "none",
                   strstr(state, "ACTIVE") ? "" : ": the link is down; check the cable and switch");
        }
        if (dir)
            closedir(dir);
        if (n == 0)
            report(&d, 1, "rdma-device",
                   "no RDMA device on this node (/sys/class/infiniband is empty): transfers go "
                   "over TCP");
    }
    if (c->copt.ca_file)
        check_cert(&d, "ca", c->copt.ca_file);
    if (c->copt.cert_file)
        check_cert(&d, "client-cert", c->copt.cert_file);
    /* peers this daemon talks to */
    if (info && call_json(c, "Transfer/ListPeers", json_object(), &peers) == MG_GRPC_OK) {
        json_array_foreach(json_object_get(peers, "peers"), i, t)
        {
            const char *state = json_string_value(json_object_get(t, "state"));
            const char *err = json_string_value(json_object_get(t, "lastError"));
            int bad = state && !strcmp(state, "PEER_FAILED");
            report(&d, bad ? 2 : 0, "peer", "%s (%s): %s%s%s",
                   json_string_value(json_object_get(t, "address")),
                   json_string_value(json_object_get(t, "tenant")), state ? state : "?",
                   bad && err ? ": " : "", bad && err ? err : "");
        }
        if (json_array_size(json_object_get(peers, "peers")) == 0)
            report(&d, 0, "peer", "no peers contacted yet");
    }
    if (c->json) {
        json_t *out =
            json_pack("{s:o,s:i,s:i}", "checks", d.checks, "failed", d.fails, "warnings", d.warns);
        dump(out);
        json_decref(out);
    } else {
        json_decref(d.checks);
        printf("%d failed, %d warnings\n", d.fails, d.warns);
    }
    json_decref(info);
    json_decref(peers);
    return d.fails ? MG_GRPC_FAILED_PRECONDITION : 0;
}
