/* mg_admit: the peer, caller and rate gates (mg_admit.h). */
#include "mg_admit.h"
#include "mg_server_int.h"

#include "mg_ratelim.h"
#include "mg_str.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int refuse(mg_verdict *v, mg_admit_why why, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int refuse(mg_verdict *v, mg_admit_why why, int code, const char *fmt, ...)
{
    va_list ap;
    v->why = why;
    v->code = code;
    va_start(ap, fmt);
    vsnprintf(v->message, sizeof(v->message), fmt, ap);
    va_end(ap);
    return -1;
}

static int admit(mg_verdict *v)
{
    v->why = MG_ADMIT_OK;
    v->code = 0;
    v->message[0] = '\0';
    return 0;
}

int mg_admit_peer(const mg_config *cfg, const mg_admit_req *r, mg_verdict *v)
{
    const mg_tls_id *id = r->id;
    if (!r->peer_only || cfg->peer_anonymous)
        return admit(v);
    if (r->kind != CONN_TLS || cfg->peer_ca[0] == '\0' || id == NULL)
        return refuse(v, MG_ADMIT_UNAUTHENTICATED, MG_GRPC_UNAUTHENTICATED,
                      "%.200s is for peer daemons: %s", r->path,
                      r->kind != CONN_TLS
                          ? "call it over TLS with a certificate from --peer-ca (this daemon "
                            "does not run with --peer-anonymous)"
                          : "this daemon has no --peer-ca to check their certificates against");
    if (id->state == MG_TLS_ID_NONE)
        return refuse(v, MG_ADMIT_UNAUTHENTICATED, MG_GRPC_UNAUTHENTICATED,
                      "%.200s is for peer daemons: no client certificate", r->path);
    if (id->state != MG_TLS_ID_VERIFIED)
        return refuse(v, MG_ADMIT_UNAUTHENTICATED, MG_GRPC_UNAUTHENTICATED,
                      "%.200s is for peer daemons: the client certificate does not chain to "
                      "--peer-ca (%.127s)",
                      r->path, id->reason);
    if (cfg->peer_allow[0] && !mg_tls_id_in(id, cfg->peer_allow))
        return refuse(v, MG_ADMIT_DENIED, MG_GRPC_PERMISSION_DENIED,
                      "peer \"%s\" is not in --peer-allow", id->name);
    return admit(v);
}

int mg_admit_caller(const mg_config *cfg, const mg_auth *auth, const mg_admit_req *r,
                    mg_principal *who, mg_verdict *v)
{
    const mg_tls_id *id = r->kind == CONN_TLS ? r->id : NULL;
    if (r->peer_only || r->open)
        return admit(v);
    if (r->auth_header < 0)
        return refuse(v, MG_ADMIT_UNAUTHENTICATED, MG_GRPC_UNAUTHENTICATED,
                      "the authorization header is not \"Bearer TOKEN\" (or came twice)");
    if (r->auth_header > 0) {
        if (mg_auth_by_token(auth, r->bearer_hash, who) == 0)
            return admit(v);
        return refuse(v, MG_ADMIT_UNAUTHENTICATED, MG_GRPC_UNAUTHENTICATED, "%s",
                      auth ? "the bearer token is not in --auth-file"
                           : "bearer token given, but this daemon has no --auth-file");
    }
    if (id && id->client_state == MG_TLS_ID_VERIFIED) {
        if (mg_auth_by_cert(auth, id->names, who) == 0)
            return admit(v);
        return refuse(v, MG_ADMIT_DENIED, MG_GRPC_PERMISSION_DENIED,
                      "client certificate \"%s\" chains to --client-ca but names no tenant in "
                      "--auth-file",
                      id->name);
    }
    if (r->kind == CONN_UNIX && r->has_uid && mg_auth_by_uid(auth, r->uid, who) == 0)
        return admit(v);
    if (cfg->allow_anonymous) {
        mg_strlcpy(who->tenant, "default", sizeof(who->tenant));
        who->admin = 0;
        who->how = "anonymous";
        return admit(v);
    }
    if (id && id->client_state == MG_TLS_ID_REFUSED)
        return refuse(v, MG_ADMIT_UNAUTHENTICATED, MG_GRPC_UNAUTHENTICATED,
                      "the client certificate does not chain to --client-ca (%.127s)",
                      id->client_reason);
    return refuse(v, MG_ADMIT_UNAUTHENTICATED, MG_GRPC_UNAUTHENTICATED,
                  "no credentials: send \"authorization: Bearer TOKEN\"%s (this daemon does not "
                  "run with --allow-anonymous)",
                  cfg->client_ca[0] ? " or a client certificate from --client-ca" : "");
}

/* A limiter per tenant seen, bursts of one second's worth. A list: tenants are few. */
struct mg_rates {
    char tenant[MG_TENANT_MAX + 1];
    mg_ratelim lim;
    struct mg_rates *next;
};

int mg_admit_rate(const mg_config *cfg, mg_rates **rates, const mg_admit_req *r, const char *tenant,
                  uint64_t now_ns, mg_verdict *v)
{
    mg_rates *e;
    if (cfg->tenant_rate == 0 || r->peer_only || r->open)
        return admit(v);
    for (e = *rates; e && strcmp(e->tenant, tenant) != 0; e = e->next)
        ;
    if (e == NULL) {
        if ((e = calloc(1, sizeof(*e))) == NULL)
            return admit(v); /* out of memory: the quota is not what fails */
        mg_strlcpy(e->tenant, tenant, sizeof(e->tenant));
        mg_ratelim_init(&e->lim, cfg->tenant_rate, cfg->tenant_rate, now_ns);
        e->next = *rates;
        *rates = e;
    }
    if (mg_ratelim_take(&e->lim, now_ns) == 0)
        return admit(v);
    return refuse(
        v, MG_ADMIT_RATE, MG_GRPC_RESOURCE_EXHAUSTED,
        "quota exceeded: tenant \"%s\" is over its rate of %llu calls per second (--tenant-rate)",
        tenant, (unsigned long long)cfg->tenant_rate);
}

void mg_rates_del(mg_rates *rates)
{
    while (rates) {
        mg_rates *e = rates;
        rates = e->next;
        free(e);
    }
}
