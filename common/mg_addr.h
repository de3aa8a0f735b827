/*
 * mg_addr: "host:port" strings, as flags and peer addresses spell them.
 */
#ifndef MG_ADDR_H
#define MG_ADDR_H

#include <stddef.h>

/* Splits "host:port" or "[v6]:port" (brackets removed from the host). Returns 0, or -1 when it
 * is not that shape, the host is empty or longer than cap - 1, or the port is not 0..65535. */
int mg_split_host_port(const char *s, char *host, size_t cap, int *port);
/* Non-zero for "ip:port" or "[v6]:port" with a numeric address (nothing to resolve). */
int mg_is_numeric_host_port(const char *s);
/* Non-zero for "host:port" with a port 1..65535 and a host that is a numeric address or a DNS
 * name (labels of [A-Za-z0-9-]): a peer a daemon may be asked to reach (names resolved off the
 * loop). */
int mg_is_host_port(const char *s);

#endif
