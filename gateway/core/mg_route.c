/* mg_route: readable routes and their query strings (mg_route.h). */
#include "mg_route.h"
#include "mg_gateway.h"

#include "mg_pbcheck.h"
#include "mg_str.h"

#include <stdio.h>
#include <string.h>

mg_route_result mg_route_find(const mg_route *const *routes, size_t n, const char *verb,
                              const char *path, mg_route_match *m)
{
    size_t plen = strcspn(path, "?");
    mg_route_result res = MG_ROUTE_NONE;
    memset(m, 0, sizeof(*m));
    for (size_t i = 0; i < n; i++) {
        const mg_route *r = routes[i];
        size_t len = strlen(r->prefix), idlen;
        const char *rest = path + len;
        if (plen < len || strncmp(path, r->prefix, len) != 0)
            continue;
        idlen = plen - len;
        if (r->with_id) { /* "/ID": one non-empty segment */
            if (idlen < 2 || rest[0] != '/' || memchr(rest + 1, '/', idlen - 1) != NULL ||
                idlen - 1 >= sizeof(m->id))
                continue;
        } else if (idlen != 0) {
            continue;
        }
        res = MG_ROUTE_VERB;
        if (strcmp(verb, r->verb) != 0)
            continue;
        m->route = r;
        if (r->with_id) {
            memcpy(m->id, rest + 1, idlen - 1);
            m->id[idlen - 1] = '\0';
        }
        if (path[plen] == '?')
            m->query = path + plen + 1;
        return MG_ROUTE_HIT;
    }
    return res;
}

int mg_route_query(const char *query, json_t *obj, char *err, size_t errcap)
{
    char buf[512], *save = NULL, *tok;
    if (strlen(query) >= sizeof(buf)) {
        snprintf(err, errcap, "query string longer than %zu bytes", sizeof(buf) - 1);
        return -1;
    }
    mg_strlcpy(buf, query, sizeof(buf));
    for (tok = strtok_r(buf, "&", &save); tok; tok = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(tok, '='), key[128], val[512];
        size_t klen, vlen;
        const char *why;
        if (eq == NULL || eq == tok || (size_t)(eq - tok) >= sizeof(key)) {
            snprintf(err, errcap, "malformed query string: \"%.64s\" is not name=value", tok);
            return -1;
        }
        *eq = '\0';
        klen = mg_pct_decode(key, tok, strlen(tok));
        vlen = mg_pct_decode(val, eq + 1, strlen(eq + 1));
        if ((why = mg_string_problem((const uint8_t *)key, klen)) != NULL) {
            snprintf(err, errcap, "query parameter name \"%.64s\" %s", tok, why);
            return -1;
        }
        if ((why = mg_string_problem((const uint8_t *)val, vlen)) != NULL) {
            snprintf(err, errcap, "query parameter \"%s\": %s", key, why);
            return -1;
        }
        if (json_object_set_new(obj, key, json_stringn(val, vlen)) != 0) {
            snprintf(err, errcap, "out of memory");
            return -1;
        }
    }
    return 0;
}
