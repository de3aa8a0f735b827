/*
 * svc_reflection: grpc.reflection.v1 and v1alpha ServerReflectionInfo, so that grpcurl-style
 * tools work without our .proto files.
 *
 * The descriptor set of every proto the daemon serves (with its imports) is embedded at build
 * time (mg_descriptor_set). At start-up it is decoded once and indexed: file names, and the
 * fully-qualified names of messages, enums, services and methods. Each request on the stream is
 * answered as it arrives; a file answer carries the file and those of its transitive
 * dependencies not yet sent on this stream. The two versions share one wire format, so the
 * v1alpha method decodes with the v1 message descriptors. Loop thread only.
 */
#include "mg_gateway.h"
#include "mg_service.h"

#include "google/protobuf/descriptor.pb-c.h"
#include "grpc/reflection/v1/reflection.pb-c.h"

#include <stdlib.h>
#include <string.h>

extern const unsigned char mg_descriptor_set[];
extern const size_t mg_descriptor_set_len;

typedef struct {
    char *name;
    size_t file;
} symbol;

typedef struct {
    Google__Protobuf__FileDescriptorProto *fd;
    ProtobufCBinaryData bytes; /* the serialized FileDescriptorProto */
} file_entry;

struct mg_reflection {
    Google__Protobuf__FileDescriptorSet *set;
    file_entry *files;
    size_t n_files;
    symbol *symbols;
    size_t n_symbols, cap_symbols;
};

extern const mg_service mg_svc_reflection;

/* The service's state, kept in its slot of the gateway (mg_gateway_state). */
static struct mg_reflection *reflection_of(mg_gateway *gw)
{
    return *mg_gateway_state(gw, &mg_svc_reflection);
}

typedef Grpc__Reflection__V1__ServerReflectionRequest refl_req;
typedef Grpc__Reflection__V1__ServerReflectionResponse refl_resp;

static int add_symbol(struct mg_reflection *r, const char *prefix, const char *name, size_t file)
{
    size_t n = strlen(prefix) + strlen(name) + 2;
    char *s;
    if (r->n_symbols == r->cap_symbols) {
        size_t cap = r->cap_symbols ? r->cap_symbols * 2 : 64;
        symbol *ns = realloc(r->symbols, cap * sizeof(*ns));
        if (ns == NULL)
            return MG_ERR_NOMEM;
        r->symbols = ns;
        r->cap_symbols = cap;
    }
    s = malloc(n);
    if (s == NULL)
        return MG_ERR_NOMEM;
    snprintf(s, n, "%s%s%s", prefix, *prefix ? "." : "", name);
    r->symbols[r->n_symbols].name = s;
    r->symbols[r->n_symbols].file = file;
    r->n_symbols++;
    return 0;
}

