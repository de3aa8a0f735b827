/*
 * mg_tls: the control port's TLS context. TLS 1.2 and 1.3 only, forward-secret AEAD ciphers,
 * ALPN selects h2 (gRPC clients refuse a connection without it). Built once at start-up on the
 * main thread; errors are logged with OpenSSL's reason so an operator can fix the files.
 */
#include "mg_tls.h"

#include "mg_bev_err.h"
#include "mg_log.h"

#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>

static int alpn_select_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                          const unsigned char *in, unsigned int inlen, void *arg)
{
    /* Walk the client's list for "h2". */
    for (unsigned i = 0; i < inlen;) {
        unsigned n = in[i];
        if (i + 1 + n > inlen)
            break;
        if (n == 2 && in[i + 1] == 'h' && in[i + 2] == '2') {
            *out = in + i + 1;
            *outlen = 2;
            return SSL_TLSEXT_ERR_OK;
        }
        i += 1 + n;
    }
    return SSL_TLSEXT_ERR_ALERT_FATAL;
}

static void log_ssl_error(const char *what, const char *path)
{
    mg_error("tls_config", "what=\"%s\" file=%s error=\"%s\"", what, path, mg_ssl_last_reason());
    ERR_clear_error();
}

/* The handshake goes on whatever the client certificate is: the peer API refuses a caller
 * without a good one and the client API looks the certificate up in --client-ca, naming why
 * when either refuses. */
static int verify_continue(int ok, X509_STORE_CTX *store)
{
    (void)ok;
    (void)store;
    return 1;
}

/* The --client-ca store hangs off the SSL_CTX: the handshake itself verifies against --peer-ca
 * only, so the two trust roots never mix. */
static int client_store_index = -1;

static void client_store_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl,
                              void *argp)
{
    (void)parent;
    (void)ad;
    (void)idx;
    (void)argl;
    (void)argp;
    X509_STORE_free(ptr);
}

/* Asks callers for a certificate, naming the CAs of both trust roots. */
static int ask_for_certificates(SSL_CTX *ctx, const char *peer_ca, const char *client_ca)
{
    STACK_OF(X509_NAME) *names = sk_X509_NAME_new_null();
    const char *files[2] = {peer_ca, client_ca}, *what[2] = {"--peer-ca", "--client-ca"};
    if (names == NULL)
        return -1;
    for (int i = 0; i < 2; i++)
        if (files[i][0] && SSL_add_file_cert_subjects_to_stack(names, files[i]) != 1) {
            char buf[64];
            snprintf(buf, sizeof(buf), "no CA names in %s", what[i]);
            log_ssl_error(buf, files[i]);
            sk_X509_NAME_pop_free(names, X509_NAME_free);
            return -1;
        }
    SSL_CTX_set_client_CA_list(ctx, names);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, verify_continue);
    return 0;
}

static int peer_ca_load(SSL_CTX *ctx, const char *peer_ca)
{
    if (SSL_CTX_load_verify_locations(ctx, peer_ca, NULL) != 1) {
        log_ssl_error("cannot load --peer-ca", peer_ca);
        return -1;
    }
    return 0;
}

static int client_ca_load(SSL_CTX *ctx, const char *client_ca)
{
    X509_STORE *st = X509_STORE_new();
    if (st == NULL || X509_STORE_load_file(st, client_ca) != 1) {
        log_ssl_error("cannot load --client-ca", client_ca);
        X509_STORE_free(st);
        return -1;
    }
    if (SSL_CTX_set_ex_data(ctx, client_store_index, st) != 1) {
        X509_STORE_free(st);
        return -1;
    }
    return 0;
}

/* Checks the client certificate against --client-ca, as a TLS client certificate. */
static void client_verify(SSL *ssl, X509 *leaf, mg_tls_id *id)
{
    X509_STORE *st = client_store_index >= 0
                         ? SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), client_store_index)
                         : NULL;
    X509_STORE_CTX *sc;
    if (st == NULL)
        return;
    sc = X509_STORE_CTX_new();
    id->client_state = MG_TLS_ID_REFUSED;
    if (sc == NULL || X509_STORE_CTX_init(sc, st, leaf, SSL_get_peer_cert_chain(ssl)) != 1) {
        snprintf(id->client_reason, sizeof(id->client_reason), "out of memory");
    } else {
        X509_STORE_CTX_set_default(sc, "ssl_client");
        if (X509_verify_cert(sc) == 1)
            id->client_state = MG_TLS_ID_VERIFIED;
        else
            snprintf(id->client_reason, sizeof(id->client_reason), "%s",
                     X509_verify_cert_error_string(X509_STORE_CTX_get_error(sc)));
    }
    X509_STORE_CTX_free(sc);
    ERR_clear_error();
}

