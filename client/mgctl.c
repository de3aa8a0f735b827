/*
 * mgctl: the moongate command-line client, built on the C client library.
 *
 *   mgctl [options] health [SERVICE] [--watch]
 *   mgctl [options] info | status | doctor
 *   mgctl [options] segments | leases | pools | peers | agents | expectations | transfers |
 *                   watch ...
 *   mgctl [options] call METHOD [JSON | -]
 *
 * Human output by default, --json for machines. The exit code is the call's gRPC status code
 * (0 OK, 4 DEADLINE_EXCEEDED, 14 UNAVAILABLE, ...); 64 for a usage error.
 */
#include "mg_client.h"
#include "mg_json.h"

#include "grpc/health/v1/health.pb-c.h"
#include "moongate/v1/agent.pb-c.h"
#include "moongate/v1/daemon.pb-c.h"
#include "moongate/v1/debug.pb-c.h"
#include "moongate/v1/memory.pb-c.h"
#include "moongate/v1/notify.pb-c.h"
#include "moongate/v1/peer.pb-c.h"
#include "moongate/v1/pool.pb-c.h"
#include "moongate/v1/transfer.pb-c.h"

#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_USAGE 64

static const ProtobufCServiceDescriptor *const services[] = {
    &grpc__health__v1__health__descriptor, &moongate__v1__daemon__descriptor,
    &moongate__v1__memory__descriptor,     &moongate__v1__pool__descriptor,
    &moongate__v1__transfer__descriptor,   &moongate__v1__notify__descriptor,
    &moongate__v1__peer__descriptor,       &moongate__v1__debug__descriptor,
    &moongate__v1__agent__descriptor,
};

typedef struct {
    mg_client_options copt;
    uint64_t timeout_ms;
    int json;
} ctl;

static void usage(FILE *f)
{
    fprintf(f, "Usage: mgctl [OPTIONS] COMMAND [ARGS]\n\n"
               "Commands:\n"
               "  health [SERVICE] [--watch]  serving status of the daemon (or of one service);\n"
               "                              --watch streams every change\n"
               "  info                        version, epoch, uptime, state, features, transports\n"
               "  status                      the daemon at a glance: transports, pools, peers\n"
               "  doctor [--shm-dir DIR]      checks this node and the daemon (memlock, shm\n"
               "                              space, RDMA devices and GIDs, certificate expiry,\n"
               "                              peers) and says what to fix\n"
               "  segments [list]             the caller's segments (an admin: everyone's)\n"
               "  segments get ID | unregister ID | register NAME SIZE [--remote]\n"
               "  segments register-file NAME PATH [--remote]  a file this user can open\n"
               "                              read-write (tmpfs, a memfd's /proc/PID/fd/N),\n"
               "                              passed as a descriptor and registered where it\n"
               "                              lies (unix: targets)\n"
               "  leases [list]               the caller's leases\n"
               "  leases get ID | release ID | acquire SIZE [--ttl MS] [--remote]\n"
               "  pools                       buffer pool usage\n"
               "  peers                       peer daemons this one talks to\n"
               "  agents [list]               the tenant's agents on this daemon\n"
               "  agents describe AGENT [PEER]  an agent (\"host:port\", or a name on PEER) and\n"
               "                              its regions\n"
               "  expectations [list]         what this daemon's receivers wait for: topic, the\n"
               "                              sender, its last answer, time to the deadline\n"
               "  expectations cancel ID      take one back (Notify/Unexpect)\n"
               "  transfers get ID | cancel ID | wait ID\n"
               "                              a batch; wait follows it with a progress bar\n"
               "  watch TOPIC                 notifications of TOPIC as they arrive\n"
               "  call METHOD [JSON|-]        call any unary method with a JSON request (argument\n"
               "                              or standard input) and print the JSON response;\n"
               "                              METHOD is Service/Method or /pkg.Service/Method\n"
               "  methods                     list the methods `call` knows\n\n"
               "Options (environment in brackets):\n"
               "  --target ADDR     host:port, [v6]:port or unix:/path [MOONGATE_TARGET]\n"
               "                    default unix:/run/moongate/moongate.sock\n"
               "  --tls             TLS with ALPN h2 (default for host:port targets)\n"
               "  --plaintext       h2c with prior knowledge (default for unix: targets)\n"
               "  --ca FILE         CA that signed the daemon's certificate [MOONGATE_CA]\n"
               "  --cert FILE       client certificate [MOONGATE_CERT]\n"
               "  --key FILE        client key [MOONGATE_KEY]\n"
               "  --token-file FILE bearer token to send (first line of FILE) [MOONGATE_TOKEN\n"
               "                    holds the token itself]\n"
               "  --server-name N   name expected in the daemon's certificate\n"
               "  --insecure        do not verify the daemon's certificate\n"
               "  --timeout MS      deadline of the call, default 10000 (0: none)\n"
               "  --json            machine-readable output\n"
               "  --help\n\n"
               "Exit status: the call's gRPC status code (0 OK; a batch that did not end DONE:\n"
               "10 ABORTED; doctor with a failed check: 9 FAILED_PRECONDITION); 64 for usage\n"
               "errors.\n");
}

