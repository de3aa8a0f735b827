/*
 * Agents (docs/api.md, "Agents"): this process names itself an agent of its tenant, gets a
 * port (so that "host:port" names it), allocates two buffers, looks itself up (its regions
 * and first region's address, Mooncake's get_first_buffer_address) and moves bytes from one
 * buffer into the other by (agent, address) — as a peer daemon's client would name them, with
 * the agent's one-string form "host:port" or its name and the peer's endpoint. Built with the
 * project so that the example keeps compiling against the library.
 *
 *   example_agent unix:/run/moongate/moongate.sock NAME   (MOONGATE_TOKEN: a bearer token)
 *
 * Prints "ok agent NAME port P first 0x... moved N bytes by (agent, address)" and exits 0.
 */
#include "mg_client.h"

#include "moongate/v1/agent.pb-c.h"
#include "moongate/v1/transfer.pb-c.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIZE (1 << 20)

/* One unary call; *out is the answer's bytes (freed by the caller). Returns 0 on OK. */
static int call(mg_client *c, const char *path, const ProtobufCMessage *req, uint8_t **out,
                size_t *out_len)
{
    uint8_t buf[512];
    size_t n = protobuf_c_message_pack(req, buf);
    int status;
    char msg[512];
    if (mg_client_call(c, path, buf, n, 30000, out, out_len, &status, msg, sizeof(msg)) != 0 ||
        status != 0) {
        fprintf(stderr, "%s: %d %s\n", path, status, msg);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct event_base *base = event_base_new();
    mg_client_options o = {0};
    Moongate__V1__RegisterAgentRequest reg = MOONGATE__V1__REGISTER_AGENT_REQUEST__INIT;
    Moongate__V1__DescribeAgentRequest look = MOONGATE__V1__DESCRIBE_AGENT_REQUEST__INIT;
    Moongate__V1__SubmitRequest sub = MOONGATE__V1__SUBMIT_REQUEST__INIT;
    Moongate__V1__TransferRequest t = MOONGATE__V1__TRANSFER_REQUEST__INIT, *tp = &t;
    Moongate__V1__AgentInfo *me = NULL, *seen = NULL;
    Moongate__V1__SubmitResponse *done = NULL;
    mg_client *c;
    mg_buffer a, b;
    uint8_t *resp = NULL;
    size_t len = 0;
    int status, rc = 1;
    char err[512];

    if (argc < 3) {
        fprintf(stderr, "usage: example_agent unix:/path/to/moongate.sock NAME\n");
        return 64;
    }
    o.target = argv[1];
    o.token = getenv("MOONGATE_TOKEN");
    if (mg_client_new(&c, base, &o, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    /* The agent lives as long as this client's connection. port 0: the daemon assigns one. */
    reg.name = argv[2];
    if (call(c, "/moongate.v1.Agent/RegisterAgent", &reg.base, &resp, &len) != 0)
        return 1;
    me = moongate__v1__agent_info__unpack(NULL, len, resp);
    free(resp);
    /* Its regions: buffers registered with their address in this process. */
    if (me == NULL || mg_buffer_alloc(c, SIZE, 1, NULL, &a, &status, err, sizeof(err)) != 0 ||
        mg_buffer_alloc(c, SIZE, 1, NULL, &b, &status, err, sizeof(err)) != 0) {
        fprintf(stderr, "mg_buffer_alloc: %s\n", err);
        return 1;
    }
    look.agent = argv[2]; /* a name; on a peer: look.peer = "10.0.0.2:7443", or the agent
                           * "10.0.0.2:<port>" with peer "" */
    if (call(c, "/moongate.v1.Agent/DescribeAgent", &look.base, &resp, &len) != 0)
        return 1;
    seen = moongate__v1__agent_info__unpack(NULL, len, resp);
    free(resp);
    strcpy((char *)a.addr, "hello by (agent, address)");
    t.op = MOONGATE__V1__TRANSFER_OP__WRITE;
    t.local_address = (uint64_t)(uintptr_t)a.addr;
    t.peer = "";              /* the agent is on this daemon */
    t.remote_agent = argv[2]; /* on a peer: "10.0.0.2:<port>", or its name with `peer` */
    t.remote_address = (uint64_t)(uintptr_t)b.addr; /* its address, in its process */
    t.length = 4096;
    sub.requests = &tp;
    sub.n_requests = 1;
    sub.wait = 1;
    if (seen && call(c, "/moongate.v1.Transfer/Submit", &sub.base, &resp, &len) == 0) {
        done = moongate__v1__submit_response__unpack(NULL, len, resp);
        free(resp);
    }
    if (done && done->batch && done->batch->state == MOONGATE__V1__REQUEST_STATE__DONE &&
        strcmp(b.addr, "hello by (agent, address)") == 0) {
        printf("ok agent %s port %u first 0x%llx moved %d bytes by (agent, address)\n", me->name,
               me->port, (unsigned long long)seen->first_address, 4096);
        rc = 0;
    } else if (done && done->batch && done->batch->n_requests) {
        fprintf(stderr, "request failed: %s\n", done->batch->requests[0]->message);
    }
    moongate__v1__submit_response__free_unpacked(done, NULL);
    moongate__v1__agent_info__free_unpacked(seen, NULL);
    moongate__v1__agent_info__free_unpacked(me, NULL);
    if (mg_buffer_free(c, &a, &status, err, sizeof(err)) != 0 ||
        mg_buffer_free(c, &b, &status, err, sizeof(err)) != 0)
        rc = 1;
    mg_client_del(c); /* the connection closes: the agent ends */
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    return rc;
}
