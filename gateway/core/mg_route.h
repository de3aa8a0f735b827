/*
 * mg_route: readable routes (GET /v1/segments/42?x=1) to the unary methods they stand for.
 * Pure functions over the gateway's route table; no I/O, no calls. mg_call.c turns a match into
 * a JSON call of the route's method.
 */
#ifndef MG_ROUTE_H
#define MG_ROUTE_H

#include <jansson.h>
#include <stddef.h>

struct mg_route;

typedef enum {
    MG_ROUTE_NONE = 0, /* no route has this path: not a readable route */
    MG_ROUTE_VERB = 1, /* a route has this path, none takes this verb */
    MG_ROUTE_HIT = 2,
} mg_route_result;

typedef struct mg_route_match {
    const struct mg_route *route;
    char id[128];      /* the path's {id} for a route with one, else "" */
    const char *query; /* in the path given, after '?'; NULL without one */
} mg_route_match;

/* Matches verb and path ("/v1/segments/42?x=1") against routes[0..n). A route with an id
 * matches its prefix, '/', then one non-empty path segment; one without, its prefix exactly. */
mg_route_result mg_route_find(const struct mg_route *const *routes, size_t n, const char *verb,
                              const char *path, mg_route_match *m);

/* Adds a query string's name=value pairs, percent-decoded, to obj as strings. Returns 0, or -1
 * with err naming what is wrong: a pair that is not name=value, a name or value holding a NUL
 * byte or invalid UTF-8 once decoded (`query parameter "topic": holds a NUL byte`), or a query
 * longer than 511 bytes. */
int mg_route_query(const char *query, json_t *obj, char *err, size_t errcap);

#endif