/* The first line of a token file (a Kubernetes Secret mounted as a file, say): tokens are not
 * given on the command line, where every user of the machine can read them. */
static int read_token(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n;
    if (f == NULL || fgets(out, (int)cap, f) == NULL) {
        fprintf(stderr, "mgctl: cannot read a token from %s\n", path);
        if (f)
            fclose(f);
        return -1;
    }
    fclose(f);
    n = strcspn(out, "\r\n");
    out[n] = '\0';
    if (n == 0) {
        fprintf(stderr, "mgctl: %s holds no token\n", path);
        return -1;
    }
    return 0;
}

static int report_error(const ctl *c, int status, const char *message)
{
    if (c->json) {
        json_t *j = json_pack("{s:i,s:s,s:s}", "code", status, "status", mg_grpc_code_name(status),
                              "message", message ? message : "");
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        printf("%s\n", s ? s : "{}");
        free(s);
        json_decref(j);
    } else {
        fprintf(stderr, "mgctl: %s: %s\n", mg_grpc_code_name(status), message ? message : "");
    }
    return status;
}

/* Packs msg, calls path, unpacks the reply as `out`. Returns the gRPC status. */
static int unary(const ctl *c, const char *path, const ProtobufCMessage *msg,
                 const ProtobufCMessageDescriptor *out, ProtobufCMessage **reply)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(len ? len : 1), *resp = NULL;
    size_t resp_len = 0;
    int status = MG_GRPC_UNKNOWN;
    char *message = NULL, err[256];

    *reply = NULL;
    if (buf == NULL)
        return report_error(c, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    protobuf_c_message_pack(msg, buf);
    if (mg_client_unary(&c->copt, path, buf, len, c->timeout_ms, &resp, &resp_len, &status,
                        &message, err, sizeof(err)) != 0) {
        free(buf);
        return report_error(c, MG_GRPC_UNAVAILABLE, err);
    }
    free(buf);
    if (status != MG_GRPC_OK) {
        report_error(c, status, message);
        free(message);
        return status;
    }
    free(message);
    *reply = protobuf_c_message_unpack(out, NULL, resp_len, resp);
    free(resp);
    if (*reply == NULL)
        return report_error(c, MG_GRPC_INTERNAL, "could not decode the response");
    return MG_GRPC_OK;
}

static void print_json(const ProtobufCMessage *m)
{
    json_t *j = mg_json_from_message(m);
    char *s = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    printf("%s\n", s ? s : "{}");
    free(s);
    json_decref(j);
}

static const char *status_name(int st)
{
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
        &grpc__health__v1__health_check_response__serving_status__descriptor, st);
    return v ? v->name : "UNKNOWN";
}

/* ---- health --watch: a server-streaming call on the client's event loop ---- */

typedef struct {
    const ctl *c;
    struct event_base *base;
    int status;
} watch_state;

static void watch_msg(mg_rpc *rpc, const uint8_t *msg, size_t len, void *arg)
{
    watch_state *w = arg;
    Grpc__Health__V1__HealthCheckResponse *r =
        grpc__health__v1__health_check_response__unpack(NULL, len, msg);
    if (r == NULL)
        return;
    if (w->c->json)
        print_json(&r->base);
    else
        printf("%s\n", status_name(r->status));
    fflush(stdout);
    grpc__health__v1__health_check_response__free_unpacked(r, NULL);
}

