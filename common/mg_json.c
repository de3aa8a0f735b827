/*
 * mg_json: see mg_json.h. Field storage follows protobuf-c 1.4: `offset` locates the value,
 * `quantifier_offset` the repeated count (size_t), the proto2/proto3-optional presence flag
 * (protobuf_c_boolean) or the oneof case (uint32_t).
 */
#include "mg_json.h"

#include "mg_b64.h"
#include "mg_pbcheck.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 32

void mg_json_name(char *dst, size_t cap, const char *name)
{
    size_t o = 0;
    int up = 0;
    for (; *name && o + 1 < cap; name++) {
        if (*name == '_') {
            up = 1;
            continue;
        }
        dst[o++] = up && *name >= 'a' && *name <= 'z' ? (char)(*name - 'a' + 'A') : *name;
        up = 0;
    }
    if (cap > 0)
        dst[o] = '\0';
}

static size_t elem_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return 8;
    case PROTOBUF_C_TYPE_FLOAT:
        return sizeof(float);
    case PROTOBUF_C_TYPE_DOUBLE:
        return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_ENUM:
        return sizeof(int);
    case PROTOBUF_C_TYPE_STRING:
        return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(ProtobufCMessage *);
    }
    return 0;
}

/* ---------------------------------------------------------------- encoding */

static json_t *encode_message(const ProtobufCMessage *msg, int depth);

static json_t *encode_float(double v)
{
    if (isnan(v))
        return json_string("NaN");
    if (isinf(v))
        return json_string(v > 0 ? "Infinity" : "-Infinity");
    return json_real(v);
}

static json_t *encode_value(const ProtobufCFieldDescriptor *f, const void *p, int depth)
{
    char buf[32];
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return json_integer(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        snprintf(buf, sizeof(buf), "%" PRId64, *(const int64_t *)p);
        return json_string(buf);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        snprintf(buf, sizeof(buf), "%" PRIu64, *(const uint64_t *)p);
        return json_string(buf);
    case PROTOBUF_C_TYPE_FLOAT:
        return encode_float(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE:
        return encode_float(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL:
        return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)p;
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value((const ProtobufCEnumDescriptor *)f->descriptor, v);
        return ev ? json_string(ev->name) : json_integer(v);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        return json_stringn(s ? s : "", s ? strlen(s) : 0);
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        char *out = malloc(mg_b64_encoded_size(b->len));
        json_t *j;
        if (out == NULL)
            return NULL;
        mg_b64_encode(out, b->data, b->len);
        j = json_string(out);
        free(out);
        return j;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(ProtobufCMessage *const *)p;
        return m ? encode_message(m, depth + 1) : json_null();
    }
    }
    return NULL;
}

static int field_present(const ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f)
{
    const char *base = (const char *)msg;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
        return *(const uint32_t *)(base + f->quantifier_offset) == f->id;
    if (f->label == PROTOBUF_C_LABEL_OPTIONAL) {
        if (f->type == PROTOBUF_C_TYPE_MESSAGE || f->type == PROTOBUF_C_TYPE_STRING)
            return *(void *const *)(base + f->offset) != NULL;
        return *(const protobuf_c_boolean *)(base + f->quantifier_offset);
    }
    return 1;
}

static json_t *encode_message(const ProtobufCMessage *msg, int depth)
{
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    const char *base = (const char *)msg;
    json_t *obj;

    if (depth > MAX_DEPTH)
        return NULL;
    obj = json_object();
    if (obj == NULL)
        return NULL;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        char key[128];
        json_t *v;

        mg_json_name(key, sizeof(key), f->name);
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            const char *arr = *(char *const *)(base + f->offset);
            v = json_array();
            for (size_t k = 0; v && k < n; k++) {
                json_t *e = encode_value(f, arr + k * elem_size(f->type), depth);
                if (e == NULL || json_array_append_new(v, e) != 0) {
                    json_decref(v);
                    v = NULL;
                }
            }
        } else if (!field_present(msg, f)) {
            continue;
        } else {
            v = encode_value(f, base + f->offset, depth);
        }
        if (v == NULL || json_object_set_new(obj, key, v) != 0) {
            json_decref(obj);
            return NULL;
        }
    }
    return obj;
}

json_t *mg_json_from_message(const ProtobufCMessage *msg)
{
    return encode_message(msg, 0);
}

/* ---------------------------------------------------------------- decoding */

