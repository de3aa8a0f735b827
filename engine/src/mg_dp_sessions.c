/*
 * mg_dp_sessions: data-plane session tokens (see moongate/dataplane.h).
 */
#include "moongate/dataplane.h"

#include "mg_time.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

typedef struct session {
    uint8_t token[MG_DF_TOKEN_BYTES];
    char tenant[MG_SEG_NAME_MAX + 1];
    uint64_t expires_ms;
} session;

struct mg_dp_sessions {
    pthread_mutex_t lock;
    size_t n, max;
    session all[];
};

int mg_dp_sessions_new(mg_dp_sessions **out, size_t max)
{
    mg_dp_sessions *t;
    *out = NULL;
    if (max == 0 || max > (1u << 20))
        return MG_ERR_INVALID;
    if ((t = calloc(1, sizeof(*t) + max * sizeof(t->all[0]))) == NULL)
        return MG_ERR_NOMEM;
    pthread_mutex_init(&t->lock, NULL);
    t->max = max;
    *out = t;
    return 0;
}

void mg_dp_sessions_del(mg_dp_sessions *t)
{
    if (t == NULL)
        return;
    pthread_mutex_destroy(&t->lock);
    free(t);
}

int mg_dp_sessions_add(mg_dp_sessions *t, const char *tenant, uint64_t now_ms, uint64_t ttl_ms,
                       uint8_t token[MG_DF_TOKEN_BYTES])
{
    int rc = 0;
    if (getrandom(token, MG_DF_TOKEN_BYTES, 0) != MG_DF_TOKEN_BYTES)
        return MG_ERR_SYSTEM;
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < t->n;) {
        if (t->all[i].expires_ms <= now_ms)
            t->all[i] = t->all[--t->n];
        else
            i++;
    }
    if (t->n >= t->max) {
        rc = MG_ERR_FULL;
    } else {
        session *s = &t->all[t->n++];
        memcpy(s->token, token, MG_DF_TOKEN_BYTES);
        snprintf(s->tenant, sizeof(s->tenant), "%s", tenant);
        s->expires_ms = now_ms + ttl_ms;
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int mg_dp_sessions_find(mg_dp_sessions *t, const uint8_t token[MG_DF_TOKEN_BYTES], uint64_t now_ms,
                        char *tenant, uint64_t *expires_ms)
{
    int rc = MG_ERR_AUTH;
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < t->n; i++) {
        const session *s = &t->all[i];
        if (s->expires_ms > now_ms && memcmp(s->token, token, MG_DF_TOKEN_BYTES) == 0) {
            if (tenant)
                snprintf(tenant, MG_SEG_NAME_MAX + 1, "%s", s->tenant);
            if (expires_ms)
                *expires_ms = s->expires_ms;
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int mg_dp_sessions_auth(void *arg, const uint8_t token[MG_DF_TOKEN_BYTES], char *tenant)
{
    return mg_dp_sessions_find(arg, token, mg_now_mono_ms(), tenant, NULL);
}
