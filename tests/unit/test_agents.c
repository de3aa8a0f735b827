/*
 * Unit tests for agents (moongate/agents.h) and what peers said of theirs (moongate/
 * agentcache.h): names unique per tenant, ports unique on the daemon (asked for, or assigned
 * from the range without handing a freed one out at once), the daemon's own ports refused,
 * another tenant's agent found as none; the one-string form "host:port"; regions resolved
 * by address within one region, only under the epoch they were learnt in, forgotten on demand;
 * ports held across a restart (the same agent gets its port back, nobody else may ask for it or
 * be assigned it, until it registers again or the time given passes) and the state file they
 * come from (written and read back, anything else refused naming its line).
 */
#include "mg_test.h"
#include "moongate/agentcache.h"
#include "moongate/agents.h"
#include "moongate/agentstate.h"

#include <stdio.h>
#include <stdlib.h>
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
    CU_ASSERT_EQUAL(mg_agents_add(a, "t1", "decode-0", 0, &p, 0, &x, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(x->port, 20000);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t1", "decode-0", 0, &p, 0, &y, why, sizeof(why)),
                    MG_ERR_EXISTS);
    CU_ASSERT_PTR_NULL(y);
    /* the same name in another tenant; the port is the host's */
    CU_ASSERT_EQUAL(mg_agents_add(a, "t2", "decode-0", 0, NULL, 0, &y, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(y->port, 20001);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t2", "other", 20000, NULL, 0, &z, why, sizeof(why)),
                    MG_ERR_EXISTS);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "port 20000"));
    CU_ASSERT_EQUAL(mg_agents_add(a, "t2", "other", 7443, NULL, 0, &z, why, sizeof(why)),
                    MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t2", "other", 65536, NULL, 0, &z, why, sizeof(why)),
                    MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t2", "bad name", 0, NULL, 0, &z, why, sizeof(why)),
                    MG_ERR_INVALID);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t2", "", 0, NULL, 0, &z, why, sizeof(why)), MG_ERR_INVALID);
    /* a port asked for, outside the range */
    CU_ASSERT_EQUAL(mg_agents_add(a, "t1", "127.0.0.1:12345", 12345, &p, 0, &z, why, sizeof(why)),
                    0);
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
    CU_ASSERT_EQUAL(mg_agents_add(a, "t1", "c", 0, NULL, 0, &w, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(w->port, 20002);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t1", "d", 0, NULL, 0, &z, why, sizeof(why)), MG_ERR_FULL);
    mg_agents_remove(a, x);
    CU_ASSERT_PTR_NULL(mg_agents_by_name(a, "t1", "decode-0"));
    CU_ASSERT_EQUAL(mg_agents_add(a, "t1", "decode-0", 0, NULL, 0, &x, why, sizeof(why)), 0);
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
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "x", 0, NULL, 0, &x, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "y", 0, NULL, 0, &x, why, sizeof(why)), MG_ERR_FULL);
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

static mg_agent_entry entry(const char *tenant, const char *name, uint32_t port)
{
    mg_agent_entry e = {.port = port};
    snprintf(e.tenant, sizeof(e.tenant), "%s", tenant);
    snprintf(e.name, sizeof(e.name), "%s", name);
    return e;
}

