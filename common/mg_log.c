/*
 * mg_log: see mg_log.h. The level is a plain int written before threads start.
 */
#include "mg_log.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int log_level = MG_LOG_INFO;
/* The first error line's "event=... fields", kept for the daemon's last words: claimed by the
 * first error (first_claimed), readable once first_ready is set (release after the copy). */
static char first_error[512];
static int first_claimed, first_ready;
static const char *const level_names[] = {"debug", "info", "warn", "error"};

void mg_log_set_level(mg_log_level level)
{
    log_level = (int)level;
}

int mg_log_parse_level(const char *s, mg_log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (mg_log_level)i;
            return 0;
        }
    }
    return -1;
}

int mg_log_enabled(mg_log_level level)
{
    return (int)level >= log_level;
}

char *mg_log_quote(char *dst, size_t cap, const char *s)
{
    size_t o = 0;
    int quote = s[0] == '\0' || strpbrk(s, " \"=\t\r\n") != NULL;
    if (cap == 0)
        return dst;
    if (quote && o + 1 < cap)
        dst[o++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 4 < cap; p++) {
        if (*p == '"' || *p == '\\') {
            dst[o++] = '\\';
            dst[o++] = (char)*p;
        } else if (*p < 0x20 || *p == 0x7f) {
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", *p);
        } else {
            dst[o++] = (char)*p;
        }
    }
    if (quote && o + 1 < cap)
        dst[o++] = '"';
    dst[o < cap ? o : cap - 1] = '\0';
    return dst;
}

void mg_log(mg_log_level level, const char *event, const char *fmt, ...)
{
    char line[2048];
    struct timespec ts;
    struct tm tm;
    size_t n;
    int r;

    if (!mg_log_enabled(level))
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = strftime(line, sizeof(line), "ts=%Y-%m-%dT%H:%M:%S", &tm);
    r = snprintf(line + n, sizeof(line) - n, ".%03ldZ level=%s event=%s ", ts.tv_nsec / 1000000,
                 level_names[level], event);
    if (r > 0)
        n += (size_t)r;
    if (fmt && n < sizeof(line)) {
        va_list ap;
        va_start(ap, fmt);
        r = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
        va_end(ap);
        if (r > 0)
            n += (size_t)r;
    }
    if (n >= sizeof(line) - 1)
        n = sizeof(line) - 2;
    while (n > 0 && line[n - 1] == ' ')
        n--;
    line[n] = '\0';
    if (level == MG_LOG_ERROR && !__atomic_exchange_n(&first_claimed, 1, __ATOMIC_RELAXED)) {
        const char *ev = strstr(line, "event=");
        const char *from = ev ? ev : line;
        size_t len = strnlen(from, sizeof(first_error) - 1);
        memcpy(first_error, from, len);
        first_error[len] = '\0';
        __atomic_store_n(&first_ready, 1, __ATOMIC_RELEASE);
    }
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;
}

const char *mg_log_first_error(void)
{
    return __atomic_load_n(&first_ready, __ATOMIC_ACQUIRE) ? first_error : NULL;
}
