/* Unit tests: readable routes matched to their methods, and their query strings (mg_route). */
#include "mg_gateway.h"
#include "mg_route.h"
#include "mg_test.h"

#include <string.h>

static const mg_route list = {"GET", "/v1/segments", 0, "/m/List"};
static const mg_route reg = {"POST", "/v1/segments", 0, "/m/Register"};
static const mg_route get = {"GET", "/v1/segments", 1, "/m/Get"};
static const mg_route del = {"DELETE", "/v1/segments", 1, "/m/Unregister"};
static const mg_route pool = {"GET", "/v1/pool", 0, "/p/Stats"};
static const mg_route *const routes[] = {&list, &reg, &get, &del, &pool};
#define N (sizeof(routes) / sizeof(routes[0]))

static void test_find(void)
{
    mg_route_match m;
    CU_ASSERT_EQUAL(mg_route_find(routes, N, "GET", "/v1/segments", &m), MG_ROUTE_HIT);
    CU_ASSERT(m.route == &list && m.id[0] == '\0' && m.query == NULL);
    CU_ASSERT_EQUAL(mg_route_find(routes, N, "POST", "/v1/segments?x=1", &m), MG_ROUTE_HIT);
    CU_ASSERT(m.route == &reg && strcmp(m.query, "x=1") == 0);
    CU_ASSERT_EQUAL(mg_route_find(routes, N, "DELETE", "/v1/segments/42", &m), MG_ROUTE_HIT);
    CU_ASSERT(m.route == &del && strcmp(m.id, "42") == 0);
    CU_ASSERT_EQUAL(mg_route_find(routes, N, "GET", "/v1/segments/42?a=b&c=d", &m), MG_ROUTE_HIT);
    CU_ASSERT(m.route == &get && strcmp(m.id, "42") == 0 && strcmp(m.query, "a=b&c=d") == 0);
    /* the path is known, the verb is not */
    CU_ASSERT_EQUAL(mg_route_find(routes, N, "PUT", "/v1/segments/42", &m), MG_ROUTE_VERB);
    CU_ASSERT_EQUAL(mg_route_find(routes, N, "DELETE", "/v1/pool", &m), MG_ROUTE_VERB);
    /* not routes: a longer name, an empty or nested id, a trailing slash, another prefix */
    CU_ASSERT_EQUAL(mg_route_find(routes, N, "GET", "/v1/segmentsX", &m), MG_ROUTE_NONE);
    CU_ASSERT_EQUAL(mg_route_find(routes, N, "GET", "/v1/segments/", &m), MG_ROUTE_NONE);
    CU_ASSERT_EQUAL(mg_route_find(routes, N, "GET", "/v1/segments/1/2", &m), MG_ROUTE_NONE);
    CU_ASSERT_EQUAL(mg_route_find(routes, N, "GET", "/v1/pool/", &m), MG_ROUTE_NONE);
    CU_ASSERT_EQUAL(mg_route_find(routes, N, "GET", "/v1/leases", &m), MG_ROUTE_NONE);
    CU_ASSERT_EQUAL(mg_route_find(routes, N, "GET", "/v1", &m), MG_ROUTE_NONE);
    CU_ASSERT_EQUAL(mg_route_find(routes, N, "GET", "", &m), MG_ROUTE_NONE);
    {
        char long_id[300];
        memset(long_id, 'a', sizeof(long_id));
        memcpy(long_id, "/v1/segments/", 13);
        long_id[sizeof(long_id) - 1] = '\0';
        CU_ASSERT_EQUAL(mg_route_find(routes, N, "GET", long_id, &m), MG_ROUTE_NONE);
    }
}

static void expect_query_error(const char *q, const char *needle)
{
    char err[256] = "";
    json_t *o = json_object();
    CU_ASSERT_EQUAL(mg_route_query(q, o, err, sizeof(err)), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, needle));
    if (strstr(err, needle) == NULL)
        fprintf(stderr, "query %s: %s\n", q, err);
    json_decref(o);
}

static void test_query(void)
{
    char err[256];
    json_t *o = json_object();
    CU_ASSERT_EQUAL(
        mg_route_query("page_size=2&page_token=a%20b&topic=kv%2F0&e=", o, err, sizeof(err)), 0);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(o, "page_size")), "2");
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(o, "page_token")), "a b");
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(o, "topic")), "kv/0");
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(o, "e")), "");
    json_decref(o);
    expect_query_error("page_token=%00abc", "query parameter \"page_token\": holds a NUL byte");
    expect_query_error("topic=kv%00x", "query parameter \"topic\": holds a NUL byte");
    expect_query_error("topic=%FF", "query parameter \"topic\": is not valid UTF-8");
    expect_query_error("to%00pic=x", "query parameter name \"to%00pic\" holds a NUL byte");
    expect_query_error("novalue", "\"novalue\" is not name=value");
    expect_query_error("=x", "is not name=value");
    {
        char q[600];
        memset(q, 'a', sizeof(q));
        memcpy(q, "x=", 2);
        q[sizeof(q) - 1] = '\0';
        expect_query_error(q, "longer than 511 bytes");
    }
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_find),
        MG_TEST(test_query),
    };
    return mg_test_run("readable routes", cases, sizeof(cases) / sizeof(cases[0]));
}