static void test_holds(void)
{
    mg_agents *a = table(8, 20000, 20003);
    mg_agent *x, *y, *z;
    mg_agent_hold h[4];
    mg_agent_entry e[8];
    mg_agent_entry ha = entry("t", "a", 20000), hb = entry("t", "b", 17003),
                   hc = entry("t", "c", 20001);
    char why[300];
    CU_ASSERT_EQUAL(mg_agents_hold(a, &ha, 60000, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_agents_hold(a, &hb, 60000, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_agents_hold(a, &hc, 60000, why, sizeof(why)), 0);
    /* a second hold of the same agent or port; a bad port or one of the daemon's own */
    CU_ASSERT_EQUAL(mg_agents_hold(a, &ha, 60000, why, sizeof(why)), MG_ERR_EXISTS);
    {
        mg_agent_entry dup = entry("t", "other", 17003), own = entry("t", "o", 7443),
                       zero = entry("t", "o", 0), bad = entry("t t", "o", 5);
        CU_ASSERT_EQUAL(mg_agents_hold(a, &dup, 60000, why, sizeof(why)), MG_ERR_EXISTS);
        CU_ASSERT_EQUAL(mg_agents_hold(a, &own, 60000, why, sizeof(why)), MG_ERR_INVALID);
        CU_ASSERT_EQUAL(mg_agents_hold(a, &zero, 60000, why, sizeof(why)), MG_ERR_INVALID);
        CU_ASSERT_EQUAL(mg_agents_hold(a, &bad, 60000, why, sizeof(why)), MG_ERR_INVALID);
    }
    CU_ASSERT_EQUAL(mg_agents_holds(a, 1000, h, 4), 3);
    /* assigned ports skip the held ones: 20000 and 20001 are held */
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "new", 0, NULL, 1000, &x, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(x->port, 20002);
    /* another agent asking for a held port: refused, naming the hold and the option */
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "x", 17003, NULL, 1000, &y, why, sizeof(why)),
                    MG_ERR_EXISTS);
    CU_ASSERT_PTR_NULL(y);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "port 17003 is held for agent \"b\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "59 s more (--agent-port-hold)"));
    /* another tenant's is not named to it */
    CU_ASSERT_EQUAL(mg_agents_add(a, "u", "b", 20000, NULL, 1000, &y, why, sizeof(why)),
                    MG_ERR_EXISTS);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "port 20000 is held for an agent of another tenant"));
    CU_ASSERT_PTR_NULL(strstr(why, "\"a\""));
    /* the same agent with port 0 gets its port; with the port itself too */
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "a", 0, NULL, 2000, &y, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(y->port, 20000);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "b", 17003, NULL, 2000, &z, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(z->port, 17003);
    /* registered again: the holds are over; after it ends its port is like any other */
    CU_ASSERT_EQUAL(mg_agents_holds(a, 2000, h, 4), 1);
    CU_ASSERT_STRING_EQUAL(h[0].agent.name, "c");
    mg_agents_remove(a, y);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "x", 20000, NULL, 2000, &y, why, sizeof(why)), 0);
    /* what a restart keeps: the agents, then the holds lasting */
    CU_ASSERT_EQUAL(mg_agents_entries(a, 2000, NULL, 0), 4);
    CU_ASSERT_EQUAL(mg_agents_entries(a, 2000, e, 8), 4);
    CU_ASSERT_STRING_EQUAL(e[0].name, "new");
    CU_ASSERT_STRING_EQUAL(e[3].name, "c");
    CU_ASSERT_EQUAL(e[3].port, 20001);
    /* c's hold lasts until 60000 and no longer: 59999 still held, 60000 free */
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "y", 20001, NULL, 59999, &z, why, sizeof(why)),
                    MG_ERR_EXISTS);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "for 1 s more"));
    CU_ASSERT_EQUAL(mg_agents_holds(a, 59999, NULL, 0), 1);
    CU_ASSERT_EQUAL(mg_agents_holds(a, 60000, NULL, 0), 0);
    CU_ASSERT_EQUAL(mg_agents_entries(a, 60000, NULL, 0), 3);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "y", 20001, NULL, 60000, &z, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_agents_expire(a, 60000), 0); /* gone already */
    mg_agents_del(a);
}

static void test_holds_end(void)
{
    mg_agents *a = table(2, 20000, 20001);
    mg_agent *x;
    mg_agent_entry h1 = entry("t", "a", 20000), h2 = entry("t", "b", 20001),
                   h3 = entry("t", "c", 12000);
    char why[300];
    CU_ASSERT_EQUAL(mg_agents_hold(a, &h1, 5000, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_agents_hold(a, &h2, 9000, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(mg_agents_hold(a, &h3, 9000, why, sizeof(why)), MG_ERR_FULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "--max-agents"));
    /* every port of the range held: none to assign */
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "x", 0, NULL, 0, &x, why, sizeof(why)), MG_ERR_FULL);
    CU_ASSERT_EQUAL(mg_agents_expire(a, 4999), 0);
    CU_ASSERT_EQUAL(mg_agents_expire(a, 5000), 1);
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "x", 0, NULL, 5000, &x, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(x->port, 20000);
    /* a's hold is over: it gets what is free, like anyone */
    CU_ASSERT_EQUAL(mg_agents_add(a, "t", "a", 0, NULL, 5000, &x, why, sizeof(why)), MG_ERR_FULL);
    /* an agent alive holds its name and port against a hold */
    CU_ASSERT_EQUAL(mg_agents_hold(a, &h1, 9000, why, sizeof(why)), MG_ERR_EXISTS);
    mg_agents_del(a);
}

