/*
 * mg_hash: the hash functions the engine's tables share (segment registry, pool, peer cache).
 * Internal to engine/src.
 */
#ifndef MG_HASH_H
#define MG_HASH_H

#include <stdint.h>

/* splitmix64's finalizer: a bijection on 64-bit values (ids are mg_mix64 of a counter, so they
 * are unique, never repeat and do not reveal their order). */
static inline uint64_t mg_mix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* FNV-1a of two strings, separated so that ("ab", "c") and ("a", "bc") differ. */
static inline uint64_t mg_hash_str2(const char *a, const char *b)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *a; a++)
        h = (h ^ (unsigned char)*a) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL;
    for (; *b; b++)
        h = (h ^ (unsigned char)*b) * 1099511628211ULL;
    return h;
}

#endif
