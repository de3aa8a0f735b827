/*
 * mg_dataframe: the data-plane frame header, CRC32C and slice planning (moongate/dataframe.h).
 * Pure functions: no I/O, no allocation; the decoder trusts nothing it is given.
 */
#include "moongate/dataframe.h"

#include <pthread.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define MAX_ERROR_TEXT 1024u

/* ------------------------------------------------------------------ CRC32C */

/* The tables are made once, by the first thread to need them (pthread_once): a second thread
 * writing the same values while a third reads them would still be a data race. */
static uint32_t crc_table[256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78U : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32c_table(uint32_t crc, const uint8_t *p, size_t len)
{
    pthread_once(&crc_table_once, crc_table_init);
    while (len--)
        crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
/*
 * The crc32 instruction takes 3 cycles and can start one a cycle: three streams over three
 * blocks run at once, and the blocks' CRCs are joined by "shifting" the first over the next
 * block's length (multiplying by x^(8 * len) mod P, through tables made once; the CRC register
 * is linear, so crc(A B) = shift(crc(A), |B|) ^ crc0(B)). As in Mark Adler's crc32c.c.
 */
#define CRC_LONG  8192u
#define CRC_SHORT 256u
/* How far ahead of each stream its loads are prefetched: from a segment not in cache the loop
 * sums 1.15x as fast (2048 against none; a prefetch past the end never faults). */
#define CRC_AHEAD 2048u

static uint32_t crc_long[4][256], crc_short[4][256];
static pthread_once_t crc_shift_once = PTHREAD_ONCE_INIT;

/*
 * Past CRC_FOLD_MIN bytes, a CPU with AVX-512 carry-less multiplies (VPCLMULQDQ) folds instead:
 * sixteen 128-bit lanes, four 64-byte loads a step, each lane multiplied forward over the 256
 * bytes after it and XORed into them (Intel's "Fast CRC Computation for Generic Polynomials
 * Using PCLMULQDQ"). The crc32 instruction sums 8 bytes a cycle at best; this about four times
 * that, and its loads are independent, so more misses are in flight on memory not in cache.
 * A lane X (bits 0-63 the earlier half, L; bits 64-127 the later, H) moved F bits on is
 * L * x^(F+64) + H * x^F mod P. A carry-less product of two reflected 64-bit words is the
 * reflected product times x, and a constant in a word's low 32 bits is times x^32, so the
 * constants are x^(F+31) and x^(F-33) mod P (crc_xpow).
 */
#define CRC_FOLD_MIN 1024u
typedef struct {
    uint64_t lo, hi; /* x^(F+31), x^(F-33) mod P for a fold over F bits */
} crc_fold_k;
static crc_fold_k crc_fold_2048, crc_fold_512, crc_fold_128;

/* The GF(2) matrix mat times the vector vec. */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++) {
        if (vec & 1)
            sum ^= *mat;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++)
        square[n] = gf2_times(mat, mat[n]);
}

/* Tables applying `len` (a power of two) zero bytes to a CRC register, a byte of it each. */
static void crc_zeros(uint32_t zeros[4][256], size_t len)
{
    uint32_t even[32], odd[32], row = 1;
    odd[0] = 0x82f63b78U; /* one zero bit */
    for (int n = 1; n < 32; n++, row <<= 1)
        odd[n] = row;
    gf2_square(even, odd); /* two */
    gf2_square(odd, even); /* four */
    for (;;) {             /* eight, then doubling while len halves */
        gf2_square(even, odd);
        if ((len >>= 1) == 0)
            break;
        gf2_square(odd, even);
        if ((len >>= 1) == 0) {
            memcpy(even, odd, sizeof(even));
            break;
        }
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 0; k < 4; k++)
            zeros[k][n] = gf2_times(even, n << (8 * k));
}