static void test_state_file(void)
{
    mg_agent_entry v[3] = {entry("default", "a", 20000), entry("t.1", "b:x-0_9", 17003),
                           entry("t", "c", 65535)},
                   got[4];
    char *text, why[300];
    size_t len, n, line;
    CU_ASSERT_EQUAL_FATAL(mg_agentstate_format(v, 3, &text, &len), 0);
    CU_ASSERT_EQUAL(len, strlen("moongate-agents 1\nagent default a 20000\n"
                                "agent t.1 b:x-0_9 17003\nagent t c 65535\n"));
    CU_ASSERT_EQUAL(memcmp(text, "moongate-agents 1\nagent default a 20000\n", 40), 0);
    CU_ASSERT_EQUAL(mg_agentstate_parse(text, len, got, 4, &n, &line, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(n, 3);
    CU_ASSERT_STRING_EQUAL(got[1].tenant, "t.1");
    CU_ASSERT_STRING_EQUAL(got[1].name, "b:x-0_9");
    CU_ASSERT_EQUAL(got[2].port, 65535);
    /* more entries than the reader takes: refused at the line past them */
    CU_ASSERT_EQUAL(mg_agentstate_parse(text, len, got, 2, &n, &line, why, sizeof(why)),
                    MG_ERR_INVALID);
    CU_ASSERT_EQUAL(line, 4);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "line 4: more than 2 agents"));
    /* cut short: the last line without its newline */
    CU_ASSERT_EQUAL(mg_agentstate_parse(text, len - 1, got, 4, &n, &line, why, sizeof(why)),
                    MG_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "line 4: cut short"));
    free(text);
    CU_ASSERT_EQUAL(mg_agentstate_format(NULL, 0, &text, &len), 0);
    CU_ASSERT_EQUAL(mg_agentstate_parse(text, len, got, 4, &n, &line, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(n, 0);
    free(text);
    {
        static const struct {
            const char *text, *why;
        } bad[] = {
            {"", "line 1: cut short"},
            {"garbage\n", "line 1: not a moongate agents file"},
            {"\x7f"
             "ELF\x01\x02",
             "line 1: cut short"},
            {"moongate-agents 2\nagent t a 1\n", "line 1: version 2: this daemon reads version 1"},
            {"moongate-agents 1\nagent t a 0\n", "line 2: the port is not 1..65535"},
            {"moongate-agents 1\nagent t a 65536\n", "line 2: the port"},
            {"moongate-agents 1\nagent t a 20000 x\n", "line 2: the port"},
            {"moongate-agents 1\nagent t a -1\n", "line 2: the port"},
            {"moongate-agents 1\nagent t a 080\n", "line 2: the port"},
            {"moongate-agents 1\nagent t  a 1\n", "line 2: the agent's name"},
            {"moongate-agents 1\nagent t a b 1\n", "line 2: the port"},
            {"moongate-agents 1\nagent t a\n", "line 2: the agent's name"},
            {"moongate-agents 1\nagent t/x a 1\n", "line 2: the tenant"},
            {"moongate-agents 1\nagent t a\"b 1\n", "line 2: the agent's name"},
            {"moongate-agents 1\nagents t a 1\n", "line 2: not \"agent TENANT NAME PORT\""},
            {"moongate-agents 1\n\n", "line 2: not"},
            {"moongate-agents 1\r\nagent t a 1\n", "line 1: not a moongate agents file"},
            {"moongate-agents 1\nagent t a 1\r\n", "line 2: the port"},
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            int rc = mg_agentstate_parse(bad[i].text, strlen(bad[i].text), got, 4, &n, &line, why,
                                         sizeof(why));
            CU_ASSERT_EQUAL(rc, MG_ERR_INVALID);
            if (strstr(why, bad[i].why) == NULL)
                fprintf(stderr, "case %zu: \"%s\" does not say \"%s\"\n", i, why, bad[i].why);
            CU_ASSERT_PTR_NOT_NULL(strstr(why, bad[i].why));
        }
    }
    {
        /* a NUL in a name; a line longer than any a daemon writes */
        char nul[] = "moongate-agents 1\nagent t a\0b 1\n", long_line[600];
        CU_ASSERT_EQUAL(
            mg_agentstate_parse(nul, sizeof(nul) - 1, got, 4, &n, &line, why, sizeof(why)),
            MG_ERR_INVALID);
        CU_ASSERT_EQUAL(line, 2);
        memset(long_line, 'a', sizeof(long_line));
        memcpy(long_line, "moongate-agents 1\nagent t ", 26);
        long_line[sizeof(long_line) - 1] = '\n';
        CU_ASSERT_EQUAL(
            mg_agentstate_parse(long_line, sizeof(long_line), got, 4, &n, &line, why, sizeof(why)),
            MG_ERR_INVALID);
        CU_ASSERT_PTR_NOT_NULL(strstr(why, "line 2: longer than"));
    }
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_names_and_ports), MG_TEST(test_limit_and_config),
        MG_TEST(test_one_string_form), MG_TEST(test_cache),
        MG_TEST(test_holds),           MG_TEST(test_holds_end),
        MG_TEST(test_state_file),
    };
    return mg_test_run("agents", cases, sizeof(cases) / sizeof(cases[0]));
}
