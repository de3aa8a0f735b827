/* Unit tests: admission verdicts (gateway/core/mg_admit) for every kind of caller, without a
 * daemon: the peer gate, the caller gate (token, certificate, uid, anonymous, wrong credentials
 * never falling back) and the per-tenant rate. */
#include "mg_admit.h"
#include "mg_server_int.h"
#include "mg_test.h"

#include <string.h>

#define SEC 1000000000ULL

static char empty[] = "", peer_ca[] = "/peer-ca.pem", client_ca[] = "/client-ca.pem",
            allow[] = "peer-a,peer-c";

static mg_config config(void)
{
    mg_config c;
    memset(&c, 0, sizeof(c));
    c.peer_ca = peer_ca;
    c.peer_allow = empty;
    c.client_ca = client_ca;
    return c;
}

static mg_auth *table(void)
{
    uint8_t h[MG_AUTH_HASH_LEN];
    char text[512], hex[2 * MG_AUTH_HASH_LEN + 1], err[256];
    mg_auth_hash("tok-a", 5, h);
    for (int i = 0; i < MG_AUTH_HASH_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", h[i]);
    snprintf(text, sizeof(text),
             "token sha256:%s team-a\ncert dev-client team-c\nuid 1000 team-u admin\n", hex);
    return mg_auth_parse(text, strlen(text), err, sizeof(err));
}

static mg_tls_id tls_id(int state, int client_state, const char *name)
{
    mg_tls_id id;
    memset(&id, 0, sizeof(id));
    id.state = state;
    id.client_state = client_state;
    snprintf(id.name, sizeof(id.name), "%s", name);
    snprintf(id.names, sizeof(id.names), "%s\n", name);
    snprintf(id.reason, sizeof(id.reason), "unable to get local issuer certificate");
    snprintf(id.client_reason, sizeof(id.client_reason), "certificate has expired");
    return id;
}

static void test_peer_gate(void)
{
    mg_config cfg = config();
    mg_verdict v;
    mg_tls_id ok = tls_id(MG_TLS_ID_VERIFIED, 0, "peer-a"),
              other = tls_id(MG_TLS_ID_VERIFIED, 0, "peer-b"), none = tls_id(MG_TLS_ID_NONE, 0, ""),
              bad = tls_id(MG_TLS_ID_REFUSED, 0, "x");
    mg_admit_req r = {
        .kind = CONN_TLS, .id = &ok, .path = "/moongate.v1.Peer/OpenSession", .peer_only = 1};
    CU_ASSERT_EQUAL(mg_admit_peer(&cfg, &r, &v), 0);
    r.id = &none;
    CU_ASSERT_EQUAL(mg_admit_peer(&cfg, &r, &v), -1);
    CU_ASSERT(v.code == MG_GRPC_UNAUTHENTICATED && strstr(v.message, "no client certificate"));
    r.id = &bad;
    CU_ASSERT_EQUAL(mg_admit_peer(&cfg, &r, &v), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(v.message, "does not chain to --peer-ca (unable to get"));
    r.kind = CONN_H2C; /* not over TLS */
    CU_ASSERT_EQUAL(mg_admit_peer(&cfg, &r, &v), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(v.message, "call it over TLS"));
    r.kind = CONN_TLS;
    cfg.peer_allow = allow;
    r.id = &other;
    CU_ASSERT_EQUAL(mg_admit_peer(&cfg, &r, &v), -1);
    CU_ASSERT(v.code == MG_GRPC_PERMISSION_DENIED && v.why == MG_ADMIT_DENIED);
    CU_ASSERT_STRING_EQUAL(v.message, "peer \"peer-b\" is not in --peer-allow");
    r.id = &ok;
    CU_ASSERT_EQUAL(mg_admit_peer(&cfg, &r, &v), 0);
    cfg.peer_ca = empty; /* no CA to check against */
    CU_ASSERT_EQUAL(mg_admit_peer(&cfg, &r, &v), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(v.message, "no --peer-ca"));
    cfg.peer_anonymous = 1;
    r.kind = CONN_UNIX;
    CU_ASSERT_EQUAL(mg_admit_peer(&cfg, &r, &v), 0);
    r.peer_only = 0; /* the gate is for the peer API only */
    cfg.peer_anonymous = 0;
    CU_ASSERT_EQUAL(mg_admit_peer(&cfg, &r, &v), 0);
}

static void test_caller_gate(void)
{
    mg_config cfg = config();
    mg_auth *auth = table();
    mg_verdict v;
    mg_principal who;
    uint8_t good[MG_AUTH_HASH_LEN], wrong[MG_AUTH_HASH_LEN];
    mg_tls_id cert = tls_id(0, MG_TLS_ID_VERIFIED, "dev-client"),
              unlisted = tls_id(0, MG_TLS_ID_VERIFIED, "dev-client-b"),
              expired = tls_id(0, MG_TLS_ID_REFUSED, "x"), plain = tls_id(0, 0, "");
    mg_admit_req r = {.kind = CONN_H2C, .path = "/moongate.v1.Memory/ListSegments"};
    CU_ASSERT_PTR_NOT_NULL_FATAL(auth);
    mg_auth_hash("tok-a", 5, good);
    mg_auth_hash("tok-x", 5, wrong);
    /* a token */
    r.auth_header = 1;
    r.bearer_hash = good;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, auth, &r, &who, &v), 0);
    CU_ASSERT(strcmp(who.tenant, "team-a") == 0 && strcmp(who.how, "token") == 0);
    /* a wrong token never falls back: not to the uid, not to anonymous */
    r.bearer_hash = wrong;
    r.kind = CONN_UNIX;
    r.has_uid = 1;
    r.uid = 1000;
    cfg.allow_anonymous = 1;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, auth, &r, &who, &v), -1);
    CU_ASSERT(v.code == MG_GRPC_UNAUTHENTICATED && strstr(v.message, "not in --auth-file"));
    r.auth_header = -1;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, auth, &r, &who, &v), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(v.message, "is not \"Bearer TOKEN\""));
    /* the uid on the socket */
    r.auth_header = 0;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, auth, &r, &who, &v), 0);
    CU_ASSERT(strcmp(who.tenant, "team-u") == 0 && who.admin);
    /* an unlisted uid: anonymous when allowed, else refused saying what to send */
    r.uid = 4242;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, auth, &r, &who, &v), 0);
    CU_ASSERT(strcmp(who.tenant, "default") == 0 && strcmp(who.how, "anonymous") == 0);
    cfg.allow_anonymous = 0;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, auth, &r, &who, &v), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(v.message, "no credentials: send \"authorization: Bearer"));
    CU_ASSERT_PTR_NOT_NULL(strstr(v.message, "or a client certificate from --client-ca"));
    /* a uid over TCP is not a principal: only the socket's is */
    r.kind = CONN_H2C;
    r.uid = 1000;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, auth, &r, &who, &v), -1);
    /* certificates */
    r.kind = CONN_TLS;
    r.id = &cert;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, auth, &r, &who, &v), 0);
    CU_ASSERT(strcmp(who.tenant, "team-c") == 0 && strcmp(who.how, "cert") == 0);
    r.id = &unlisted;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, auth, &r, &who, &v), -1);
    CU_ASSERT(v.code == MG_GRPC_PERMISSION_DENIED && strstr(v.message, "dev-client-b"));
    r.id = &expired;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, auth, &r, &who, &v), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(v.message, "does not chain to --client-ca (certificate has"));
    r.id = &plain;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, auth, &r, &who, &v), -1);
    /* open and peer-only methods need no principal */
    r.open = 1;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, auth, &r, &who, &v), 0);
    r.open = 0;
    r.peer_only = 1;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, auth, &r, &who, &v), 0);
    /* no --auth-file at all */
    r.peer_only = 0;
    r.auth_header = 1;
    r.bearer_hash = good;
    CU_ASSERT_EQUAL(mg_admit_caller(&cfg, NULL, &r, &who, &v), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(v.message, "this daemon has no --auth-file"));
    mg_auth_free(auth);
}