static uint32_t crc_shift(uint32_t zeros[4][256], uint32_t crc)
{
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

/* x^n mod P, reflected as the CRC register holds it (bit 31 the coefficient of x^0). */
static uint32_t crc_xpow(unsigned n)
{
    uint32_t v = 0x80000000U;
    while (n--)
        v = v & 1 ? (v >> 1) ^ 0x82f63b78U : v >> 1;
    return v;
}

static crc_fold_k crc_fold_over(unsigned bits)
{
    return (crc_fold_k){crc_xpow(bits + 31), crc_xpow(bits - 33)};
}

static void crc_shift_init(void)
{
    crc_zeros(crc_long, CRC_LONG);
    crc_zeros(crc_short, CRC_SHORT);
    crc_fold_2048 = crc_fold_over(2048);
    crc_fold_512 = crc_fold_over(512);
    crc_fold_128 = crc_fold_over(128);
}

static inline uint64_t load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Three blocks of `block` bytes at p, one after another, as one CRC from c; with out, each word
 * is also stored at the same place there (the copy costs no second pass over p), with stream
 * by non-temporal stores. Inlined into its callers, where `out` and `stream` are constants. */
__attribute__((target("sse4.2"), always_inline)) static inline uint64_t
crc32c_three(uint64_t c, uint8_t *out, const uint8_t *p, size_t block, uint32_t zeros[4][256],
             int stream)
{
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < block; i += 8) {
        uint64_t a, b, d;
        if (i % 64 == 0) { /* each stream's line CRC_AHEAD on: cold memory stalls the chains */
            __builtin_prefetch(p + i + CRC_AHEAD, 0, 0);
            __builtin_prefetch(p + block + i + CRC_AHEAD, 0, 0);
            __builtin_prefetch(p + 2 * block + i + CRC_AHEAD, 0, 0);
        }
        a = load64(p + i);
        b = load64(p + block + i);
        d = load64(p + 2 * block + i);
        c = __builtin_ia32_crc32di(c, a);
        c1 = __builtin_ia32_crc32di(c1, b);
        c2 = __builtin_ia32_crc32di(c2, d);
        if (out && stream) {
            __builtin_ia32_movnti64((long long *)(void *)(out + i), (long long)a);
            __builtin_ia32_movnti64((long long *)(void *)(out + block + i), (long long)b);
            __builtin_ia32_movnti64((long long *)(void *)(out + 2 * block + i), (long long)d);
        } else if (out) {
            memcpy(out + i, &a, 8);
            memcpy(out + block + i, &b, 8);
            memcpy(out + 2 * block + i, &d, 8);
        }
    }
    c = crc_shift(zeros, (uint32_t)c) ^ (uint32_t)c1;
    return crc_shift(zeros, (uint32_t)c) ^ (uint32_t)c2;
}

/* The three forms of crc32c_three: sum only, sum and copy, sum and copy by streaming stores. */
typedef uint64_t blocks_fn(uint64_t c, uint8_t *out, const uint8_t *p, size_t block,
                           uint32_t zeros[4][256]);

__attribute__((target("sse4.2"))) static uint64_t
crc32c_blocks(uint64_t c, uint8_t *out, const uint8_t *p, size_t block, uint32_t zeros[4][256])
{
    (void)out;
    return crc32c_three(c, NULL, p, block, zeros, 0);
}

__attribute__((target("sse4.2"))) static uint64_t
crc32c_blocks_copy(uint64_t c, uint8_t *out, const uint8_t *p, size_t block, uint32_t zeros[4][256])
{
    return crc32c_three(c, out, p, block, zeros, 0);
}

__attribute__((target("sse4.2"))) static uint64_t crc32c_blocks_stream(uint64_t c, uint8_t *out,
                                                                       const uint8_t *p,
                                                                       size_t block,
                                                                       uint32_t zeros[4][256])
{
    return crc32c_three(c, out, p, block, zeros, 1);
}

/* The CRC32C register over len bytes at p from crc; with out, the bytes are stored there too
 * (with stream, past the caches: see mg_crc32c_copy). */