typedef struct {
    char *err;
    size_t cap;
} decode_ctx;

static int fail(decode_ctx *c, const char *path, const char *what)
{
    snprintf(c->err, c->cap, "field \"%s\": %s", path, what);
    return -1;
}

static ProtobufCMessage *decode_message(decode_ctx *c, const ProtobufCMessageDescriptor *d,
                                        const json_t *j, const char *path, int depth);

static int parse_int(decode_ctx *c, const char *path, const json_t *j, int is_signed, int64_t *sv,
                     uint64_t *uv)
{
    if (json_is_integer(j)) {
        json_int_t v = json_integer_value(j);
        if (!is_signed && v < 0)
            return fail(c, path, "negative value for an unsigned field");
        *sv = v;
        *uv = (uint64_t)v;
        return 0;
    }
    if (json_is_real(j)) {
        /* Range-check in the target's signedness before converting: a double outside the
         * integer type's range is undefined behaviour to convert. 2^63 and 2^64 are exact. */
        double v = json_real_value(j);
        if (v != floor(v))
            return fail(c, path, "expected an integer");
        if (is_signed) {
            if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0))
                return fail(c, path, "out of range for a 64-bit integer");
            *sv = (int64_t)v;
            *uv = (uint64_t)*sv;
        } else {
            if (v < 0)
                return fail(c, path, "negative value for an unsigned field");
            if (!(v < 18446744073709551616.0))
                return fail(c, path, "out of range for a 64-bit integer");
            *uv = (uint64_t)v;
            *sv = (int64_t)*uv;
        }
        return 0;
    }
    if (json_is_string(j)) {
        const char *s = json_string_value(j);
        char *end;
        errno = 0;
        if (*s == '\0' || *s == ' ')
            return fail(c, path, "expected an integer");
        if (is_signed)
            *sv = strtoll(s, &end, 10);
        else if (*s == '-')
            return fail(c, path, "negative value for an unsigned field");
        else
            *uv = strtoull(s, &end, 10);
        if (errno != 0 || *end != '\0')
            return fail(c, path, "expected an integer (number or decimal string)");
        if (is_signed)
            *uv = (uint64_t)*sv;
        else
            *sv = (int64_t)*uv;
        return 0;
    }
    return fail(c, path, "expected an integer");
}

static int parse_float(decode_ctx *c, const char *path, const json_t *j, double *out)
{
    if (json_is_number(j)) {
        *out = json_number_value(j);
        return 0;
    }
    if (json_is_string(j)) {
        const char *s = json_string_value(j);
        char *end;
        if (strcmp(s, "NaN") == 0)
            *out = NAN;
        else if (strcmp(s, "Infinity") == 0)
            *out = INFINITY;
        else if (strcmp(s, "-Infinity") == 0)
            *out = -INFINITY;
        else {
            *out = strtod(s, &end);
            if (*s == '\0' || *end != '\0')
                return fail(c, path, "expected a number");
        }
        return 0;
    }
    return fail(c, path, "expected a number");
}

