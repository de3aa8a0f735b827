/*
 * mg_tsan: what ThreadSanitizer is told about a segment's bytes. The data plane's threads write
 * and read the bytes of segments (the payloads of transfers) as a NIC would: which of them ran
 * first is ordered through other processes — a peer that acknowledged a WRITE before a READ of
 * the same range came on another connection, a client that wrote its memory before asking —
 * which ThreadSanitizer cannot see, so two accesses in order look like a race. The payload's
 * copies are therefore left out of its checks (MG_PAYLOAD_BEGIN/END around them); the daemon's
 * own state never is. In other builds the macros are nothing.
 */
#ifndef MG_TSAN_H
#define MG_TSAN_H

#if defined(__SANITIZE_THREAD__)
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
#define MG_PAYLOAD_BEGIN()                             \
    do {                                               \
        AnnotateIgnoreReadsBegin(__FILE__, __LINE__);  \
        AnnotateIgnoreWritesBegin(__FILE__, __LINE__); \
    } while (0)
#define MG_PAYLOAD_END()                             \
    do {                                             \
        AnnotateIgnoreWritesEnd(__FILE__, __LINE__); \
        AnnotateIgnoreReadsEnd(__FILE__, __LINE__);  \
    } while (0)
#else
#define MG_PAYLOAD_BEGIN() ((void)0)
#define MG_PAYLOAD_END()   ((void)0)
#endif

#endif
