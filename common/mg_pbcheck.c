/* mg_pbcheck: NUL bytes and invalid UTF-8 in the strings of an encoded message (mg_pbcheck.h). */
#include "mg_pbcheck.h"

#include <stdio.h>
#include <string.h>

#define MAX_DEPTH  32 /* nesting followed; deeper messages are protobuf-c's to refuse */
#define MAX_COUNTS 64 /* fields whose repetitions are counted for the path's [index] */

int mg_utf8_valid(const uint8_t *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        uint8_t c = s[i];
        size_t n;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf) {
            n = 1;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            n = 2;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 3;
            cp = c & 0x07;
        } else {
            return 0; /* a continuation byte first, 0xc0/0xc1 (overlong) or above 0xf4 */
        }
        if (len - i - 1 < n)
            return 0;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += n + 1;
    }
    return 1;
}

const char *mg_string_problem(const uint8_t *s, size_t len)
{
    if (memchr(s, 0, len) != NULL)
        return "holds a NUL byte";
    if (!mg_utf8_valid(s, len))
        return "is not valid UTF-8";
    return NULL;
}

/* Reads a varint at *p (< end). Returns 0, or -1 when it is malformed or cut. */
static int varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* Returns 0 (fine or malformed: the decoder decides), or -1 with err set. */
static int walk(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end,
                const char *path, int depth, char *err, size_t errcap)
{
    uint32_t counts[MAX_COUNTS] = {0};
    while (p < end) {
        uint64_t key, len = 0;
        const ProtobufCFieldDescriptor *f;
        char sub[256];
        unsigned idx;
        /* Field 0 is no field of ours, but protobuf-c takes a key for it written in more than
         * one byte (80 00) as an unknown field and decodes on: so must the check (the lookup
         * below finds nothing and skips it). A key past 32 bits is one protobuf-c refuses. */
        if (varint(&p, end, &key) != 0 || key >> 3 > UINT32_MAX)
            return 0;
        switch (key & 7) {
        case 0: /* varint */
            if (varint(&p, end, &len) != 0)
                return 0;
            continue;
        case 1: /* 64-bit */
            if (end - p < 8)
                return 0;
            p += 8;
            continue;
        case 5: /* 32-bit */
            if (end - p < 4)
                return 0;
            p += 4;
            continue;
        case 2: /* length-delimited: strings, bytes, messages, packed numbers */
            if (varint(&p, end, &len) != 0 || len > (uint64_t)(end - p))
                return 0;
            break;
        default: /* groups and reserved types: protobuf-c refuses them */
            return 0;
        }
        f = protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
        if (f == NULL ||
            (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)) {
            p += len;
            continue;
        }
        idx = (unsigned)(f - d->fields);
        if (f->label == PROTOBUF_C_LABEL_REPEATED && idx < MAX_COUNTS)
            snprintf(sub, sizeof(sub), "%s%s%s[%u]", path, *path ? "." : "", f->name,
                     (unsigned)counts[idx]++);
        else
            snprintf(sub, sizeof(sub), "%s%s%s", path, *path ? "." : "", f->name);
        if (f->type == PROTOBUF_C_TYPE_STRING) {
            const char *why = mg_string_problem(p, (size_t)len);
            if (why) {
                snprintf(err, errcap, "field \"%s\": %s", sub, why);
                return -1;
            }
        } else if (depth < MAX_DEPTH &&
                   walk(f->descriptor, p, p + len, sub, depth + 1, err, errcap) != 0) {
            return -1;
        }
        p += len;
    }
    return 0;
}

int mg_pb_check_strings(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                        char *err, size_t errcap)
{
    if (len == 0)
        return 0;
    return walk(d, buf, buf + len, "", 0, err, errcap);
}