static void watch_close(mg_rpc *rpc, int status, const char *message, void *arg)
{
    watch_state *w = arg;
    w->status = status;
    if (status != MG_GRPC_OK)
        report_error(w->c, status, message);
    event_base_loopbreak(w->base);
}

static int cmd_watch(const ctl *c, const char *service)
{
    static const mg_rpc_handlers h = {watch_msg, watch_close};
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    watch_state w = {c, event_base_new(), MG_GRPC_UNAVAILABLE};
    mg_client *cl;
    mg_rpc *rpc;
    char err[256];
    uint8_t buf[512];
    size_t len;

    if (w.base == NULL)
        return report_error(c, MG_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    req.service = (char *)(uintptr_t)service;
    if (protobuf_c_message_get_packed_size(&req.base) > sizeof(buf)) {
        event_base_free(w.base);
        return report_error(c, MG_GRPC_INVALID_ARGUMENT, "service name too long");
    }
    len = protobuf_c_message_pack(&req.base, buf);
    if (mg_client_new(&cl, w.base, &c->copt, err, sizeof(err)) != 0) {
        event_base_free(w.base);
        return report_error(c, MG_GRPC_UNAVAILABLE, err);
    }
    rpc = mg_rpc_start(cl, "/grpc.health.v1.Health/Watch", NULL, 0, c->timeout_ms, &h, &w);
    if (rpc) {
        mg_rpc_send(rpc, buf, len);
        mg_rpc_close_send(rpc);
        event_base_dispatch(w.base);
    }
    mg_client_del(cl);
    event_base_loop(w.base, EVLOOP_NONBLOCK); /* deferred frees of the connection */
    event_base_free(w.base);
    /* A watch that ran into its own deadline ended as asked. */
    return w.status == MG_GRPC_DEADLINE_EXCEEDED ? 0 : w.status;
}

static int cmd_health(const ctl *c, const char *service)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    ProtobufCMessage *reply;
    int st;
    req.service = (char *)(uintptr_t)service;
    st = unary(c, "/grpc.health.v1.Health/Check", &req.base,
               &grpc__health__v1__health_check_response__descriptor, &reply);
    if (st != MG_GRPC_OK)
        return st;
    {
        Grpc__Health__V1__HealthCheckResponse *r = (void *)reply;
        int serving = r->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
        if (c->json)
            print_json(reply);
        else
            printf("%s\n", status_name(r->status));
        protobuf_c_message_free_unpacked(reply, NULL);
        return serving ? 0 : MG_GRPC_UNAVAILABLE;
    }
}

static int cmd_info(const ctl *c)
{
    Moongate__V1__InfoRequest req = MOONGATE__V1__INFO_REQUEST__INIT;
    ProtobufCMessage *reply;
    Moongate__V1__InfoResponse *r;
    int st = unary(c, "/moongate.v1.Daemon/Info", &req.base,
                   &moongate__v1__info_response__descriptor, &reply);
    if (st != MG_GRPC_OK)
        return st;
    if (c->json) {
        print_json(reply);
        protobuf_c_message_free_unpacked(reply, NULL);
        return 0;
    }
    r = (void *)reply;
    printf("version     %s\n", r->version);
    printf("epoch       %" PRIu64 "\n", r->epoch); /* decimal, as JSON shows it */
    printf("state       %s\n", r->state);
    printf("uptime      %.1f s\n", (double)r->uptime_ms / 1000.0);
    printf("workers     %u (queue depth %u)\n", r->workers, r->worker_queue_depth);
    printf("open files  %" PRIu64 " at most\n", r->open_files_limit);
    printf("features   ");
    for (size_t i = 0; i < r->n_features; i++)
        printf(" %s", r->features[i]);
    printf("\n");
    for (size_t i = 0; i < r->n_transports; i++) {
        printf("transport   %-5s %s%s%s%s%s\n", r->transports[i]->name,
               r->transports[i]->available ? "available" : "unavailable",
               r->transports[i]->endpoint[0] ? " at " : "", r->transports[i]->endpoint,
               r->transports[i]->reason[0] ? ": " : "", r->transports[i]->reason);
        for (size_t k = 0; k < r->transports[i]->n_devices; k++)
            printf("            device %s\n", r->transports[i]->devices[k]);
    }
    protobuf_c_message_free_unpacked(reply, NULL);
    return 0;
}