static void add_name(mg_tls_id *id, const char *s, size_t len)
{
    size_t used = strlen(id->names);
    if (len == 0 || memchr(s, '\n', len) || memchr(s, '\0', len) ||
        used + len + 2 > sizeof(id->names))
        return;
    memcpy(id->names + used, s, len);
    id->names[used + len] = '\n';
    id->names[used + len + 1] = '\0';
    if (id->name[0] == '\0' && len < sizeof(id->name)) {
        memcpy(id->name, s, len);
        id->name[len] = '\0';
    }
}

void mg_tls_identity(void *ssl_, mg_tls_id *id)
{
    SSL *ssl = ssl_;
    X509 *x = ssl ? SSL_get0_peer_certificate(ssl) : NULL;
    GENERAL_NAMES *sans;
    char cn[128];
    long rc;
    memset(id, 0, sizeof(*id));
    if (x == NULL)
        return;
    client_verify(ssl, x, id);
    rc = SSL_get_verify_result(ssl);
    if (rc != X509_V_OK) {
        id->state = MG_TLS_ID_REFUSED;
        snprintf(id->reason, sizeof(id->reason), "%s", X509_verify_cert_error_string(rc));
    } else {
        id->state = MG_TLS_ID_VERIFIED;
    }
    if (id->state != MG_TLS_ID_VERIFIED && id->client_state != MG_TLS_ID_VERIFIED)
        return;
    int n = X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn));
    if (n > 0)
        add_name(id, cn, (size_t)n);
    sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans); i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
        if (g->type == GEN_DNS || g->type == GEN_URI) {
            const ASN1_IA5STRING *s =
                g->type == GEN_DNS ? g->d.dNSName : g->d.uniformResourceIdentifier;
            add_name(id, (const char *)ASN1_STRING_get0_data(s), (size_t)ASN1_STRING_length(s));
        }
    }
    GENERAL_NAMES_free(sans);
}

int mg_tls_id_in(const mg_tls_id *id, const char *list)
{
    for (const char *p = id->names; *p;) {
        const char *end = strchr(p, '\n');
        size_t len = (size_t)(end - p);
        for (const char *q = list; *q;) {
            size_t ql = strcspn(q, ",");
            if (ql == len && memcmp(p, q, len) == 0)
                return 1;
            q += ql;
            if (*q == ',')
                q++;
        }
        p = end + 1;
    }
    return 0;
}

void *mg_tls_server_ctx(const char *cert, const char *key, const char *peer_ca,
                        const char *client_ca)
{
    SSL_CTX *ctx;
    if (client_store_index < 0)
        client_store_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, client_store_free);
    ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL) {
        log_ssl_error("SSL_CTX_new", "-");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_SESSION_RESUMPTION_ON_RENEGOTIATION |
                                 SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                 SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    /* RFC 9113 9.2.2: TLS 1.2 with ephemeral key exchange and AEAD ciphers only. */
    if (SSL_CTX_set_cipher_list(ctx,
                                "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                                "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
                                "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305") != 1) {
        log_ssl_error("cipher list", "-");
        goto fail;
    }
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        log_ssl_error("cannot load --tls-cert", cert);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        int mismatch = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH;
        log_ssl_error(mismatch ? "--tls-key does not match --tls-cert" : "cannot load --tls-key",
                      key);
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        log_ssl_error("--tls-key does not match --tls-cert", key);
        goto fail;
    }
    if (peer_ca[0] && peer_ca_load(ctx, peer_ca) != 0)
        goto fail;
    if (client_ca[0] && client_ca_load(ctx, client_ca) != 0)
        goto fail;
    if ((peer_ca[0] || client_ca[0]) && ask_for_certificates(ctx, peer_ca, client_ca) != 0)
        goto fail;
    SSL_CTX_set_alpn_select_cb(ctx, alpn_select_cb, NULL);
    mg_info("tls_ready", "cert=%s peer_ca=%s client_ca=%s", cert, peer_ca[0] ? peer_ca : "-",
            client_ca[0] ? client_ca : "-");
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

void mg_tls_ctx_free(void *ctx)
{
    SSL_CTX_free(ctx);
}
