/* mg_grpc: see mg_grpc.h. */
#include "mg_grpc.h"
#include "moongate/mg_error.h" /* the engine's codes: the one header of it common reads */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const code_names[MG_GRPC_CODE_COUNT] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

static const int code_http[MG_GRPC_CODE_COUNT] = {
    200, 499, 500, 400, 504, 404, 409, 403, 429, 400, 409, 400, 501, 500, 503, 500, 401,
};

int mg_err_grpc(int err)
{
    /* indexed by -err, in the order of moongate/mg_error.h */
    static const unsigned char grpc[MG_ERR_COUNT] = {
        MG_GRPC_OK,
        MG_GRPC_INVALID_ARGUMENT,    /* MG_ERR_INVALID */
        MG_GRPC_RESOURCE_EXHAUSTED,  /* MG_ERR_NOMEM */
        MG_GRPC_RESOURCE_EXHAUSTED,  /* MG_ERR_FULL */
        MG_GRPC_NOT_FOUND,           /* MG_ERR_NOT_FOUND */
        MG_GRPC_ALREADY_EXISTS,      /* MG_ERR_EXISTS */
        MG_GRPC_PERMISSION_DENIED,   /* MG_ERR_PERMISSION */
        MG_GRPC_FAILED_PRECONDITION, /* MG_ERR_BUSY */
        MG_GRPC_OUT_OF_RANGE,        /* MG_ERR_RANGE */
        MG_GRPC_DEADLINE_EXCEEDED,   /* MG_ERR_TIMEOUT */
        MG_GRPC_CANCELLED,           /* MG_ERR_CANCELLED */
        MG_GRPC_UNAVAILABLE,         /* MG_ERR_SHUTDOWN */
        MG_GRPC_UNAVAILABLE,         /* MG_ERR_UNAVAILABLE */
        MG_GRPC_UNIMPLEMENTED,       /* MG_ERR_UNSUPPORTED */
        MG_GRPC_INTERNAL,            /* MG_ERR_SYSTEM */
        MG_GRPC_INTERNAL,            /* MG_ERR_PROTOCOL */
        MG_GRPC_UNAUTHENTICATED,     /* MG_ERR_AUTH */
        MG_GRPC_DATA_LOSS,           /* MG_ERR_DATA_LOSS */
        MG_GRPC_RESOURCE_EXHAUSTED,  /* MG_ERR_QUOTA */
        MG_GRPC_FAILED_PRECONDITION, /* MG_ERR_STATE */
    };
    _Static_assert(-MG_ERR_STATE == MG_ERR_COUNT - 1, "a new MG_ERR_* needs its gRPC status here");
    if (err > 0 || -err >= MG_ERR_COUNT)
        return MG_GRPC_UNKNOWN;
    return grpc[-err];
}

const char *mg_grpc_code_name(int code)
{
    if (code < 0 || code >= MG_GRPC_CODE_COUNT)
        return "UNKNOWN";
    return code_names[code];
}

int mg_grpc_code_parse(const char *s)
{
    if (s[0] >= '0' && s[0] <= '9') { /* the wire form, 1*DIGIT */
        int v = 0;
        for (int i = 0; s[i]; i++) {
            if (s[i] < '0' || s[i] > '9' || i >= 8)
                return -1;
            v = v * 10 + (s[i] - '0');
        }
        return v < MG_GRPC_CODE_COUNT ? v : -1;
    }
    for (int i = 0; i < MG_GRPC_CODE_COUNT; i++) {
        if (strcmp(s, code_names[i]) == 0)
            return i;
    }
    return -1;
}

int mg_grpc_code_http(int code)
{
    if (code < 0 || code >= MG_GRPC_CODE_COUNT)
        return 500;
    return code_http[code];
}

size_t mg_pct_encode(char *dst, size_t cap, const char *src, size_t len)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t need = 0, o = 0;

    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)src[i];
        int plain = c >= 0x20 && c <= 0x7e && c != '%';
        size_t w = plain ? 1 : 3;
        if (cap > 0 && o + w < cap) {
            if (plain) {
                dst[o++] = (char)c;
            } else {
                dst[o++] = '%';
                dst[o++] = hex[c >> 4];
                dst[o++] = hex[c & 15];
            }
        } else if (cap > 0) {
            cap = o + 1; /* stop writing; keep counting */
        }
        need += w;
    }
    if (cap > 0)
        dst[o] = '\0';
    return need;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

size_t mg_pct_decode(char *dst, const char *src, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        int hi, lo;
        if (src[i] == '%' && i + 2 < len && (hi = hexval(src[i + 1])) >= 0 &&
            (lo = hexval(src[i + 2])) >= 0) {
            dst[o++] = (char)(hi << 4 | lo);
            i += 2;
        } else {
            dst[o++] = src[i];
        }
    }
    dst[o] = '\0';
    return o;
}

