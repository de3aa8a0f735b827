/*
 * mg_str: a bounded string copy for the request paths. snprintf(dst, cap, "%s", src) costs a
 * formatted-output pass (hundreds of instructions); a call that copies a tenant, a path and an
 * id does several.
 */
#ifndef MG_STR_H
#define MG_STR_H

#include <stddef.h>
#include <string.h>

/* Copies at most cap - 1 bytes of src into dst and terminates it (cap > 0). Returns dst. */
static inline char *mg_strlcpy(char *dst, const char *src, size_t cap)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
    return dst;
}

#endif
