/*
 * mg_admit: who may make a call, decided before its handler runs. Three gates, in order:
 *
 *   peer     a peer-only method (the peer API) needs a client certificate that chains to
 *            --peer-ca and, with --peer-allow, names an allowed peer (or --peer-anonymous);
 *   caller   every other method but the open ones (health, reflection) needs a principal of
 *            --auth-file: a bearer token, then a certificate from --client-ca, then the Unix
 *            socket's uid; without any, --allow-anonymous makes it tenant "default".
 *            Credentials that are presented but wrong never fall back to anonymous;
 *   rate     the caller's tenant is within --tenant-rate.
 *
 * Each gate takes what the connection and the request headers said (mg_admit_req) and returns a
 * verdict; only mg_call.c finishes calls. The rate table is the one piece of state. Loop thread.
 */
#ifndef MG_ADMIT_H
#define MG_ADMIT_H

#include "mg_auth.h"
#include "mg_config.h"
#include "mg_gateway.h"
#include "mg_tls.h"

#include <stdint.h>

typedef struct mg_admit_req {
    int kind;            /* conn_kind: CONN_TLS, CONN_H2C or CONN_UNIX */
    const mg_tls_id *id; /* TLS: the connection's certificate identities */
    int has_uid;         /* Unix socket: the kernel told the caller's uid */
    uint32_t uid;
    int auth_header;            /* 0 none, 1 a bearer token (bearer_hash), -1 malformed */
    const uint8_t *bearer_hash; /* SHA-256 of the token */
    const char *path;           /* the method's path, for messages */
    int open;                   /* the method is open to all (health, reflection) */
    int peer_only;              /* the method is the peer API's */
} mg_admit_req;

typedef enum {
    MG_ADMIT_OK = 0,
    MG_ADMIT_UNAUTHENTICATED, /* no or unknown credentials */
    MG_ADMIT_DENIED,          /* a known identity that may not call this */
    MG_ADMIT_RATE,            /* over --tenant-rate */
} mg_admit_why;

typedef struct mg_verdict {
    mg_admit_why why;
    int code;          /* the gRPC status when refused, 0 when admitted */
    char message[512]; /* why it was refused, naming what to send or which limit */
} mg_verdict;

typedef struct mg_rates mg_rates; /* --tenant-rate: a limiter per tenant seen */

/* Returns 0 (admitted) or -1 with v set. */
int mg_admit_peer(const mg_config *cfg, const mg_admit_req *r, mg_verdict *v);
/* Returns 0 and the caller in *who (its tenant and role), or -1 with v set. Open and peer-only
 * methods are admitted without a principal (*who is left as it is). */
int mg_admit_caller(const mg_config *cfg, const mg_auth *auth, const mg_admit_req *r,
                    mg_principal *who, mg_verdict *v);
/* Returns 0, or -1 with v set when `tenant` is over cfg->tenant_rate at now_ns. The table grows
 * by the tenants seen (*rates: NULL at first). */
int mg_admit_rate(const mg_config *cfg, mg_rates **rates, const mg_admit_req *r, const char *tenant,
                  uint64_t now_ns, mg_verdict *v);
void mg_rates_del(mg_rates *rates);

#endif