int mg_grpc_timeout_parse(const char *s, size_t len, uint64_t *ns)
{
    uint64_t v = 0, mult;

    if (len < 2 || len > 9)
        return -1;
    for (size_t i = 0; i + 1 < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    switch (s[len - 1]) {
    case 'H':
        mult = 3600ULL * 1000000000ULL;
        break;
    case 'M':
        mult = 60ULL * 1000000000ULL;
        break;
    case 'S':
        mult = 1000000000ULL;
        break;
    case 'm':
        mult = 1000000ULL;
        break;
    case 'u':
        mult = 1000ULL;
        break;
    case 'n':
        mult = 1ULL;
        break;
    default:
        return -1;
    }
    /* 8 digits of hours fit: 99999999 * 3.6e12 < 2^64 / 50. */
    *ns = v * mult;
    return 0;
}

size_t mg_grpc_timeout_format(char *buf, uint64_t ns)
{
    static const struct {
        char unit;
        uint64_t ns;
    } units[] = {{'n', 1ULL},
                 {'u', 1000ULL},
                 {'m', 1000000ULL},
                 {'S', 1000000000ULL},
                 {'M', 60ULL * 1000000000ULL},
                 {'H', 3600ULL * 1000000000ULL}};
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        uint64_t v = ns / units[i].ns + (ns % units[i].ns != 0); /* round up: never shorten */
        if (v <= 99999999ULL || i + 1 == sizeof(units) / sizeof(units[0])) {
            if (v > 99999999ULL)
                v = 99999999ULL;
            char digits[8];
            size_t n = 0, len = 0;
            do { /* v <= 99999999: at most 8 digits (the header's limit) */
                digits[n++] = (char)('0' + v % 10);
                v /= 10;
            } while (v);
            while (n)
                buf[len++] = digits[--n];
            buf[len++] = units[i].unit;
            buf[len] = '\0';
            return len;
        }
    }
    return 0;
}

void mg_grpc_prefix(uint8_t out[MG_GRPC_PREFIX_LEN], uint32_t len)
{
    out[0] = 0;
    out[1] = (uint8_t)(len >> 24);
    out[2] = (uint8_t)(len >> 16);
    out[3] = (uint8_t)(len >> 8);
    out[4] = (uint8_t)len;
}

void mg_deframer_init(mg_deframer *d, uint32_t max_message)
{
    memset(d, 0, sizeof(*d));
    d->max_message = max_message;
}

void mg_deframer_free(mg_deframer *d)
{
    if (d == NULL)
        return;
    free(d->msg);
    d->msg = NULL;
}

uint8_t *mg_deframer_take(mg_deframer *d, const uint8_t *msg)
{
    uint8_t *own = d->msg;
    if (own == NULL || own != msg)
        return NULL;
    d->msg = NULL;
    return own;
}

int mg_deframer_partial(const mg_deframer *d)
{
    return d->prefix_got > 0;
}

int mg_deframer_feed(mg_deframer *d, const uint8_t *data, size_t len, mg_deframer_cb cb, void *arg)
{
    while (len > 0) {
        if (d->prefix_got < MG_GRPC_PREFIX_LEN) {
            size_t take = MG_GRPC_PREFIX_LEN - d->prefix_got;
            if (take > len)
                take = len;
            memcpy(d->prefix + d->prefix_got, data, take);
            d->prefix_got += take;
            data += take;
            len -= take;
            if (d->prefix_got < MG_GRPC_PREFIX_LEN)
                break;
            d->declared = (uint32_t)d->prefix[1] << 24 | (uint32_t)d->prefix[2] << 16 |
                          (uint32_t)d->prefix[3] << 8 | d->prefix[4];
            if (d->prefix[0] == 1)
                return MG_DEFRAME_COMPRESSED;
            if (d->prefix[0] != 0)
                return MG_DEFRAME_BAD_FLAG;
            if (d->declared > d->max_message)
                return MG_DEFRAME_TOO_LARGE;
            d->msg_len = d->declared;
            d->msg_got = 0;
            /* A message wholly inside this chunk is delivered without a copy. */
            if (len >= d->msg_len) {
                int rv = cb(arg, data, d->msg_len);
                data += d->msg_len;
                len -= d->msg_len;
                d->prefix_got = 0;
                d->messages++;
                if (rv != 0)
                    return rv;
                continue;
            }
            d->msg = malloc(d->msg_len);
            if (d->msg == NULL)
                return MG_DEFRAME_NOMEM;
        }
        size_t take = d->msg_len - d->msg_got;
        if (take > len)
            take = len;
        memcpy(d->msg + d->msg_got, data, take);
        d->msg_got += (uint32_t)take;
        data += take;
        len -= take;
        if (d->msg_got == d->msg_len) {
            int rv = cb(arg, d->msg, d->msg_len);
            free(d->msg);
            d->msg = NULL;
            d->prefix_got = 0;
            d->messages++;
            if (rv != 0)
                return rv;
        }
    }
    return MG_DEFRAME_OK;
}
