/* mg_b64: see mg_b64.h. */
#include "mg_b64.h"

static const char enc_table[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t mg_b64_encoded_size(size_t len)
{
    return (len + 2) / 3 * 4 + 1;
}

size_t mg_b64_encode(char *dst, const uint8_t *src, size_t len)
{
    size_t o = 0, i = 0;
    for (; i + 2 < len; i += 3) {
        uint32_t v = (uint32_t)src[i] << 16 | (uint32_t)src[i + 1] << 8 | src[i + 2];
        dst[o++] = enc_table[v >> 18 & 63];
        dst[o++] = enc_table[v >> 12 & 63];
        dst[o++] = enc_table[v >> 6 & 63];
        dst[o++] = enc_table[v & 63];
    }
    if (i < len) {
        uint32_t v = (uint32_t)src[i] << 16 | (i + 1 < len ? (uint32_t)src[i + 1] << 8 : 0);
        dst[o++] = enc_table[v >> 18 & 63];
        dst[o++] = enc_table[v >> 12 & 63];
        dst[o++] = i + 1 < len ? enc_table[v >> 6 & 63] : '=';
        dst[o++] = '=';
    }
    dst[o] = '\0';
    return o;
}

static int dec_char(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || c == '-')
        return 62;
    if (c == '/' || c == '_')
        return 63;
    return -1;
}

long mg_b64_decode(uint8_t *dst, const char *src, size_t len)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0, i = 0;

    while (len > 0 && src[len - 1] == '=')
        len--;
    for (; i < len; i++) {
        int v = dec_char(src[i]);
        if (v < 0)
            return -1;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            dst[o++] = (uint8_t)(acc >> bits);
        }
    }
    if (bits >= 6) /* a lone trailing character carries less than one byte */
        return -1;
    return (long)o;
}
