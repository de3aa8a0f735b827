/* mg_fdproto: see mg_fdproto.h. */
#include "mg_fdproto.h"
#include "mg_grpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mg_fdproto_request(char *text, size_t len, const char **token, const char **why)
{
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r'))
        len--;
    text[len] = '\0';
    *token = NULL;
    if (memchr(text, '\0', len) != NULL) {
        *why = "the request is text; it has a NUL byte";
        return -1;
    }
    if (len < 3 || memcmp(text, "PUT", 3) != 0 || (len > 3 && text[3] != ' ')) {
        *why = "the request is \"PUT [TOKEN]\" with one descriptor";
        return -1;
    }
    if (len > 4) {
        if (len - 4 > MG_FDPROTO_TOKEN_MAX || strchr(text + 4, ' ') != NULL) {
            *why = "the token is one word of at most 1024 bytes";
            return -1;
        }
        *token = text + 4;
    }
    return 0;
}

/* A decimal number of at most 20 digits, then end or a space. Returns 0 and *v, or -1. */
static int number(const char **p, uint64_t *v)
{
    uint64_t n = 0;
    const char *s = *p;
    int digits = 0;
    for (; *s >= '0' && *s <= '9'; s++, digits++) {
        if (n > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
            return -1;
        n = n * 10 + (uint64_t)(*s - '0');
    }
    if (digits == 0)
        return -1;
    *p = s;
    *v = n;
    return 0;
}

int mg_fdproto_reply(const char *r, uint64_t *handle, uint64_t *ttl_ms, int *code, char *msg,
                     size_t cap)
{
    const char *p = r;
    if (strncmp(p, "OK ", 3) == 0) {
        p += 3;
        if (number(&p, handle) == 0 && *p == ' ' && (p++, number(&p, ttl_ms) == 0) &&
            (*p == '\0' || (*p == '\n' && p[1] == '\0'))) {
            *code = MG_GRPC_OK;
            return 0;
        }
    } else if (strncmp(p, "ERR ", 4) == 0) {
        char name[40];
        size_t n = strcspn(p + 4, " ");
        if (n > 0 && n < sizeof(name) && p[4 + n] == ' ') {
            memcpy(name, p + 4, n);
            name[n] = '\0';
            *code = mg_grpc_code_parse(name);
            if (*code > 0) {
                snprintf(msg, cap, "%s", p + 5 + n);
                return -1;
            }
        }
    }
    *code = MG_GRPC_INTERNAL;
    snprintf(msg, cap, "the fd socket answered \"%.200s\"", r);
    return -1;
}
