/*
 * mg_tls: the control port's TLS context and what a client's certificate says. The core's own
 * (connections, admission, reload); no service or ops file includes it. Loop thread, but for
 * mg_tls_server_ctx, which a reload runs on a worker.
 */
#ifndef MG_TLS_H
#define MG_TLS_H

/* A server SSL_CTX (TLS 1.2+, ALPN h2). With peer_ca or client_ca (not "") it asks callers for a
 * certificate and checks it against each CA apart; the handshake goes on either way and the
 * results are read with mg_tls_identity(). Returns NULL after logging why. */
void *mg_tls_server_ctx(const char *cert, const char *key, const char *peer_ca,
                        const char *client_ca);
/* What a TLS connection's client certificate says, once the handshake is done. */
typedef struct mg_tls_id {
    int state;               /* against --peer-ca: MG_TLS_ID_NONE, _VERIFIED or _REFUSED */
    int client_state;        /* against --client-ca: the same (NONE without --client-ca) */
    char name[128];          /* the identity: CN, else the first DNS or URI SAN */
    char names[512];         /* every CN, DNS and URI name, each followed by '\n' */
    char reason[128];        /* state _REFUSED: OpenSSL's verification error */
    char client_reason[128]; /* client_state _REFUSED: the same */
} mg_tls_id;
enum { MG_TLS_ID_NONE = 0, MG_TLS_ID_VERIFIED = 1, MG_TLS_ID_REFUSED = 2 };
void mg_tls_identity(void *ssl, mg_tls_id *out);
/* Non-zero when one of id's names is in the comma-separated list. */
int mg_tls_id_in(const mg_tls_id *id, const char *list);
void mg_tls_ctx_free(void *ctx);

#endif
