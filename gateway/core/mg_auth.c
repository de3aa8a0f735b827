/*
 * mg_auth: the --auth-file table (format in mg_auth.h).
 */
#include "mg_auth.h"

#include <ctype.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    mg_auth_kind kind;
    uint8_t hash[MG_AUTH_HASH_LEN]; /* token */
    char name[256];                 /* cert */
    uint32_t uid;                   /* uid */
    char tenant[MG_TENANT_MAX + 1];
    int admin;
} entry;

struct mg_auth {
    entry *e;
    size_t n;
};

int mg_tenant_ok(const char *s, size_t len)
{
    if (len == 0 || len > MG_TENANT_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && c != '.' && c != '_' && c != ':' && c != '-')
            return 0;
    }
    return 1;
}

void mg_auth_hash(const char *token, size_t len, uint8_t out[MG_AUTH_HASH_LEN])
{
    unsigned n = MG_AUTH_HASH_LEN;
    if (EVP_Digest(token, len, out, &n, EVP_sha256(), NULL) != 1)
        memset(out, 0, MG_AUTH_HASH_LEN); /* cannot happen with the default provider */
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Splits the next whitespace-separated word off *p (NUL-terminating it); NULL at the end. */
static char *word(char **p)
{
    char *s = *p, *w;
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s == '\0' || *s == '#')
        return NULL;
    w = s;
    while (*s && *s != ' ' && *s != '\t')
        s++;
    if (*s)
        *s++ = '\0';
    *p = s;
    return w;
}

static int parse_line(char *line, entry *e, char *why, size_t whycap)
{
    char *p = line, *kind = word(&p), *cred, *tenant, *role, *extra;
    memset(e, 0, sizeof(*e));
    cred = kind ? word(&p) : NULL;
    tenant = cred ? word(&p) : NULL;
    role = tenant ? word(&p) : NULL;
    extra = role ? word(&p) : NULL;
    if (kind == NULL)
        return 1; /* blank or comment */
    if (tenant == NULL) {
        snprintf(why, whycap, "expected \"KIND CREDENTIAL TENANT [admin]\"");
        return -1;
    }
    if (extra) {
        snprintf(why, whycap, "unexpected \"%.32s\" after the role", extra);
        return -1;
    }
    if (role && strcmp(role, "admin") != 0 && strcmp(role, "user") != 0) {
        snprintf(why, whycap, "role \"%.32s\" is neither admin nor user", role);
        return -1;
    }
    e->admin = role && strcmp(role, "admin") == 0;
    if (!mg_tenant_ok(tenant, strlen(tenant))) {
        snprintf(why, whycap, "tenant \"%.64s\" is not 1..%d of [A-Za-z0-9._:-]", tenant,
                 MG_TENANT_MAX);
        return -1;
    }
    memcpy(e->tenant, tenant, strlen(tenant) + 1);
    if (strcmp(kind, "token") == 0) {
        e->kind = MG_AUTH_TOKEN;
        if (strncmp(cred, "sha256:", 7) != 0 || strlen(cred + 7) != 2 * MG_AUTH_HASH_LEN) {
            snprintf(why, whycap,
                     "a token is given as sha256:<64 hex digits> of the token, never the token "
                     "itself");
            return -1;
        }
        for (int i = 0; i < MG_AUTH_HASH_LEN; i++) {
            int hi = hexval(cred[7 + 2 * i]), lo = hexval(cred[8 + 2 * i]);
            if (hi < 0 || lo < 0) {
                snprintf(why, whycap, "the token hash is not hexadecimal");
                return -1;
            }
            e->hash[i] = (uint8_t)(hi << 4 | lo);
        }
    } else if (strcmp(kind, "cert") == 0) {
        e->kind = MG_AUTH_CERT;
        if (strlen(cred) >= sizeof(e->name)) {
            snprintf(why, whycap, "certificate identity longer than %zu bytes",
                     sizeof(e->name) - 1);
            return -1;
        }
        memcpy(e->name, cred, strlen(cred) + 1);
    } else if (strcmp(kind, "uid") == 0) {
        char *end;
        unsigned long v = strtoul(cred, &end, 10);
        e->kind = MG_AUTH_UID;
        if (!isdigit((unsigned char)cred[0]) || *end || v > UINT32_MAX) {
            snprintf(why, whycap, "uid \"%.32s\" is not a user id", cred);
            return -1;
        }
        e->uid = (uint32_t)v;
    } else {
        snprintf(why, whycap, "kind \"%.32s\" is none of token, cert, uid", kind);
        return -1;
    }
    return 0;
}

