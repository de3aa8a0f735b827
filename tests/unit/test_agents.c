/*
 * Unit tests for agents (moongate/agents.h) and what peers said of theirs (moongate/
 * agentcache.h): names unique per tenant, ports unique on the daemon (asked for, or assigned
 * from the range without handing a freed one out at once), the daemon's own ports refused,
 * another tenant's agent found as none; the one-string form "host:port"; regions resolved
 * by address within one region, only under the epoch they were learnt in, forgotten on demand.
 */
#include "mg_test.h"
#include "moongate/agentcache.h"
#include "moongate/agents.h"

#include <stdio.h>
#include <string.h>

static mg_agents *table(size_t max, uint32_t lo, uint32_t hi)
{
    mg_agents_config cfg = {.max_agents = max, .port_lo = lo, .port_hi = hi, .reserved = {7443}};
    mg_agents *a = NULL;
    CU_ASSERT_EQUAL_FATAL(mg_agents_new(&a, &cfg), 0);
    return a;
}

static void test_names_and_ports(void)
{
    mg_agents *a = table(8, 20000, 20002);
    mg_agent *x, *y, *z, *w, *v[8];
    mg_proc p = {42, 7};
    char why[256];
    CU_ASSERT_EQUAL(mg_agents_add(a, "t1", "decode-0", 0, &p, &x, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(x->port, 20000);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t1", "decode-0", 0, &p, &y, why, sizeof(why)), MG_ERR_EXISTS);
    CU_ASSERT_PTR_NULL(y);
    /* the same name in another tenant; the port is the host's */
    CU_ASSERT_EQUAL(mg_agents_add(a, "t2", "decode-0", 0, NULL, &y, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(y->port, 20001);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t2", "other", 20000, NULL, &z, why, sizeof(why)),
                    MG_ERR_EXISTS);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "port 20000"));
    CU_ASSERT_EQUAL(mg_agents_add(a, "t2", "other", 7443, NULL, &z, why, sizeof(why)),
                    MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t2", "other", 65536, NULL, &z, why, sizeof(why)),
                    MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t2", "bad name", 0, NULL, &z, why, sizeof(why)),
                    MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t2", "", 0, NULL, &z, why, sizeof(why)), MG_ERR_INVALID);
    /* a port asked for, outside the range */
    CU_ASSERT_EQUAL(mg_agents_add(a, "t1", "127.0.0.1:12345", 12345, &p, &z, why, sizeof(why)), 0);
    /* lookups: another tenant's agent is none */
    CU_ASSERT_PTR_EQUAL(mg_agents_by_name(a, "t1", "decode-0"), x);
    CU_ASSERT_PTR_EQUAL(mg_agents_by_name(a, "t2", "decode-0"), y);
    CU_ASSERT_PTR_EQUAL(mg_agents_by_port(a, "t1", 20000), x);
    CU_ASSERT_PTR_NULL(mg_agents_by_port(a, "t2", 20000));
    CU_ASSERT_PTR_NULL(mg_agents_by_port(a, "t1", 0));
    CU_ASSERT_EQUAL(mg_agents_count(a, "t1", &p), 2);
    CU_ASSERT_EQUAL(mg_agents_count(a, NULL, NULL), 3);
    CU_ASSERT_EQUAL(mg_agents_list(a, "t1", 0, v, 8), 2);
    CU_ASSERT_PTR_EQUAL(v[0], x);
    CU_ASSERT_PTR_EQUAL(v[1], z);
    CU_ASSERT_EQUAL(mg_agents_list(a, NULL, x->id, v, 8), 2);
    /* the range: 20002 is next; a port just freed is not handed out again at once */
    CU_ASSERT_EQUAL(mg_agents_add(a, "t1", "c", 0, NULL, &w, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(w->port, 20002);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t1", "d", 0, NULL, &z, why, sizeof(why)), MG_ERR_FULL);
    mg_agents_remove(a, x);
    CU_ASSERT_PTR_NULL(mg_agents_by_name(a, "t1", "decode-0"));
    CU_ASSERT_EQUAL(mg_agents_add(a, "t1", "decode-0", 0, NULL, &x, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(x->port, 20000); /* the only free one */
    mg_agents_del(a);
}

static void test_limit_and_config(void)
{
    mg_agents_config bad = {.max_agents = 1, .port_lo = 5, .port_hi = 4};
    mg_agents *a = NULL;
    mg_agent *x;
    char why[256];
    CU_ASSERT_EQUAL(mg_agents_new(&a, &bad), MG_ERR_INVALID);
    bad.port_hi = 70000;
    CU_ASSERT_EQUAL(mg_agents_new(&a, &bad), MG_ERR_INVALID);
    a = table(1, 30000, 30010);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "x", 0, NULL, &x, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "y", 0, NULL, &x, why, sizeof(why)), MG_ERR_FULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "--max-agents"));
    mg_agents_del(a);
    mg_agents_del(NULL);
}

static void test_one_string_form(void)
{
    mg_agent_ref r;
    char why[256], buf[200];
    CU_ASSERT_EQUAL(mg_agent_ref_parse("", "10.0.0.2:12345", 7443, &r, why, sizeof(why)), 0);
    CU_ASSERT_STRING_EQUAL(r.peer, "10.0.0.2:7443");
    CU_ASSERT_EQUAL(r.port, 12345);
    CU_ASSERT_STRING_EQUAL(r.name, "");
    CU_ASSERT_STRING_EQUAL(mg_agent_ref_str(&r, buf, sizeof(buf)), "agent at port 12345");
    CU_ASSERT_EQUAL(mg_agent_ref_parse("", "[::1]:12345", 9000, &r, why, sizeof(why)), 0);
    CU_ASSERT_STRING_EQUAL(r.peer, "[::1]:9000");
    /* with a peer, the string is a name, even one shaped like host:port */
    CU_ASSERT_EQUAL(
        mg_agent_ref_parse("10.0.0.3:7443", "10.0.0.2:12345", 7443, &r, why, sizeof(why)), 0);
    CU_ASSERT_STRING_EQUAL(r.peer, "10.0.0.3:7443");
    CU_ASSERT_STRING_EQUAL(r.name, "10.0.0.2:12345");
    CU_ASSERT_EQUAL(r.port, 0);
    /* a name here */
    CU_ASSERT_EQUAL(mg_agent_ref_parse("", "decode-0", 7443, &r, why, sizeof(why)), 0);
    CU_ASSERT_STRING_EQUAL(r.peer, "");
    CU_ASSERT_STRING_EQUAL(mg_agent_ref_str(&r, buf, sizeof(buf)), "agent \"decode-0\"");
    /* the one-string form with a port no agent has: refused naming the port, not a name */
    CU_ASSERT_EQUAL(mg_agent_ref_parse("", "host:0", 7443, &r, why, sizeof(why)), MG_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "port 0 is not 1..65535"));
    CU_ASSERT_EQUAL(mg_agent_ref_parse("", "127.0.0.1:70000", 7443, &r, why, sizeof(why)),
                    MG_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "port 70000 is not 1..65535"));
    CU_ASSERT_EQUAL(mg_agent_ref_parse("", "[::1]:0", 7443, &r, why, sizeof(why)), MG_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "port 0 is not"));
    CU_ASSERT_EQUAL(
        mg_agent_ref_parse("", "10.0.0.2:99999999999999999999999", 7443, &r, why, sizeof(why)),
        MG_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "port 99999999999999999999999 is not 1..65535"));
    CU_ASSERT_EQUAL(mg_agent_ref_parse("", ":12345", 7443, &r, why, sizeof(why)), 0);
    CU_ASSERT_STRING_EQUAL(r.name, ":12345"); /* no host: a name */
    CU_ASSERT_EQUAL(mg_agent_ref_parse("", "a b", 7443, &r, why, sizeof(why)), MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_agent_ref_parse("", "", 7443, &r, why, sizeof(why)), MG_ERR_INVALID);
}