/* Decodes one value of field f from j into p (storage of elem_size(f->type) bytes). */
static int decode_value(decode_ctx *c, const ProtobufCFieldDescriptor *f, const json_t *j, void *p,
                        const char *path, int depth)
{
    int64_t sv = 0;
    uint64_t uv = 0;
    double dv;

    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        if (parse_int(c, path, j, 1, &sv, &uv) != 0)
            return -1;
        if (sv < INT32_MIN || sv > INT32_MAX)
            return fail(c, path, "out of range for int32");
        *(int32_t *)p = (int32_t)sv;
        return 0;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        if (parse_int(c, path, j, 0, &sv, &uv) != 0)
            return -1;
        if (uv > UINT32_MAX)
            return fail(c, path, "out of range for uint32");
        *(uint32_t *)p = (uint32_t)uv;
        return 0;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        if (parse_int(c, path, j, 1, &sv, &uv) != 0)
            return -1;
        *(int64_t *)p = sv;
        return 0;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        if (parse_int(c, path, j, 0, &sv, &uv) != 0)
            return -1;
        *(uint64_t *)p = uv;
        return 0;
    case PROTOBUF_C_TYPE_FLOAT:
        if (parse_float(c, path, j, &dv) != 0)
            return -1;
        *(float *)p = (float)dv;
        return 0;
    case PROTOBUF_C_TYPE_DOUBLE:
        if (parse_float(c, path, j, &dv) != 0)
            return -1;
        *(double *)p = dv;
        return 0;
    case PROTOBUF_C_TYPE_BOOL: /* "true" and "false" too: what a query string gives */
        if (json_is_string(j) &&
            (!strcmp(json_string_value(j), "true") || !strcmp(json_string_value(j), "false"))) {
            *(protobuf_c_boolean *)p = !strcmp(json_string_value(j), "true");
            return 0;
        }
        if (!json_is_boolean(j))
            return fail(c, path, "expected true or false");
        *(protobuf_c_boolean *)p = json_is_true(j);
        return 0;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *ed = f->descriptor;
        const ProtobufCEnumValue *ev = NULL;
        if (json_is_integer(j) && json_integer_value(j) >= INT32_MIN &&
            json_integer_value(j) <= INT32_MAX) {
            /* proto3 enums are open: a number is taken as it is, known or not (what the
             * binary form carries too, and what this mapping writes for unknown values);
             * handlers check the values they act on */
            *(int *)p = (int)json_integer_value(j);
            return 0;
        }
        if (json_is_string(j))
            ev = protobuf_c_enum_descriptor_get_value_by_name(ed, json_string_value(j));
        if (ev == NULL) {
            char what[160];
            snprintf(what, sizeof(what), "not a value of enum %s", ed->name);
            return fail(c, path, what);
        }
        *(int *)p = ev->value;
        return 0;
    }
    case PROTOBUF_C_TYPE_STRING: {
        char *s;
        const char *why;
        if (!json_is_string(j))
            return fail(c, path, "expected a string");
        why = mg_string_problem((const uint8_t *)json_string_value(j), json_string_length(j));
        if (why)
            return fail(c, path, why);
        s = strdup(json_string_value(j));
        if (s == NULL)
            return fail(c, path, "out of memory");
        *(char **)p = s;
        return 0;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData *b = p;
        size_t n;
        long got;
        if (!json_is_string(j))
            return fail(c, path, "expected a base64 string");
        n = json_string_length(j);
        b->data = malloc(n / 4 * 3 + 4);
        if (b->data == NULL)
            return fail(c, path, "out of memory");
        got = mg_b64_decode(b->data, json_string_value(j), n);
        if (got < 0) {
            free(b->data);
            b->data = NULL;
            b->len = 0;
            return fail(c, path, "not valid base64");
        }
        b->len = (size_t)got;
        return 0;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        ProtobufCMessage *m = decode_message(c, f->descriptor, j, path, depth + 1);
        if (m == NULL)
            return -1;
        *(ProtobufCMessage **)p = m;
        return 0;
    }
    }
    return fail(c, path, "unsupported field type");
}

static const ProtobufCFieldDescriptor *find_field(const ProtobufCMessageDescriptor *d,
                                                  const char *key)
{
    for (unsigned i = 0; i < d->n_fields; i++) {
        char camel[128];
        if (strcmp(d->fields[i].name, key) == 0)
            return &d->fields[i];
        mg_json_name(camel, sizeof(camel), d->fields[i].name);
        if (strcmp(camel, key) == 0)
            return &d->fields[i];
    }
    return NULL;
}

/* Frees whatever a field currently holds and resets it, so a repeated key does not leak. */
static void clear_field(ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f)
{
    char *base = (char *)msg;
    void *p = base + f->offset;
    if (f->label == PROTOBUF_C_LABEL_REPEATED)
        return; /* arrays are only ever set once per key; duplicates are rejected */
    if (f->type == PROTOBUF_C_TYPE_STRING) {
        char *s = *(char **)p;
        if (s && s != (const char *)f->default_value && s != protobuf_c_empty_string)
            free(s);
        *(char **)p = f->default_value ? (char *)(uintptr_t)f->default_value : NULL;
    } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
        if (*(ProtobufCMessage **)p)
            protobuf_c_message_free_unpacked(*(ProtobufCMessage **)p, NULL);
        *(ProtobufCMessage **)p = NULL;
    } else if (f->type == PROTOBUF_C_TYPE_BYTES) {
        ProtobufCBinaryData *b = p;
        const ProtobufCBinaryData *def = f->default_value;
        if (b->data && (def == NULL || b->data != def->data))
            free(b->data);
        b->data = NULL;
        b->len = 0;
    }
}