static void test_rate_gate(void)
{
    mg_config cfg = config();
    mg_rates *rates = NULL;
    mg_verdict v;
    mg_admit_req r = {.kind = CONN_H2C, .path = "/p"};
    int ok = 0;
    CU_ASSERT_EQUAL(mg_admit_rate(&cfg, &rates, &r, "a", 0, &v), 0); /* no --tenant-rate */
    CU_ASSERT_PTR_NULL(rates);
    cfg.tenant_rate = 5;
    for (int i = 0; i < 20; i++)
        ok += mg_admit_rate(&cfg, &rates, &r, "a", 10 * SEC, &v) == 0;
    CU_ASSERT_EQUAL(ok, 5);
    CU_ASSERT(v.why == MG_ADMIT_RATE && v.code == MG_GRPC_RESOURCE_EXHAUSTED);
    CU_ASSERT_STRING_EQUAL(v.message,
                           "quota exceeded: tenant \"a\" is over its rate of 5 calls per "
                           "second (--tenant-rate)");
    CU_ASSERT_EQUAL(mg_admit_rate(&cfg, &rates, &r, "b", 10 * SEC, &v), 0); /* its own */
    CU_ASSERT_EQUAL(mg_admit_rate(&cfg, &rates, &r, "a", 10 * SEC + SEC / 5, &v), 0);
    r.open = 1; /* health checks are not counted */
    for (int i = 0; i < 20; i++)
        CU_ASSERT_EQUAL(mg_admit_rate(&cfg, &rates, &r, "a", 10 * SEC + SEC / 5, &v), 0);
    mg_rates_del(rates);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_peer_gate),
        MG_TEST(test_caller_gate),
        MG_TEST(test_rate_gate),
    };
    return mg_test_run("admission", cases, sizeof(cases) / sizeof(cases[0]));
}
