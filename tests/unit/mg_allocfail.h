/*
 * The allocation wrappers of the allocation-failure walks (link with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc): every allocation the moongate libraries make
 * goes through them, and fails when the includer's fail_now() says so. The includer defines
 * `static int fail_now(void)` before including this header.
 */
#ifndef MG_ALLOCFAIL_H
#define MG_ALLOCFAIL_H

#include <stddef.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);

void *__wrap_malloc(size_t n)
{
    return fail_now() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t m)
{
    return fail_now() ? NULL : __real_calloc(n, m);
}

void *__wrap_realloc(void *p, size_t n)
{
    return fail_now() ? NULL : __real_realloc(p, n);
}

#endif