static const ProtobufCMethodDescriptor *find_method(const char *name, char *path, size_t cap)
{
    const char *p = name[0] == '/' ? name + 1 : name;
    for (size_t s = 0; s < sizeof(services) / sizeof(services[0]); s++) {
        const ProtobufCServiceDescriptor *sd = services[s];
        for (unsigned m = 0; m < sd->n_methods; m++) {
            char full[256], shortname[256];
            const char *dot = strrchr(sd->name, '.');
            snprintf(full, sizeof(full), "%s/%s", sd->name, sd->methods[m].name);
            snprintf(shortname, sizeof(shortname), "%s/%s", dot ? dot + 1 : sd->name,
                     sd->methods[m].name);
            if (!strcmp(p, full) || !strcmp(p, shortname)) {
                snprintf(path, cap, "/%s", full);
                return &sd->methods[m];
            }
        }
    }
    return NULL;
}

static int cmd_methods(void)
{
    for (size_t s = 0; s < sizeof(services) / sizeof(services[0]); s++) {
        for (unsigned m = 0; m < services[s]->n_methods; m++)
            printf("/%s/%s\n", services[s]->name, services[s]->methods[m].name);
    }
    return 0;
}

static int cmd_call(const ctl *c, const char *method, const char *text)
{
    char path[300], err[512];
    const ProtobufCMethodDescriptor *md = find_method(method, path, sizeof(path));
    json_error_t jerr;
    json_t *j;
    ProtobufCMessage *req, *reply;
    int st;

    if (md == NULL) {
        fprintf(stderr, "mgctl: unknown method \"%s\" (see `mgctl methods`)\n", method);
        return EXIT_USAGE;
    }
    if (text == NULL)
        text = "{}";
    if (!strcmp(text, "-"))
        j = json_loadf(stdin, 0, &jerr);
    else
        j = json_loads(text, 0, &jerr);
    if (j == NULL) {
        fprintf(stderr, "mgctl: invalid JSON at line %d column %d: %s\n", jerr.line, jerr.column,
                jerr.text);
        return EXIT_USAGE;
    }
    req = mg_json_to_message(md->input, j, err, sizeof(err));
    json_decref(j);
    if (req == NULL) {
        fprintf(stderr, "mgctl: %s\n", err);
        return EXIT_USAGE;
    }
    st = unary(c, path, req, md->output, &reply);
    protobuf_c_message_free_unpacked(req, NULL);
    if (st != MG_GRPC_OK)
        return st;
    print_json(reply);
    protobuf_c_message_free_unpacked(reply, NULL);
    return 0;
}

#include "mgctl_res.c"

