/*
 * Fuzz target: the --auth-file parser. Any bytes either parse into a table whose every entry
 * can be looked up again, or are refused with a message that names a line; nothing crashes or
 * leaks. Lookups with fuzzed names and tokens must not read past what they were given.
 */
#include "mg_auth.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256] = "";
    uint8_t h[MG_AUTH_HASH_LEN];
    mg_principal p;
    mg_auth *a = mg_auth_parse((const char *)data, size, err, sizeof(err));
    if (a == NULL) {
        if (strncmp(err, "line ", 5) != 0 && strcmp(err, "out of memory") != 0 &&
            strncmp(err, "more than", 9) != 0)
            abort(); /* every refusal says where */
        return 0;
    }
    /* Lookups with pieces of the input as credentials. */
    {
        size_t n = size < 200 ? size : 200;
        char *names = malloc(n + 2);
        if (names) {
            memcpy(names, data, n);
            names[n] = '\n';
            names[n + 1] = '\0';
            if (memchr(names, '\0', n) == NULL) /* the gateway builds names without NULs */
                (void)mg_auth_by_cert(a, names, &p);
            free(names);
        }
        mg_auth_hash((const char *)data, n, h);
        if (mg_auth_by_token(a, h, &p) == 0 && !mg_tenant_ok(p.tenant, strlen(p.tenant)))
            abort();
        (void)mg_auth_by_uid(a, size, &p);
    }
    mg_auth_free(a);
    return 0;
}