static int index_messages(struct mg_reflection *r, const char *prefix,
                          Google__Protobuf__DescriptorProto **msgs, size_t n, size_t file)
{
    for (size_t i = 0; i < n; i++) {
        char full[512];
        int rc = add_symbol(r, prefix, msgs[i]->name, file);
        if (rc != 0)
            return rc;
        snprintf(full, sizeof(full), "%s%s%s", prefix, *prefix ? "." : "", msgs[i]->name);
        for (size_t e = 0; e < msgs[i]->n_enum_type; e++) {
            if ((rc = add_symbol(r, full, msgs[i]->enum_type[e]->name, file)) != 0)
                return rc;
        }
        rc = index_messages(r, full, msgs[i]->nested_type, msgs[i]->n_nested_type, file);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int reflection_index(struct mg_reflection *r)
{
    r->set = google__protobuf__file_descriptor_set__unpack(NULL, mg_descriptor_set_len,
                                                           mg_descriptor_set);
    if (r->set == NULL)
        return MG_ERR_PROTOCOL;
    r->n_files = r->set->n_file;
    r->files = calloc(r->n_files ? r->n_files : 1, sizeof(*r->files));
    if (r->files == NULL)
        return MG_ERR_NOMEM;
    for (size_t i = 0; i < r->n_files; i++) {
        Google__Protobuf__FileDescriptorProto *fd = r->set->file[i];
        const char *pkg = fd->package ? fd->package : "";
        size_t len = protobuf_c_message_get_packed_size(&fd->base);
        int rc;
        r->files[i].fd = fd;
        r->files[i].bytes.data = malloc(len ? len : 1);
        if (r->files[i].bytes.data == NULL)
            return MG_ERR_NOMEM;
        r->files[i].bytes.len = protobuf_c_message_pack(&fd->base, r->files[i].bytes.data);
        if ((rc = index_messages(r, pkg, fd->message_type, fd->n_message_type, i)) != 0)
            return rc;
        for (size_t e = 0; e < fd->n_enum_type; e++) {
            if ((rc = add_symbol(r, pkg, fd->enum_type[e]->name, i)) != 0)
                return rc;
        }
        for (size_t s = 0; s < fd->n_service; s++) {
            char svc[512];
            if ((rc = add_symbol(r, pkg, fd->service[s]->name, i)) != 0)
                return rc;
            snprintf(svc, sizeof(svc), "%s%s%s", pkg, *pkg ? "." : "", fd->service[s]->name);
            for (size_t m = 0; m < fd->service[s]->n_method; m++) {
                if ((rc = add_symbol(r, svc, fd->service[s]->method[m]->name, i)) != 0)
                    return rc;
            }
        }
    }
    return 0;
}

static long find_file(const struct mg_reflection *r, const char *name)
{
    for (size_t i = 0; i < r->n_files; i++) {
        if (r->files[i].fd->name && strcmp(r->files[i].fd->name, name) == 0)
            return (long)i;
    }
    return -1;
}

static long find_symbol(const struct mg_reflection *r, const char *name)
{
    for (size_t i = 0; i < r->n_symbols; i++) {
        if (strcmp(r->symbols[i].name, name) == 0)
            return (long)r->symbols[i].file;
    }
    return -1;
}

/* Per-stream state: which files were already sent. */
typedef struct {
    uint8_t *sent;
} refl_stream;

/* Appends file i and its dependencies not yet sent (dependencies first). */
static void collect_files(const struct mg_reflection *r, size_t i, uint8_t *sent,
                          ProtobufCBinaryData *out, size_t *n, int depth)
{
    if (sent[i] || depth > 64)
        return;
    sent[i] = 1;
    for (size_t d = 0; d < r->files[i].fd->n_dependency; d++) {
        long dep = find_file(r, r->files[i].fd->dependency[d]);
        if (dep >= 0)
            collect_files(r, (size_t)dep, sent, out, n, depth + 1);
    }
    out[(*n)++] = r->files[i].bytes;
}

static void refl_message(mg_call *call, const ProtobufCMessage *m)
{
    const refl_req *req = (const void *)m;
    mg_gateway *gw = mg_call_gateway(call);
    struct mg_reflection *r = reflection_of(gw);
    refl_stream *st = mg_call_data(call);
    refl_resp resp = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
    Grpc__Reflection__V1__FileDescriptorResponse fdr =
        GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
    Grpc__Reflection__V1__ListServiceResponse lsr =
        GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
    Grpc__Reflection__V1__ErrorResponse er = GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
    Grpc__Reflection__V1__ServiceResponse svcs[MG_MAX_METHODS];
    Grpc__Reflection__V1__ServiceResponse *svcp[MG_MAX_METHODS];
    char names[MG_MAX_METHODS][128];
    ProtobufCBinaryData *files = NULL;
    char errmsg[300];
    long idx = -1;

    if (st == NULL) {
        st = calloc(1, sizeof(*st));
        if (st == NULL || (st->sent = calloc(r->n_files + 1, 1)) == NULL) {
            free(st);
            mg_call_fail(call, MG_ERR_NOMEM, NULL);
            return;
        }
        mg_call_set_data(call, st);
    }
    resp.valid_host = req->host;
    memcpy(&resp.original_request, &req, sizeof(req)); /* echoed, never modified */

    switch (req->message_request_case) {
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES: {
        size_t n = 0;
        const mg_method *meth;
        for (size_t i = 0; (meth = mg_gateway_method(gw, i)) != NULL; i++) {
            const char *p = meth->path + 1;
            const char *slash = strchr(p, '/');
            size_t len = slash ? (size_t)(slash - p) : strlen(p);
            int dup = 0;
            if (len >= sizeof(names[0]))
                continue;
            for (size_t k = 0; k < n; k++)
                dup |= strlen(names[k]) == len && memcmp(names[k], p, len) == 0;
            if (dup)
                continue;
            memcpy(names[n], p, len);
            names[n][len] = '\0';
            grpc__reflection__v1__service_response__init(&svcs[n]);
            svcs[n].name = names[n];
            svcp[n] = &svcs[n];
            n++;
        }
        lsr.service = svcp;
        lsr.n_service = n;
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
        resp.list_services_response = &lsr;
        break;
    }
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
        idx = find_file(r, req->file_by_filename);
        if (idx < 0)
            snprintf(errmsg, sizeof(errmsg), "file \"%s\" not found", req->file_by_filename);
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
        idx = find_symbol(r, req->file_containing_symbol);
        if (idx < 0)
            snprintf(errmsg, sizeof(errmsg), "symbol \"%s\" not found",
                     req->file_containing_symbol);
        break;
    default:
        snprintf(errmsg, sizeof(errmsg), "extensions are not served: none are defined");
        break;
    }

    if (resp.message_response_case == 0 && idx >= 0) {
        size_t n = 0;
        files = calloc(r->n_files, sizeof(*files));
        if (files == NULL) {
            mg_call_fail(call, MG_ERR_NOMEM, NULL);
            return;
        }
        /* The requested file always goes out, even when sent before on this stream. */
        st->sent[idx] = 0;
        collect_files(r, (size_t)idx, st->sent, files, &n, 0);
        fdr.file_descriptor_proto = files;
        fdr.n_file_descriptor_proto = n;
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
        resp.file_descriptor_response = &fdr;
    } else if (resp.message_response_case == 0) {
        er.error_code = MG_GRPC_NOT_FOUND;
        er.error_message = errmsg;
        resp.message_response_case =
            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
        resp.error_response = &er;
    }
    mg_call_send(call, &resp.base);
    free(files);
}

static void refl_stream_free(mg_call *call)
{
    refl_stream *st = mg_call_data(call);
    if (st) {
        free(st->sent);
        free(st);
        mg_call_set_data(call, NULL);
    }
}

static void refl_half_close(mg_call *call)
{
    refl_stream_free(call);
    mg_call_finish(call, MG_GRPC_OK, NULL);
}

/* v1 and v1alpha differ only in their package: one handler, the v1 message types for both. */
#define REFLECTION_METHOD(pkg)                                                                   \
    {                                                                                            \
        .path = "/grpc.reflection." pkg ".ServerReflection/ServerReflectionInfo",                \
        .kind = MG_RPC_BIDI, .in = &grpc__reflection__v1__server_reflection_request__descriptor, \
        .out = &grpc__reflection__v1__server_reflection_response__descriptor,                    \
        .on_message = refl_message, .on_half_close = refl_half_close,                            \
        .on_cancel = refl_stream_free, .open = 1,                                                \
    }

static const mg_method refl_methods[] = {REFLECTION_METHOD("v1"), REFLECTION_METHOD("v1alpha")};

static int mg_svc_reflection_init(mg_gateway *gw)
{
    int rc;
    *mg_gateway_state(gw, &mg_svc_reflection) = calloc(1, sizeof(*reflection_of(gw)));
    if (reflection_of(gw) == NULL)
        return MG_ERR_NOMEM;
    if ((rc = reflection_index(reflection_of(gw))) != 0)
        return rc;
    return mg_gateway_add_methods(gw, refl_methods, MG_NELEM(refl_methods), NULL, 0);
}

static void mg_svc_reflection_free(mg_gateway *gw)
{
    struct mg_reflection *r = reflection_of(gw);
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->n_symbols; i++)
        free(r->symbols[i].name);
    free(r->symbols);
    for (size_t i = 0; r->files && i < r->n_files; i++)
        free(r->files[i].bytes.data);
    free(r->files);
    if (r->set)
        google__protobuf__file_descriptor_set__free_unpacked(r->set, NULL);
    free(r);
    *mg_gateway_state(gw, &mg_svc_reflection) = NULL;
}

const mg_service mg_svc_reflection = {
    .name = "reflection", .init = mg_svc_reflection_init, .free = mg_svc_reflection_free};