__attribute__((target("sse4.2"))) static uint32_t
crc32c_sse42(uint32_t crc, uint8_t *out, int stream, const uint8_t *p, size_t len)
{
    blocks_fn *blocks = !out ? crc32c_blocks : stream ? crc32c_blocks_stream : crc32c_blocks_copy;
    uint64_t c = crc;
    size_t step = out ? 3 * CRC_LONG : 0;
    if (len >= 3 * CRC_SHORT)
        pthread_once(&crc_shift_once, crc_shift_init);
    for (; len >= 3 * CRC_LONG; p += 3 * CRC_LONG, len -= 3 * CRC_LONG, out += step)
        c = blocks(c, out, p, CRC_LONG, crc_long);
    step = out ? 3 * CRC_SHORT : 0;
    for (; len >= 3 * CRC_SHORT; p += 3 * CRC_SHORT, len -= 3 * CRC_SHORT, out += step)
        c = blocks(c, out, p, CRC_SHORT, crc_short);
    if (out)
        memcpy(out, p, len);
    if (stream)
        __builtin_ia32_sfence(); /* the streamed stores ordered before what follows */
    for (; len >= 8; p += 8, len -= 8)
        c = __builtin_ia32_crc32di(c, load64(p));
    while (len--)
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return (uint32_t)c;
}

#define FOLD_TARGET __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2")))

/* Each 128-bit lane of a moved over the fold k, XORed into next's. */
FOLD_TARGET static inline __m512i fold_512(__m512i a, __m512i k, __m512i next)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00),
                                     _mm512_clmulepi64_epi128(a, k, 0x11), next, 0x96);
}

FOLD_TARGET static inline __m128i fold_128(__m128i a, __m128i k, __m128i next)
{
    return _mm_xor_si128(
        _mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11)), next);
}

FOLD_TARGET static inline __m512i fold_k512(crc_fold_k k)
{
    return _mm512_broadcast_i32x4(_mm_set_epi64x((long long)k.hi, (long long)k.lo));
}

/* With out, the 64 bytes of v stored at out + at (64-byte aligned), by streaming stores with
 * stream. Inlined where `out` and `stream` are constants. */
FOLD_TARGET __attribute__((always_inline)) static inline void fold_store(uint8_t *out, size_t at,
                                                                         __m512i v, int stream)
{
    if (out && stream)
        _mm512_stream_si512((void *)(out + at), v);
    else if (out)
        _mm512_store_si512((void *)(out + at), v);
}

/* The CRC register over len bytes at p from crc, len a multiple of 256 and at least 256; with
 * out (64-byte aligned), the bytes are stored there too. The register is XORed into the first
 * four bytes, the lanes folded into one, and its 16 bytes summed from 0: that is the CRC. */
FOLD_TARGET __attribute__((always_inline)) static inline uint32_t
crc32c_fold_with(uint32_t crc, uint8_t *out, int stream, const uint8_t *p, size_t len)
{
    __m512i a[4], k = fold_k512(crc_fold_2048);
    for (int j = 0; j < 4; j++) {
        a[j] = _mm512_loadu_si512((const void *)(p + 64 * j));
        fold_store(out, 64 * j, a[j], stream);
    }
    a[0] = _mm512_xor_si512(a[0], _mm512_maskz_set1_epi32((__mmask16)1, (int)crc));
    for (size_t i = 256; i < len; i += 256) {
        for (int j = 0; j < 4; j++) {
            __m512i d = _mm512_loadu_si512((const void *)(p + i + 64 * j));
            fold_store(out, i + 64 * j, d, stream);
            a[j] = fold_512(a[j], k, d);
        }
    }
    if (stream)
        _mm_sfence(); /* the streamed stores ordered before what follows */
    k = fold_k512(crc_fold_512);
    a[1] = fold_512(a[0], k, a[1]);
    a[2] = fold_512(a[1], k, a[2]);
    a[3] = fold_512(a[2], k, a[3]);
    __m128i k1 = _mm_set_epi64x((long long)crc_fold_128.hi, (long long)crc_fold_128.lo);
    __m128i x = _mm512_extracti32x4_epi32(a[3], 0);
    x = fold_128(x, k1, _mm512_extracti32x4_epi32(a[3], 1));
    x = fold_128(x, k1, _mm512_extracti32x4_epi32(a[3], 2));
    x = fold_128(x, k1, _mm512_extracti32x4_epi32(a[3], 3));
    uint64_t c = __builtin_ia32_crc32di(0, (uint64_t)_mm_cvtsi128_si64(x));
    return (uint32_t)__builtin_ia32_crc32di(c, (uint64_t)_mm_extract_epi64(x, 1));
}

