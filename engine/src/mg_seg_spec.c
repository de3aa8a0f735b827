/*
 * mg_seg_spec: a segment spec's checks, before the registry takes its mutex — the names
 * (tenant, segment, share list, request id), the location, what every kind shares (a client
 * address, an offset), and the kind's own checks through its table. Pure functions: the loop
 * calls them in mg_registry_reserve.
 */
#include "mg_seg_kind.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int valid_name(const char *s)
{
    size_t n = 0;
    if (s == NULL)
        return 0;
    for (; s[n]; n++) {
        char c = s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == ':'))
            return 0;
        if (n >= MG_SEG_NAME_MAX)
            return 0;
    }
    return n > 0;
}

/* Checks a share list: valid names, not the owner, no repeats, at most MG_SEG_SHARE_MAX. */
static int share_ok(const char *share, const char *owner, char *err)
{
    char buf[MG_SEG_SHARE_LEN + 1], *save = NULL, *names[MG_SEG_SHARE_MAX];
    int n = 0;
    if (share == NULL || share[0] == '\0')
        return 1;
    if (strlen(share) > MG_SEG_SHARE_LEN) {
        snprintf(err, MG_SEG_ERROR_MAX, "share list is longer than %d bytes", MG_SEG_SHARE_LEN);
        return 0;
    }
    snprintf(buf, sizeof(buf), "%s", share);
    if (buf[0] == ',' || buf[strlen(buf) - 1] == ',' || strstr(buf, ",,")) {
        snprintf(err, MG_SEG_ERROR_MAX, "share list has an empty tenant name");
        return 0;
    }
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!valid_name(t)) {
            snprintf(err, MG_SEG_ERROR_MAX, "share: tenant \"%.64s\" is not [A-Za-z0-9._:-]", t);
            return 0;
        }
        if (strcmp(t, owner) == 0) {
            snprintf(err, MG_SEG_ERROR_MAX, "share: \"%.64s\" owns the segment already", t);
            return 0;
        }
        for (int k = 0; k < n; k++)
            if (strcmp(names[k], t) == 0) {
                snprintf(err, MG_SEG_ERROR_MAX, "share: \"%.64s\" is named twice", t);
                return 0;
            }
        if (n == MG_SEG_SHARE_MAX) {
            snprintf(err, MG_SEG_ERROR_MAX, "share: at most %d tenants", MG_SEG_SHARE_MAX);
            return 0;
        }
        names[n++] = t;
    }
    return 1;
}

/* "<kind>:N" (kind "cpu" or "cuda"), N < 4096, into out; NULL or "" is "<kind>:0" where the
 * kind has a default. */
static int parse_location(const char *loc, const mg_seg_kind *kind, char out[16])
{
    size_t k = strlen(kind->location);
    unsigned long n;
    char *end;
    if (kind->location_default && (loc == NULL || *loc == '\0')) {
        snprintf(out, 16, "%s:0", kind->location);
        return 0;
    }
    if (loc == NULL || strncmp(loc, kind->location, k) != 0 || loc[k] != ':' || loc[k + 1] < '0' ||
        loc[k + 1] > '9')
        return -1;
    n = strtoul(loc + k + 1, &end, 10);
    if (*end != '\0' || n >= 4096)
        return -1;
    snprintf(out, 16, "%s:%lu", kind->location, n);
    return 0;
}

static int valid_request_id(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        if ((unsigned char)s[n] < 0x21 || (unsigned char)s[n] > 0x7e || n >= MG_SEG_NAME_MAX)
            return 0;
    }
    return 1;
}

/* What every kind shares: a client address is a local process's, with its size; an offset is
 * a passed file's. */
static int check_common(const mg_seg_kind *kind, const mg_segment_spec *spec, char *err)
{
    if (spec->client_addr != 0 && spec->client.pid <= 0 && spec->caller_uid_known) {
        /* on the Unix socket, but the kernel gave no pid: the caller is in a pid namespace
         * this daemon does not see */
        snprintf(err, MG_SEG_ERROR_MAX,
                 "this daemon cannot see the calling process (its pid is 0 here: it runs in a "
                 "pid namespace the daemon's does not contain), so it cannot reach its memory: "
                 "run the daemon in the host's pid namespace (on Kubernetes hostPID, the chart's "
                 "processMemory.enabled)");
        return MG_ERR_PERMISSION;
    }
    if (spec->client_addr != 0 && spec->client.pid <= 0) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "a client address is a local process's: register it on "
                 "the Unix socket, from the process that has the memory");
        return MG_ERR_INVALID;
    }
    if (spec->client_addr != 0 &&
        (spec->size == 0 || spec->size > UINT64_MAX - spec->client_addr)) {
        snprintf(err, MG_SEG_ERROR_MAX,
                 "a region with a client address needs its size (and "
                 "address + size within 64 bits)");
        return MG_ERR_INVALID;
    }
    if (spec->offset != 0 && !(kind->caps & MG_SEG_CAP_FD)) {
        snprintf(err, MG_SEG_ERROR_MAX, "offset is for segments of a passed descriptor only");
        return MG_ERR_INVALID;
    }
    return 0;
}

int mg_seg_check_spec(const mg_seg_env *env, const mg_segment_spec *spec, const mg_seg_kind **kind,
                      char loc[16], char *err)
{
    const mg_seg_kind *k = mg_seg_kind_of(spec->source);
    int rc;
    if (!valid_name(spec->tenant)) {
        snprintf(err, MG_SEG_ERROR_MAX, "tenant must be 1-%d characters of [A-Za-z0-9._:-]",
                 MG_SEG_NAME_MAX);
        return MG_ERR_INVALID;
    }
    if (!share_ok(spec->share, spec->tenant, err))
        return MG_ERR_INVALID;
    if (!valid_name(spec->name)) {
        snprintf(err, MG_SEG_ERROR_MAX, "name must be 1-%d characters of [A-Za-z0-9._:-]",
                 MG_SEG_NAME_MAX);
        return MG_ERR_INVALID;
    }
    if (k == NULL) {
        size_t n, w;
        const mg_seg_kind *const *all = mg_seg_kinds_all(&n);
        w = (size_t)snprintf(err, MG_SEG_ERROR_MAX, "source must be ");
        for (size_t i = 0; i < n && w < MG_SEG_ERROR_MAX; i++)
            w += (size_t)snprintf(err + w, MG_SEG_ERROR_MAX - w, "%s%s",
                                  i == 0       ? ""
                                  : i + 1 == n ? " or "
                                               : ", ",
                                  all[i]->name);
        return MG_ERR_INVALID;
    }
    if (parse_location(spec->location, k, loc) != 0) {
        snprintf(err, MG_SEG_ERROR_MAX, "location \"%.64s\" is not %s:N (N < 4096)",
                 spec->location ? spec->location : "", k->location);
        return MG_ERR_INVALID;
    }
    if (spec->request_id && !valid_request_id(spec->request_id)) {
        snprintf(err, MG_SEG_ERROR_MAX, "request id must be at most %d printable characters",
                 MG_SEG_NAME_MAX);
        return MG_ERR_INVALID;
    }
    if (spec->memlock > MG_MEMLOCK_REQUIRE) {
        snprintf(err, MG_SEG_ERROR_MAX, "memlock must be off, try or require");
        return MG_ERR_INVALID;
    }
    if ((rc = k->check(env, spec, err)) != 0 || (rc = check_common(k, spec, err)) != 0)
        return rc;
    *kind = k;
    return 0;
}