static void test_cache(void)
{
    mg_agent_cache *c = NULL;
    mg_remote_region regs[] = {{0x1000, 0x1000, 11}, {0x4000, 0x2000, 12}};
    mg_remote_agent a = {.name = "decode-0", .port = 20000, .agent_id = 5, .regions = regs, .n = 2},
                    got;
    mg_agent_ref by_name = {.peer = "10.0.0.2:7443", .name = "decode-0"},
                 by_port = {.peer = "10.0.0.2:7443", .port = 20000};
    uint64_t id, off;
    char why[300];
    CU_ASSERT_EQUAL(mg_agent_cache_new(&c, 2), 0);
    CU_ASSERT_EQUAL(mg_agent_cache_resolve(c, "t@10.0.0.2:7443", 9, &by_name, 0x1000, 8, &id, &off,
                                           why, sizeof(why)),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_agent_cache_put(c, "t@10.0.0.2:7443", 9, &a), 0);
    regs[0].id = 99; /* the cache keeps its own copy */
    CU_ASSERT_EQUAL(mg_agent_cache_resolve(c, "t@10.0.0.2:7443", 9, &by_name, 0x1800, 0x800, &id,
                                           &off, why, sizeof(why)),
                    0);
    CU_ASSERT_EQUAL(id, 11);
    CU_ASSERT_EQUAL(off, 0x800);
    CU_ASSERT_EQUAL(mg_agent_cache_resolve(c, "t@10.0.0.2:7443", 9, &by_port, 0x5fff, 1, &id, &off,
                                           why, sizeof(why)),
                    0);
    CU_ASSERT_EQUAL(id, 12);
    /* outside every region; running past one; another epoch; another peer key */
    CU_ASSERT_EQUAL(mg_agent_cache_resolve(c, "t@10.0.0.2:7443", 9, &by_name, 0x3000, 1, &id, &off,
                                           why, sizeof(why)),
                    MG_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "no region holding address 0x3000"));
    CU_ASSERT_EQUAL(mg_agent_cache_resolve(c, "t@10.0.0.2:7443", 9, &by_name, 0x1800, 0x801, &id,
                                           &off, why, sizeof(why)),
                    MG_ERR_RANGE);
    CU_ASSERT_EQUAL(mg_agent_cache_resolve(c, "t@10.0.0.2:7443", 10, &by_name, 0x1000, 1, &id, &off,
                                           why, sizeof(why)),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_agent_cache_resolve(c, "u@10.0.0.2:7443", 9, &by_name, 0x1000, 1, &id, &off,
                                           why, sizeof(why)),
                    MG_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(mg_agent_cache_get(c, "t@10.0.0.2:7443", 9, &by_port, &got), 0);
    CU_ASSERT_EQUAL(got.agent_id, 5);
    /* a put replaces what was said of the agent; the oldest goes past the bound */
    a.agent_id = 6;
    CU_ASSERT_EQUAL(mg_agent_cache_put(c, "t@10.0.0.2:7443", 10, &a), 0);
    CU_ASSERT_EQUAL(mg_agent_cache_count(c), 1);
    CU_ASSERT_EQUAL(mg_agent_cache_get(c, "t@10.0.0.2:7443", 10, &by_name, &got), 0);
    CU_ASSERT_EQUAL(got.regions[0].id, 99);
    mg_agent_cache_forget(c, "t@10.0.0.2:7443", &by_port);
    CU_ASSERT_EQUAL(mg_agent_cache_count(c), 0);
    /* malformed: overlapping, empty, out of order, wrapping */
    {
        mg_remote_region bad[][2] = {{{0x1000, 0x2000, 1}, {0x2000, 0x10, 2}},
                                     {{0x1000, 0, 1}, {0x2000, 0x10, 2}},
                                     {{0x3000, 0x10, 1}, {0x2000, 0x10, 2}},
                                     {{UINT64_MAX - 4, 0x10, 1}, {0, 0, 0}}};
        for (size_t i = 0; i < 4; i++) {
            mg_remote_agent m = {.name = "m", .regions = bad[i], .n = i == 3 ? 1 : 2};
            CU_ASSERT_EQUAL(mg_agent_cache_put(c, "t@x:1", 1, &m), MG_ERR_INVALID);
        }
    }
    for (int i = 0; i < 3; i++) {
        mg_remote_agent m = {.regions = regs, .n = 1};
        snprintf(m.name, sizeof(m.name), "a%d", i);
        CU_ASSERT_EQUAL(mg_agent_cache_put(c, "t@x:1", 1, &m), 0);
    }
    CU_ASSERT_EQUAL(mg_agent_cache_count(c), 2);
    {
        mg_agent_ref a0 = {.peer = "x:1", .name = "a0"};
        CU_ASSERT_EQUAL(mg_agent_cache_get(c, "t@x:1", 1, &a0, &got), MG_ERR_NOT_FOUND);
    }
    mg_agent_cache_del(c);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_names_and_ports),
        MG_TEST(test_limit_and_config),
        MG_TEST(test_one_string_form),
        MG_TEST(test_cache),
    };
    return mg_test_run("agents", cases, sizeof(cases) / sizeof(cases[0]));
}
