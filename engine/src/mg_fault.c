/*
 * mg_fault: see moongate/fault.h. Each guarded call sets a thread-local jump buffer; the SIGBUS
 * handler jumps back to it when the faulting thread is inside one. Before jumping it restores the
 * signal mask the thread had when it faulted (the kernel saved it in the context): SA_NODEFER
 * alone is not enough where a runtime wraps the handler and blocks every signal around it
 * (ThreadSanitizer does), and SIGBUS left blocked would kill the thread's next guarded fault.
 * sigsetjmp(.., 0) keeps the guard itself free of system calls.
 */
#include "moongate/fault.h"

#include "mg_tsan.h"
#include "moongate/dataframe.h"
#include "moongate/mg_error.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <ucontext.h>

static __thread sigjmp_buf *guard_jb;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int init_rc;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    (void)si;
    if (guard_jb) {
        pthread_sigmask(SIG_SETMASK, &((ucontext_t *)uc)->uc_sigmask, NULL);
        siglongjmp(*guard_jb, 1);
    }
    /* Not inside a guard: a real bug. Die of it as if there were no handler. */
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    init_rc = sigaction(SIGBUS, &sa, NULL) == 0 ? 0 : MG_ERR_SYSTEM;
}

int mg_fault_init(void)
{
    pthread_once(&once, install);
    return init_rc;
}

int mg_fault_guard(int (*fn)(void *), void *arg)
{
    sigjmp_buf jb, *outer = guard_jb;
    volatile int rc = MG_ERR_DATA_LOSS;
    mg_fault_init();
    if (sigsetjmp(jb, 0) == 0) {
        guard_jb = &jb;
        /* a segment's bytes (mg_tsan.h); inside: ThreadSanitizer clears its ignores for the
         * signal handler, which jumps back here without restoring them */
        MG_PAYLOAD_BEGIN();
        rc = fn(arg);
        MG_PAYLOAD_END();
    }
    guard_jb = outer;
    return rc;
}

typedef struct {
    void *dst;
    const void *src;
    size_t n;
    uint32_t crc;
    int stream;
} op;

static int do_copy(void *arg)
{
    op *o = arg;
    memmove(o->dst, o->src, o->n);
    return 0;
}

static int do_crc(void *arg)
{
    op *o = arg;
    o->crc = mg_crc32c(o->crc, o->src, o->n);
    return 0;
}

int mg_guarded_copy(void *dst, const void *src, size_t n)
{
    op o = {dst, src, n, 0, 0};
    return mg_fault_guard(do_copy, &o);
}

static int do_copy_crc(void *arg)
{
    op *o = arg;
    o->crc = mg_crc32c_copy(o->crc, o->dst, o->src, o->n, o->stream);
    return 0;
}

int mg_guarded_copy_crc32c(void *dst, const void *src, size_t n, uint32_t *crc, int stream)
{
    op o = {dst, src, n, *crc, stream};
    int rc = mg_fault_guard(do_copy_crc, &o);
    if (rc == 0)
        *crc = o.crc;
    return rc;
}

static int do_probe(void *arg)
{
    op *o = arg;
    (void)*(const volatile uint8_t *)o->src;
    return 0;
}

int mg_fault_probe(const void *p, size_t n)
{
    op o = {NULL, (const uint8_t *)p + n - 1, 1, 0, 0};
    return n == 0 ? 0 : mg_fault_guard(do_probe, &o);
}

int mg_guarded_crc32c(uint32_t *crc, const void *p, size_t n)
{
    op o = {NULL, p, n, *crc, 0};
    int rc = mg_fault_guard(do_crc, &o);
    if (rc == 0)
        *crc = o.crc;
    return rc;
}