static int decode_field(decode_ctx *c, ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f,
                        const json_t *v, const char *path, int depth)
{
    char *base = (char *)msg;

    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        size_t n, es = elem_size(f->type);
        char *arr;
        if (json_is_null(v))
            return 0;
        if (!json_is_array(v))
            return fail(c, path, "expected an array");
        if (*(size_t *)(base + f->quantifier_offset) != 0)
            return fail(c, path, "given twice");
        n = json_array_size(v);
        if (n == 0)
            return 0;
        arr = calloc(n, es);
        if (arr == NULL)
            return fail(c, path, "out of memory");
        *(char **)(base + f->offset) = arr;
        for (size_t k = 0; k < n; k++) {
            char ipath[320];
            snprintf(ipath, sizeof(ipath), "%s[%zu]", path, k);
            if (f->type == PROTOBUF_C_TYPE_STRING)
                *(char **)(arr + k * es) = NULL;
            if (decode_value(c, f, json_array_get(v, k), arr + k * es, ipath, depth) != 0) {
                /* Keep the count at the elements decoded so far, for free_unpacked. */
                *(size_t *)(base + f->quantifier_offset) = k;
                return -1;
            }
            *(size_t *)(base + f->quantifier_offset) = k + 1;
        }
        return 0;
    }
    if (json_is_null(v) && f->type != PROTOBUF_C_TYPE_MESSAGE)
        return 0; /* null: the default */
    clear_field(msg, f);
    if (json_is_null(v))
        return 0;
    if (decode_value(c, f, v, base + f->offset, path, depth) != 0) {
        if (f->type == PROTOBUF_C_TYPE_STRING)
            *(char **)(base + f->offset) = f->default_value
                                               ? (char *)(uintptr_t)f->default_value
                                               : (char *)(uintptr_t)protobuf_c_empty_string;
        return -1;
    }
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
        uint32_t *cas = (uint32_t *)(base + f->quantifier_offset);
        if (*cas != 0 && *cas != f->id) {
            /* Another member of the same oneof was set: free it and reject. */
            for (unsigned i = 0; i < msg->descriptor->n_fields; i++) {
                const ProtobufCFieldDescriptor *o = &msg->descriptor->fields[i];
                if (o->id == *cas)
                    clear_field(msg, o);
            }
            *cas = f->id;
            return fail(c, path, "more than one member of a oneof given");
        }
        *cas = f->id;
    } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_MESSAGE &&
               f->type != PROTOBUF_C_TYPE_STRING) {
        *(protobuf_c_boolean *)(base + f->quantifier_offset) = 1;
    }
    return 0;
}

static ProtobufCMessage *decode_message(decode_ctx *c, const ProtobufCMessageDescriptor *d,
                                        const json_t *j, const char *path, int depth)
{
    ProtobufCMessage *msg;
    const char *key;
    json_t *v;

    if (depth > MAX_DEPTH) {
        fail(c, path, "nested too deeply");
        return NULL;
    }
    if (!json_is_object(j)) {
        snprintf(c->err, c->cap, "%s%s%s: expected a JSON object for %s", path[0] ? "field \"" : "",
                 path[0] ? path : "request", path[0] ? "\"" : "", d->name);
        return NULL;
    }
    msg = malloc(d->sizeof_message);
    if (msg == NULL) {
        snprintf(c->err, c->cap, "out of memory");
        return NULL;
    }
    d->message_init(msg);
    json_object_foreach((json_t *)(uintptr_t)j, key, v)
    {
        char fpath[256];
        const ProtobufCFieldDescriptor *f = find_field(d, key);
        snprintf(fpath, sizeof(fpath), "%s%s%s", path, path[0] ? "." : "", key);
        if (f == NULL) {
            snprintf(c->err, c->cap, "unknown field \"%s\" in %s", fpath, d->name);
            goto fail;
        }
        if (decode_field(c, msg, f, v, fpath, depth) != 0)
            goto fail;
    }
    return msg;
fail:
    protobuf_c_message_free_unpacked(msg, NULL);
    return NULL;
}

ProtobufCMessage *mg_json_to_message(const ProtobufCMessageDescriptor *desc, const json_t *json,
                                     char *err, size_t errcap)
{
    decode_ctx c = {err, errcap};
    if (errcap > 0)
        err[0] = '\0';
    return decode_message(&c, desc, json, "", 0);
}
