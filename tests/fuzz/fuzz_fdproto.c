/*
 * Fuzz target: the fd socket's messages (mg_fdproto.h). Any bytes as a request either parse
 * into "PUT" with an optional one-word token inside the input, or are refused with a reason;
 * any bytes as a reply either parse into a handle and a ttl, or give a code and a message that
 * fits its buffer. Nothing reads past what it was given.
 */
#include "mg_fdproto.h"
#include "mg_grpc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1), msg[64];
    const char *token, *why;
    uint64_t handle, ttl;
    int code;
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    if (mg_fdproto_request(text, size, &token, &why) == 0) {
        if (strncmp(text, "PUT", 3) != 0)
            abort();
        if (token &&
            (token < text || token > text + size || strlen(token) > 1024 || strchr(token, ' ')))
            abort();
    } else if (why == NULL || why[0] == '\0') {
        abort();
    }
    memcpy(text, data, size);
    text[size] = '\0';
    if (mg_fdproto_reply(text, &handle, &ttl, &code, msg, sizeof(msg)) == 0) {
        if (code != MG_GRPC_OK || strncmp(text, "OK ", 3) != 0)
            abort();
    } else if (code <= 0 || code >= MG_GRPC_CODE_COUNT || strlen(msg) >= sizeof(msg)) {
        abort();
    }
    free(text);
    return 0;
}
