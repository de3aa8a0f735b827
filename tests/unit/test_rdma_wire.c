/*
 * Unit tests for the RDMA handshake's wire form (gateway/svc/mg_rdma_wire.h): an endpoint survives
 * encode, pack, unpack and decode; every malformed field a peer could send is refused, naming
 * it, before anything reaches a verbs call.
 */
#include "mg_test.h"
#include "mg_rdma_wire.h"

#include <stdlib.h>
#include <string.h>

static mg_rdma_ep sample(void)
{
    mg_rdma_ep ep;
    memset(&ep, 0, sizeof(ep));
    for (int i = 0; i < 16; i++)
        ep.gid[i] = (uint8_t)(0xf0 + i);
    ep.lid = 0x1234;
    ep.mtu = 4096;
    ep.nqps = 3;
    for (unsigned i = 0; i < ep.nqps; i++) {
        ep.qpn[i] = 0xabcde0 + i;
        ep.psn[i] = 0x123450 + i;
    }
    return ep;
}

static void test_round_trip(void)
{
    mg_rdma_ep ep = sample(), got;
    mg_rdma_wire w;
    uint8_t buf[256];
    size_t len;
    char why[200];
    Moongate__V1__RdmaEndpoint *m;
    mg_rdma_wire_encode(&ep, &w);
    len = moongate__v1__rdma_endpoint__pack(&w.msg, buf);
    m = moongate__v1__rdma_endpoint__unpack(NULL, len, buf);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(mg_rdma_wire_decode(m, &got, why, sizeof(why)), 0);
    CU_ASSERT_EQUAL(memcmp(&got, &ep, sizeof(ep)), 0);
    moongate__v1__rdma_endpoint__free_unpacked(m, NULL);
}

/* Decodes ep after `spoil` changed its message; returns the reason ("" when accepted). */
static const char *refused(void (*spoil)(Moongate__V1__RdmaEndpoint *m))
{
    static char why[200];
    mg_rdma_ep ep = sample(), got;
    mg_rdma_wire w;
    mg_rdma_wire_encode(&ep, &w);
    spoil(&w.msg);
    why[0] = '\0';
    if (mg_rdma_wire_decode(&w.msg, &got, why, sizeof(why)) == 0)
        return "";
    return why;
}

static void short_gid(Moongate__V1__RdmaEndpoint *m)
{
    m->gid.len = 15;
}
static void odd_mtu(Moongate__V1__RdmaEndpoint *m)
{
    m->mtu = 1500;
}
static void no_qps(Moongate__V1__RdmaEndpoint *m)
{
    m->n_qpn = m->n_psn = 0;
}
static void nine_qps(Moongate__V1__RdmaEndpoint *m)
{
    m->n_qpn = m->n_psn = 9;
}
static void fewer_psns(Moongate__V1__RdmaEndpoint *m)
{
    m->n_psn = 2;
}
static void zero_qpn(Moongate__V1__RdmaEndpoint *m)
{
    m->qpn[1] = 0;
}
static void wide_qpn(Moongate__V1__RdmaEndpoint *m)
{
    m->qpn[2] = 0x1000000;
}
static void wide_psn(Moongate__V1__RdmaEndpoint *m)
{
    m->psn[0] = 0xffffffff;
}
static void wide_lid(Moongate__V1__RdmaEndpoint *m)
{
    m->lid = 0x10000;
}

static void test_refusals(void)
{
    char why[200];
    mg_rdma_ep got;
    CU_ASSERT_PTR_NOT_NULL(strstr(refused(short_gid), "16 bytes, not 15"));
    CU_ASSERT_PTR_NOT_NULL(strstr(refused(odd_mtu), "MTU 1500"));
    CU_ASSERT_PTR_NOT_NULL(strstr(refused(no_qps), "0 queue pairs"));
    CU_ASSERT_PTR_NOT_NULL(strstr(refused(nine_qps), "9 queue pairs"));
    CU_ASSERT_PTR_NOT_NULL(strstr(refused(fewer_psns), "3 queue pairs with 2 PSNs"));
    CU_ASSERT_PTR_NOT_NULL(strstr(refused(zero_qpn), "queue pair 1: QPN 0"));
    CU_ASSERT_PTR_NOT_NULL(strstr(refused(wide_qpn), "queue pair 2: QPN 16777216"));
    CU_ASSERT_PTR_NOT_NULL(strstr(refused(wide_psn), "queue pair 0"));
    CU_ASSERT_PTR_NOT_NULL(strstr(refused(wide_lid), "LID 65536"));
    CU_ASSERT_EQUAL(mg_rdma_wire_decode(NULL, &got, why, sizeof(why)), -1);
    CU_ASSERT_STRING_EQUAL(why, "no RDMA endpoint");
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_round_trip),
        MG_TEST(test_refusals),
    };
    return mg_test_run("rdma_wire", cases, sizeof(cases) / sizeof(cases[0]));
}