int main(int argc, char **argv)
{
    ctl c;
    int tls = -1, watch = 0, remote = 0, i;
    uint64_t ttl = 0;
    const char *args[5] = {NULL, NULL, NULL, NULL, NULL};
    const char *shm_dir = "/dev/shm/moongate";
    int nargs = 0;
    const char *target = getenv("MOONGATE_TARGET");
    static char token[1100];

    signal(SIGPIPE, SIG_IGN);
    memset(&c, 0, sizeof(c));
    c.timeout_ms = 10000;
    c.copt.ca_file = getenv("MOONGATE_CA");
    c.copt.cert_file = getenv("MOONGATE_CERT");
    c.copt.key_file = getenv("MOONGATE_KEY");
    c.copt.token = getenv("MOONGATE_TOKEN");
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
#define NEXT()                                               \
    do {                                                     \
        if (i + 1 >= argc) {                                 \
            fprintf(stderr, "mgctl: %s needs a value\n", a); \
            return EXIT_USAGE;                               \
        }                                                    \
    } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--target")) {
            NEXT();
            target = argv[++i];
        } else if (!strcmp(a, "--tls")) {
            tls = 1;
        } else if (!strcmp(a, "--plaintext")) {
            tls = 0;
        } else if (!strcmp(a, "--ca")) {
            NEXT();
            c.copt.ca_file = argv[++i];
        } else if (!strcmp(a, "--cert")) {
            NEXT();
            c.copt.cert_file = argv[++i];
        } else if (!strcmp(a, "--key")) {
            NEXT();
            c.copt.key_file = argv[++i];
        } else if (!strcmp(a, "--token-file")) {
            NEXT();
            if (read_token(argv[++i], token, sizeof(token)) != 0)
                return EXIT_USAGE;
            c.copt.token = token;
        } else if (!strcmp(a, "--server-name")) {
            NEXT();
            c.copt.server_name = argv[++i];
        } else if (!strcmp(a, "--insecure")) {
            c.copt.insecure = 1;
        } else if (!strcmp(a, "--timeout")) {
            char *end;
            NEXT();
            c.timeout_ms = strtoull(argv[++i], &end, 10);
            if (*end != '\0') {
                fprintf(stderr, "mgctl: --timeout takes milliseconds\n");
                return EXIT_USAGE;
            }
        } else if (!strcmp(a, "--json")) {
            c.json = 1;
        } else if (!strcmp(a, "--watch")) {
            watch = 1;
        } else if (!strcmp(a, "--remote")) {
            remote = 1;
        } else if (!strcmp(a, "--shm-dir")) {
            NEXT();
            shm_dir = argv[++i];
        } else if (!strcmp(a, "--ttl")) {
            char *end;
            NEXT();
            ttl = strtoull(argv[++i], &end, 10);
            if (*end != '\0') {
                fprintf(stderr, "mgctl: --ttl takes milliseconds\n");
                return EXIT_USAGE;
            }
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "mgctl: unknown option %s (see --help)\n", a);
            return EXIT_USAGE;
        } else if (nargs < 5) {
            args[nargs++] = a;
        } else {
            fprintf(stderr, "mgctl: too many arguments (see --help)\n");
            return EXIT_USAGE;
        }
#undef NEXT
    }
    if (nargs == 0) {
        usage(stderr);
        return EXIT_USAGE;
    }
    c.copt.target = target && *target ? target : "unix:/run/moongate/moongate.sock";
    c.copt.tls = tls >= 0 ? tls : strncmp(c.copt.target, "unix:", 5) != 0;

    if (!strcmp(args[0], "health")) {
        if (nargs > 2) {
            usage(stderr);
            return EXIT_USAGE;
        }
        return watch ? cmd_watch(&c, args[1] ? args[1] : "")
                     : cmd_health(&c, args[1] ? args[1] : "");
    }
    if (!strcmp(args[0], "info") && nargs == 1)
        return cmd_info(&c);
    if (!strcmp(args[0], "methods") && nargs == 1)
        return cmd_methods();
    if (!strcmp(args[0], "call") && nargs >= 2 && nargs <= 3)
        return cmd_call(&c, args[1], args[2]);
    if (!strcmp(args[0], "status") && nargs == 1)
        return cmd_status(&c);
    if (!strcmp(args[0], "doctor") && nargs == 1)
        return cmd_doctor(&c, shm_dir);
    if (!strcmp(args[0], "segments"))
        return cmd_segments(&c, args[1], args[2], args[3], remote);
    if (!strcmp(args[0], "leases"))
        return cmd_leases(&c, args[1], args[2], ttl, remote);
    if (!strcmp(args[0], "pools") && nargs == 1)
        return cmd_pools(&c);
    if (!strcmp(args[0], "peers") && nargs == 1)
        return cmd_peers(&c);
    if (!strcmp(args[0], "agents") && nargs <= 4)
        return cmd_agents(&c, args[1], args[2], args[3]);
    if (!strcmp(args[0], "expectations") && nargs <= 3)
        return cmd_expectations(&c, args[1], args[2]);
    if (!strcmp(args[0], "transfers"))
        return cmd_transfers(&c, args[1], args[2]);
    if (!strcmp(args[0], "watch") && nargs == 2)
        return cmd_watch_topic(&c, args[1]);
    fprintf(stderr, "mgctl: unknown command or wrong arguments: %s (see --help)\n", args[0]);
    return EXIT_USAGE;
}
