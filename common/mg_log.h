/*
 * mg_log: structured logging, one logfmt line per event on stderr.
 *
 *   ts=2026-11-29T20:00:00.123Z level=info event=listen addr=127.0.0.1:7443 tls=1
 *
 * Thread-safe: each line is formatted into a local buffer and written with one write(2).
 * The level and the sink are set once at start-up, before other threads exist.
 */
#ifndef MG_LOG_H
#define MG_LOG_H

#include <stdarg.h>
#include <stddef.h>

typedef enum { MG_LOG_DEBUG = 0, MG_LOG_INFO, MG_LOG_WARN, MG_LOG_ERROR } mg_log_level;

/* Sets the minimum level written. */
void mg_log_set_level(mg_log_level level);
/* Parses "debug", "info", "warn" or "error"; returns 0 or -1. */
int mg_log_parse_level(const char *s, mg_log_level *out);
int mg_log_enabled(mg_log_level level);

/* Writes one line: ts, level, event, then the caller's `key=value ...` fields. */
void mg_log(mg_log_level level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Copies `s` into `dst` as a logfmt value: quoted when it holds spaces, quotes or '=';
 * control bytes escaped. Always NUL-terminates. Returns dst. */
char *mg_log_quote(char *dst, size_t cap, const char *s);

/* The first error-level line written, as "event=NAME fields" (cut at 511 bytes), or NULL while
 * none was: what a daemon that could not start names as the cause in its last line. */
const char *mg_log_first_error(void);

#define mg_debug(ev, ...) mg_log(MG_LOG_DEBUG, ev, __VA_ARGS__)
#define mg_info(ev, ...)  mg_log(MG_LOG_INFO, ev, __VA_ARGS__)
#define mg_warn(ev, ...)  mg_log(MG_LOG_WARN, ev, __VA_ARGS__)
#define mg_error(ev, ...) mg_log(MG_LOG_ERROR, ev, __VA_ARGS__)

#endif