FOLD_TARGET static uint32_t crc32c_fold(uint32_t crc, uint8_t *out, int stream, const uint8_t *p,
                                        size_t len)
{
    if (!out)
        return crc32c_fold_with(crc, NULL, 0, p, len);
    return stream ? crc32c_fold_with(crc, out, 1, p, len) : crc32c_fold_with(crc, out, 0, p, len);
}
#endif

static int crc_way_limit = MG_CRC_FOLD;

/* The fastest way this CPU has, under the limit tests set. */
static int crc_way(void)
{
    int way = MG_CRC_TABLE;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2"))
        way = MG_CRC_SSE42;
    if (way == MG_CRC_SSE42 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("vpclmulqdq"))
        way = MG_CRC_FOLD;
#endif
    int limit = __atomic_load_n(&crc_way_limit, __ATOMIC_RELAXED);
    return way < limit ? way : limit;
}

int mg_crc32c_limit(int way)
{
    __atomic_store_n(&crc_way_limit, way, __ATOMIC_RELAXED);
    return crc_way();
}

/* The CRC register over len bytes at p from crc, out as in mg_crc32c_copy (NULL: sum only). */
static uint32_t crc32c_register(uint32_t crc, uint8_t *out, int stream, const uint8_t *p,
                                size_t len)
{
    int way = crc_way();
#if defined(__x86_64__)
    if (way == MG_CRC_FOLD && len >= CRC_FOLD_MIN) {
        /* the head summed the other way up to where out is 64-byte aligned */
        size_t head = out ? (size_t)(-(uintptr_t)out & 63) : 0, bulk;
        pthread_once(&crc_shift_once, crc_shift_init);
        crc = crc32c_sse42(crc, out, stream, p, head);
        bulk = (len - head) & ~(size_t)255;
        crc = crc32c_fold(crc, out ? out + head : NULL, stream, p + head, bulk);
        p += head + bulk;
        out = out ? out + head + bulk : NULL;
        len -= head + bulk;
    }
    if (way >= MG_CRC_SSE42)
        return crc32c_sse42(crc, out, stream, p, len);
#endif
    if (out)
        memcpy(out, p, len);
    return crc32c_table(crc, p, len);
}

uint32_t mg_crc32c_portable(uint32_t crc, const void *data, size_t len)
{
    return ~crc32c_table(~crc, data, len);
}

uint32_t mg_crc32c(uint32_t crc, const void *data, size_t len)
{
    return ~crc32c_register(~crc, NULL, 0, data, len);
}

uint32_t mg_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len, int stream)
{
    return ~crc32c_register(~crc, dst, stream, src, len);
}

/* ------------------------------------------------------------------ header */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

void mg_df_encode(const mg_df_header *h, uint8_t out[MG_DF_HEADER_BYTES])
{
    put32(out, MG_DF_MAGIC);
    out[4] = MG_DF_VERSION;
    out[5] = h->type;
    put16(out + 6, h->flags);
    put64(out + 8, h->slice);
    put64(out + 16, h->target);
    put64(out + 24, h->offset);
    put32(out + 32, h->length);
    put32(out + 36, h->status);
    put32(out + 40, h->payload_crc);
    put32(out + 44, mg_crc32c(0, out, 44));
}

uint32_t mg_df_payload_bytes(const mg_df_header *h)
{
    switch (h->type) {
    case MG_DF_HELLO:
    case MG_DF_WRITE:
    case MG_DF_READ_DATA:
    case MG_DF_ERROR:
        return h->length;
    default:
        return 0;
    }
}

/* The flags each type may carry. */
static uint16_t allowed_flags(uint8_t type)
{
    switch (type) {
    case MG_DF_WRITE:
    case MG_DF_READ:
    case MG_DF_READ_DATA:
        return MG_DF_CRC | MG_DF_LEASE;
    case MG_DF_WRITE_ACK:
        return MG_DF_LEASE;
    default:
        return 0;
    }
}

