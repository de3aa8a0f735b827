/*
 * Registering memory the program already has, in C (docs/clients.md): a memfd the program maps
 * and writes, passed to the daemon on its fd socket and registered by the handle it gets back.
 * The daemon maps the same pages: nothing is copied, and the program's writes are the segment's
 * bytes. Built with the project so that the example keeps compiling against the library.
 *
 *   example_register_fd unix:/run/moongate/moongate.sock      (MOONGATE_TOKEN: a bearer token)
 *
 * Prints "segment ID" and exits; the segment stays registered (the daemon holds the memfd).
 */
#include "mg_client.h"

#include "moongate/v1/memory.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SIZE (1 << 20)

int main(int argc, char **argv)
{
    mg_client_options o = {0};
    Moongate__V1__RegisterRequest req = MOONGATE__V1__REGISTER_REQUEST__INIT;
    uint8_t buf[256], *resp = NULL;
    uint64_t handle, ttl_ms;
    size_t n, resp_len = 0;
    int status = 0, rc = 1, fd;
    char *message = NULL, err[512], fd_socket[128];
    char *mem;

    if (argc < 2 || mg_fd_socket_of(argv[1], fd_socket, sizeof(fd_socket)) != 0) {
        fprintf(stderr, "usage: example_register_fd unix:/path/to/moongate.sock\n");
        return 64;
    }
    /* The program's own memory: a memfd, mapped and written here. */
    fd = memfd_create("example", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, SIZE) != 0 ||
        (mem = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        perror("memfd");
        return 1;
    }
    strcpy(mem + 4096, "hello from C");
    /* 1. Pass the descriptor; 2. register [4096, SIZE) of it by the handle. */
    o.target = argv[1];
    o.token = getenv("MOONGATE_TOKEN");
    if (mg_fd_pass(fd_socket, fd, o.token, &handle, &ttl_ms, &status, err, sizeof(err)) != 0) {
        fprintf(stderr, "fd socket refused: %d %s\n", status, err);
        return status;
    }
    req.name = "example-fd";
    req.source = MOONGATE__V1__SEGMENT_SOURCE__FD;
    req.fd_handle = handle;
    req.offset = 4096;
    req.size = SIZE - 4096;
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
            printf("segment %llu\n", (unsigned long long)r->segment->id);
            rc = 0;
        }
        moongate__v1__register_response__free_unpacked(r, NULL);
    }
    free(resp);
    free(message);
    munmap(mem, SIZE);
    close(fd); /* the daemon keeps its own mapping */
    return rc;
}
