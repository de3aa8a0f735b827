/*
 * The C client library in a few lines (docs/clients.md): registers a 1 MiB segment with one
 * blocking unary call and prints where its file is. Built with the project so that the example
 * keeps compiling against the library it shows.
 *
 *   example_register TARGET [CA]      e.g. unix:/run/moongate/moongate.sock, or node-a:7443 ca.pem
 *   (MOONGATE_TOKEN: a bearer token to send)
 */
#include "mg_client.h"

#include "moongate/v1/memory.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    mg_client_options o = {0};
    Moongate__V1__RegisterRequest req = MOONGATE__V1__REGISTER_REQUEST__INIT;
    uint8_t buf[256], *resp = NULL;
    size_t n, resp_len = 0;
    int status = 0, rc = 1;
    char *message = NULL, err[256];

    if (argc < 2) {
        fprintf(stderr, "usage: example_register TARGET [CA]\n");
        return 64;
    }
    o.target = argv[1];
    o.tls = strncmp(argv[1], "unix:", 5) != 0;
    o.ca_file = argc > 2 ? argv[2] : NULL;
    o.token = getenv("MOONGATE_TOKEN"); /* or .cert_file / .key_file */
    req.name = "example";
    req.size = 1 << 20;
    n = moongate__v1__register_request__pack(&req, buf);
    if (mg_client_unary(&o, "/moongate.v1.Memory/RegisterSegment", buf, n, 10000, &resp, &resp_len,
                        &status, &message, err, sizeof(err)) != 0) {
        fprintf(stderr, "no call: %s\n", err);
    } else if (status != 0) {
        fprintf(stderr, "refused: %d %s\n", status, message);
        rc = status;
    } else {
        Moongate__V1__RegisterResponse *r =
            moongate__v1__register_response__unpack(NULL, resp_len, resp);
        if (r && r->segment) {
            printf("segment %llu at %s\n", (unsigned long long)r->segment->id, r->segment->path);
            rc = 0;
        }
        moongate__v1__register_response__free_unpacked(r, NULL);
    }
    free(resp);
    free(message);
    return rc;
}
