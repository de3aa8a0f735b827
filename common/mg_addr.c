/* mg_addr: "host:port" strings (see mg_addr.h). */
#include "mg_addr.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

int mg_split_host_port(const char *s, char *host, size_t cap, int *port)
{
    const char *colon = strrchr(s, ':');
    char *end;
    long p;
    size_t n;
    if (colon == NULL || colon[1] == '\0')
        return -1;
    p = strtol(colon + 1, &end, 10);
    if (*end != '\0' || p < 0 || p > 65535)
        return -1;
    n = (size_t)(colon - s);
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
        s++;
        n -= 2;
    }
    if (n == 0 || n >= cap)
        return -1;
    memcpy(host, s, n);
    host[n] = '\0';
    *port = (int)p;
    return 0;
}

int mg_is_numeric_host_port(const char *s)
{
    char host[64];
    unsigned char addr[16];
    int port;
    if (mg_split_host_port(s, host, sizeof(host), &port) != 0)
        return 0;
    return inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
}

/* Non-zero for a DNS name: dot-separated labels of [A-Za-z0-9-], 1..63 bytes each, none
 * starting or ending with '-', at most 253 bytes in all (a final dot allowed). */
static int dns_name(const char *h)
{
    size_t n = strlen(h), label = 0;
    if (n == 0 || n > 254 || (n == 254 && h[253] != '.'))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = h[i];
        if (c == '.') {
            if (label == 0 || h[i - 1] == '-')
                return 0;
            label = 0;
            continue;
        }
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-') ||
            (c == '-' && label == 0) || ++label > 63)
            return 0;
    }
    return h[n - 1] != '-';
}

int mg_is_host_port(const char *s)
{
    char host[256];
    int port;
    if (mg_split_host_port(s, host, sizeof(host), &port) != 0 || port == 0)
        return 0;
    if (s[0] == '[') /* brackets hold an IPv6 address only */
        return mg_is_numeric_host_port(s);
    return mg_is_numeric_host_port(s) || (strchr(host, ':') == NULL && dns_name(host));
}
