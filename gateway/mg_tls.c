/*
 * mg_tls: the control port's TLS context. TLS 1.2 and 1.3 only, forward-secret AEAD ciphers,
 * ALPN selects h2 (gRPC clients refuse a connection without it). Built once at start-up on the
 * main thread; errors are logged with OpenSSL's reason so an operator can fix the files.
 */
#include "mg_gateway.h"

#include "mg_log.h"

#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>

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
    char buf[256] = "unknown error";
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, buf, sizeof(buf));
    mg_error("tls_config", "what=\"%s\" file=%s error=\"%s\"", what, path, buf);
    ERR_clear_error();
}

void *mg_tls_server_ctx(const char *cert, const char *key)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
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
    SSL_CTX_set_alpn_select_cb(ctx, alpn_select_cb, NULL);
    mg_info("tls_ready", "cert=%s", cert);
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

void mg_tls_ctx_free(void *ctx)
{
    SSL_CTX_free(ctx);
}
