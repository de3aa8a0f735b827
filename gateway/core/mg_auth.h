/*
 * mg_auth: who a caller is and which tenant it acts for.
 *
 * The --auth-file maps credentials to tenants, one principal per line:
 *
 *     # kind   credential              tenant   [admin]
 *     token    sha256:<64 hex digits>  team-a
 *     cert     client-a.example.com    team-a
 *     uid      1000                    team-b   admin
 *
 * `token`: the SHA-256 of a bearer token (clients send "authorization: Bearer TOKEN"; the file
 * never holds the token itself). `cert`: a client certificate identity (its CN, DNS or URI
 * name) from a certificate that chains to --client-ca. `uid`: a local process on the Unix
 * socket, by the user id the kernel reports for it. `admin` callers may list and revoke every
 * tenant's resources. Tenants are [A-Za-z0-9._:-], 1..128 bytes.
 *
 * A table is immutable once parsed: the daemon builds a new one when the file changes and swaps
 * it on its loop thread. Pure functions; no I/O here.
 */
#ifndef MG_AUTH_H
#define MG_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define MG_TENANT_MAX     128
#define MG_AUTH_HASH_LEN  32
#define MG_AUTH_MAX_LINES 65536

typedef enum { MG_AUTH_TOKEN = 1, MG_AUTH_CERT = 2, MG_AUTH_UID = 3 } mg_auth_kind;

/* The caller of one call, once authenticated. */
typedef struct mg_principal {
    char tenant[MG_TENANT_MAX + 1];
    int admin;
    const char *how; /* "token", "cert", "uid", "anonymous": static strings, for logs */
} mg_principal;

typedef struct mg_auth mg_auth;

/* Parses an auth file's text. Returns the table, or NULL with err naming the line and what is
 * wrong with it ("line 3: tenant \"a b\" is not [A-Za-z0-9._:-]"). */
mg_auth *mg_auth_parse(const char *text, size_t len, char *err, size_t errcap);
void mg_auth_free(mg_auth *auth);
/* Principals in the table (for logs and metrics). */
size_t mg_auth_count(const mg_auth *auth);

/* The SHA-256 of a bearer token. */
void mg_auth_hash(const char *token, size_t len, uint8_t out[MG_AUTH_HASH_LEN]);
/* Looks a credential up: 0 and *out filled, or -1 when the table does not know it. `names` is a
 * certificate's names, each followed by '\n' (the first listed one wins). */
int mg_auth_by_token(const mg_auth *auth, const uint8_t hash[MG_AUTH_HASH_LEN], mg_principal *out);
int mg_auth_by_cert(const mg_auth *auth, const char *names, mg_principal *out);
int mg_auth_by_uid(const mg_auth *auth, uint32_t uid, mg_principal *out);

/* Non-zero when s is a valid tenant name. */
int mg_tenant_ok(const char *s, size_t len);

#endif