int mg_df_decode(const uint8_t *in, size_t len, uint32_t max_payload, mg_df_header *h)
{
    memset(h, 0, sizeof(*h));
    if (len >= 4 && get32(in) != MG_DF_MAGIC)
        return MG_DF_BAD_MAGIC;
    if (len >= 5)
        h->version = in[4];
    if (len >= 5 && (h->version < MG_DF_VERSION_MIN || h->version > MG_DF_VERSION))
        return MG_DF_BAD_VERSION;
    if (len < MG_DF_HEADER_BYTES)
        return MG_DF_NEED_MORE;
    if (get32(in + 44) != mg_crc32c(0, in, 44))
        return MG_DF_BAD_CRC;
    h->type = in[5];
    h->flags = get16(in + 6);
    h->slice = get64(in + 8);
    h->target = get64(in + 16);
    h->offset = get64(in + 24);
    h->length = get32(in + 32);
    h->status = get32(in + 36);
    h->payload_crc = get32(in + 40);
    if (h->type < MG_DF_HELLO || h->type > MG_DF_ERROR)
        return MG_DF_BAD_TYPE;
    if (h->flags & ~allowed_flags(h->type))
        return MG_DF_BAD_FLAGS;
    switch (h->type) {
    case MG_DF_HELLO:
        if (h->length != MG_DF_TOKEN_BYTES)
            return MG_DF_BAD_LENGTH;
        break;
    case MG_DF_HELLO_OK:
        if (h->length != 0)
            return MG_DF_BAD_LENGTH;
        break;
    case MG_DF_ERROR:
        if (h->length > MAX_ERROR_TEXT)
            return MG_DF_BAD_LENGTH;
        break;
    case MG_DF_READ_DATA:
        if (h->length > max_payload || (h->status != 0 && h->length != 0))
            return MG_DF_BAD_LENGTH;
        break;
    default: /* WRITE, WRITE_ACK, READ: a slice of 1..max_payload bytes */
        if (h->length == 0 || h->length > max_payload)
            return MG_DF_BAD_LENGTH;
        break;
    }
    if (h->offset > UINT64_MAX - h->length)
        return MG_DF_BAD_RANGE;
    return MG_DF_OK;
}

const char *mg_df_strerror(int rc)
{
    switch (rc) {
    case MG_DF_OK:
        return "ok";
    case MG_DF_NEED_MORE:
        return "incomplete header";
    case MG_DF_BAD_MAGIC:
        return "not a moongate data-plane stream";
    case MG_DF_BAD_VERSION:
        return "unsupported data-plane protocol version";
    case MG_DF_BAD_CRC:
        return "header checksum mismatch";
    case MG_DF_BAD_TYPE:
        return "unknown frame type";
    case MG_DF_BAD_FLAGS:
        return "flags not allowed for the frame type";
    case MG_DF_BAD_LENGTH:
        return "length not allowed for the frame type or over the slice limit";
    case MG_DF_BAD_RANGE:
        return "offset + length overflows";
    default:
        return "unknown frame error";
    }
}

/* ------------------------------------------------------------------ slices */

uint64_t mg_slice_count(uint64_t length, uint32_t slice_bytes)
{
    if (length == 0 || slice_bytes == 0)
        return 0;
    return length / slice_bytes + (length % slice_bytes != 0);
}

size_t mg_slice_plan(uint64_t local_offset, uint64_t remote_offset, uint64_t length,
                     uint32_t slice_bytes, uint64_t first, mg_slice *out, size_t max)
{
    uint64_t total = mg_slice_count(length, slice_bytes);
    size_t n = 0;
    for (uint64_t i = first; i < total && n < max; i++, n++) {
        uint64_t at = i * slice_bytes;
        out[n].local_offset = local_offset + at;
        out[n].remote_offset = remote_offset + at;
        out[n].length = (uint32_t)(length - at < slice_bytes ? length - at : slice_bytes);
    }
    return n;
}