static int same_credential(const entry *a, const entry *b)
{
    if (a->kind != b->kind)
        return 0;
    switch (a->kind) {
    case MG_AUTH_TOKEN:
        return memcmp(a->hash, b->hash, MG_AUTH_HASH_LEN) == 0;
    case MG_AUTH_CERT:
        return strcmp(a->name, b->name) == 0;
    default:
        return a->uid == b->uid;
    }
}

mg_auth *mg_auth_parse(const char *text, size_t len, char *err, size_t errcap)
{
    mg_auth *a = calloc(1, sizeof(*a));
    size_t cap = 0, lineno = 0;
    char line[1024], why[160];
    if (a == NULL) {
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - (text + pos)) : len - pos, next = pos + ll + (nl != NULL);
        entry e;
        int rc;
        lineno++;
        if (lineno > MG_AUTH_MAX_LINES) {
            snprintf(err, errcap, "more than %d lines", MG_AUTH_MAX_LINES);
            goto fail;
        }
        if (ll && text[pos + ll - 1] == '\r')
            ll--;
        if (ll >= sizeof(line) || memchr(text + pos, '\0', ll)) {
            snprintf(err, errcap, "line %zu: longer than %zu bytes or holds a NUL byte", lineno,
                     sizeof(line) - 1);
            goto fail;
        }
        memcpy(line, text + pos, ll);
        line[ll] = '\0';
        pos = next;
        rc = parse_line(line, &e, why, sizeof(why));
        if (rc < 0) {
            snprintf(err, errcap, "line %zu: %s", lineno, why);
            goto fail;
        }
        if (rc > 0)
            continue;
        for (size_t i = 0; i < a->n; i++)
            if (same_credential(&a->e[i], &e)) {
                snprintf(err, errcap, "line %zu: the same credential is listed twice", lineno);
                goto fail;
            }
        if (a->n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            entry *ne = realloc(a->e, nc * sizeof(*ne));
            if (ne == NULL) {
                snprintf(err, errcap, "out of memory");
                goto fail;
            }
            a->e = ne;
            cap = nc;
        }
        a->e[a->n++] = e;
    }
    return a;
fail:
    mg_auth_free(a);
    return NULL;
}

void mg_auth_free(mg_auth *auth)
{
    if (auth == NULL)
        return;
    if (auth->e)
        OPENSSL_cleanse(auth->e, auth->n * sizeof(*auth->e));
    free(auth->e);
    free(auth);
}

size_t mg_auth_count(const mg_auth *auth)
{
    return auth ? auth->n : 0;
}

static void fill(const entry *e, mg_principal *out, const char *how)
{
    memcpy(out->tenant, e->tenant, sizeof(out->tenant));
    out->admin = e->admin;
    out->how = how;
}

int mg_auth_by_token(const mg_auth *auth, const uint8_t hash[MG_AUTH_HASH_LEN], mg_principal *out)
{
    const entry *hit = NULL;
    if (auth == NULL)
        return -1;
    /* Every token entry is compared, in constant time each: how long a lookup takes says
     * nothing about how close a guess was. */
    for (size_t i = 0; i < auth->n; i++)
        if (auth->e[i].kind == MG_AUTH_TOKEN &&
            CRYPTO_memcmp(auth->e[i].hash, hash, MG_AUTH_HASH_LEN) == 0)
            hit = &auth->e[i];
    if (hit == NULL)
        return -1;
    fill(hit, out, "token");
    return 0;
}

int mg_auth_by_cert(const mg_auth *auth, const char *names, mg_principal *out)
{
    if (auth == NULL)
        return -1;
    for (const char *p = names; *p;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        for (size_t i = 0; i < auth->n; i++) {
            const entry *e = &auth->e[i];
            if (e->kind == MG_AUTH_CERT && strlen(e->name) == len && memcmp(e->name, p, len) == 0) {
                fill(e, out, "cert");
                return 0;
            }
        }
        if (end == NULL)
            break;
        p = end + 1;
    }
    return -1;
}

int mg_auth_by_uid(const mg_auth *auth, uint32_t uid, mg_principal *out)
{
    if (auth == NULL)
        return -1;
    for (size_t i = 0; i < auth->n; i++)
        if (auth->e[i].kind == MG_AUTH_UID && auth->e[i].uid == uid) {
            fill(&auth->e[i], out, "uid");
            return 0;
        }
    return -1;
}
