/*
 * mg_agentfile: the agents' state file, <shm-dir>/.moongate.agents (moongate/agentstate.h), so
 * that a daemon started after this one keeps its agents' ports for them.
 *
 * At start, before the loop serves, the file the daemon before this one left is read and each
 * of its agents' ports is held for --agent-port-hold seconds (moongate/agents.h); a timer ends
 * the holds when that time is over. While the daemon serves, every agent added or ended
 * rewrites the file: the loop copies the entries (agents, then the holds still lasting) and a
 * worker writes them to a temporary file that is renamed over the old one, so a reader sees
 * the old file or the new one, whole. At most one write is in flight; changes made meanwhile
 * are written, together, once it is done. A drain freezes the file as it stood when the drain
 * began: the agents that end with their connections as the daemon stops are the ones the next
 * daemon must hold. A failure (the file, the queue, memory) is logged once per cause and
 * counted, and is never fatal: the next change tries again.
 *
 * Loop thread, but for the write itself (write_work, on a worker), which touches only its job
 * and the paths, fixed at start.
 */
#include "mg_server_int.h"
#include "mg_service.h"

#include "mg_log.h"
#include "mg_time.h"

#include "moongate/agentstate.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RETRY_MS       100 /* a write the workers' queue had no room for is tried again */
#define REFUSALS_SHOWN 8   /* lines of the file whose port could not be held, logged one each */

typedef struct write_job {
    struct mg_agentfile *f;
    mg_agent_entry *v;
    size_t n;
    const char *step; /* what failed: "write", "rename"... */
    int err;          /* its errno */
} write_job;

struct mg_agentfile {
    mg_gateway *gw;
    mg_agents *agents;
    char path[PATH_MAX];
    char tmp[PATH_MAX];
    struct event *holds_timer; /* the holds' time is over */
    struct event *retry;       /* a write the queue or memory refused, tried again */
    uint64_t until_ms;         /* when the holds end (mg_now_mono_ms) */
    int dirty;                 /* agents changed since the last snapshot */
    int in_flight;             /* a write is on a worker */
    int frozen;                /* a drain began: later changes are not written */
    int closed;                /* the gateway is going: nothing more is submitted */
    write_job *pending;        /* the snapshot a drain took, not written yet */
    char cause[64];            /* the last failure logged ("" after a write that succeeded) */
    uint64_t written, failed;
};

/* ---- the write, on a worker ---- */

/* Writes all of buf to fd. Returns 0, or -1 with errno. */
static int write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t k = write(fd, buf, len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        buf += k;
        len -= (size_t)k;
    }
    return 0;
}

static int write_work(void *arg)
{
    write_job *j = arg;
    const struct mg_agentfile *f = j->f;
    char *text = NULL;
    size_t len;
    int fd = -1;
    if (mg_agentstate_format(j->v, j->n, &text, &len) != 0) {
        j->step = "format";
        j->err = ENOMEM;
        return MG_ERR_NOMEM;
    }
    fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        j->step = "open";
        goto fail;
    }
    if (write_all(fd, text, len) != 0) {
        j->step = "write";
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        j->step = "close";
        goto fail;
    }
    fd = -1;
    if (rename(f->tmp, f->path) != 0) {
        j->step = "rename";
        goto fail;
    }
    free(text);
    return 0;

fail:
    j->err = errno;
    if (fd >= 0)
        close(fd);
    unlink(f->tmp);
    free(text);
    return MG_ERR_SYSTEM;
}

/* ---- the loop's side ---- */

static void job_free(write_job *j)
{
    if (j) {
        free(j->v);
        free(j);
    }
}

/* A failure of `step` for `reason`: counted, and logged unless it is the one logged last. */
static void failed(struct mg_agentfile *f, const char *step, const char *reason)
{
    char cause[sizeof(f->cause)], q[PATH_MAX + 8];
    f->failed++;
    snprintf(cause, sizeof(cause), "%s: %s", step, reason);
    if (strcmp(cause, f->cause) == 0)
        return;
    snprintf(f->cause, sizeof(f->cause), "%s", cause);
    mg_warn("agents_state_write_failed", "file=%s step=%s error=\"%s\" note=\"%s\"",
            mg_log_quote(q, sizeof(q), f->path), step, reason,
            "counted in moongate_agents_state_writes_total; logged again for another cause");
}

/* A copy of the agents and of the holds lasting now, for a worker to write. NULL when out of
 * memory. */
static write_job *snapshot(struct mg_agentfile *f)
{
    uint64_t now = mg_now_mono_ms();
    size_t n = mg_agents_entries(f->agents, now, NULL, 0);
    write_job *j = calloc(1, sizeof(*j));
    if (j == NULL || (j->v = calloc(n + 1, sizeof(*j->v))) == NULL) {
        free(j);
        return NULL;
    }
    j->f = f;
    j->n = mg_agents_entries(f->agents, now, j->v, n);
    return j;
}

static void retry_later(struct mg_agentfile *f)
{
    struct timeval tv = {0, RETRY_MS * 1000};
    if (f->retry && !evtimer_pending(f->retry, NULL))
        evtimer_add(f->retry, &tv);
}

static void write_done(void *arg, int rc);

/* Starts the write that is due, if one is and none is in flight. */
static void kick(struct mg_agentfile *f)
{
    write_job *j;
    int rc;
    if (f->in_flight || f->closed || (f->retry && evtimer_pending(f->retry, NULL)))
        return;
    if (f->pending) {
        j = f->pending;
        f->pending = NULL;
    } else if (f->dirty && !f->frozen) {
        if ((j = snapshot(f)) == NULL) {
            failed(f, "snapshot", strerror(ENOMEM));
            retry_later(f);
            return;
        }
        f->dirty = 0;
    } else {
        return;
    }
    rc = mg_engine_submit(f->gw->engine, f->gw->cq, write_work, write_done, j);
    if (rc == 0) {
        f->in_flight = 1;
        return;
    }
    if (f->frozen)
        f->pending = j; /* the drain's snapshot: kept to be written */
    else {
        job_free(j);
        f->dirty = 1; /* a fresh snapshot next time */
    }
    if (rc == MG_ERR_SHUTDOWN) { /* the workers are gone: so is the chance to write */
        failed(f, "submit", "the engine's workers stopped");
        return;
    }
    failed(f, "submit", rc == MG_ERR_FULL ? "the workers' queue is full" : mg_strerror(rc));
    retry_later(f);
}

static void write_done(void *arg, int rc)
{
    write_job *j = arg;
    struct mg_agentfile *f = j->f;
    char q[PATH_MAX + 8];
    f->in_flight = 0;
    if (rc == 0) {
        f->written++;
        if (f->cause[0])
            mg_info("agents_state_written", "file=%s entries=%zu after=\"%s\"",
                    mg_log_quote(q, sizeof(q), f->path), j->n, f->cause);
        f->cause[0] = '\0';
    } else if (rc == MG_ERR_SHUTDOWN || rc == MG_ERR_CANCELLED) {
        failed(f, "submit", "the engine's workers stopped before it ran");
    } else {
        failed(f, j->step ? j->step : "write", strerror(j->err));
    }
    job_free(j);
    kick(f);
}

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kick(arg);
}

/* The holds' time is over: they end, and the file is written without them. */
static void holds_end_cb(evutil_socket_t fd, short what, void *arg)
{
    struct mg_agentfile *f = arg;
    uint64_t now = mg_now_mono_ms();
    size_t ended;
    (void)fd;
    (void)what;
    if (now < f->until_ms) { /* the loop's clock ran ahead of ours: wait the rest */
        struct timeval tv = {(time_t)((f->until_ms - now) / 1000),
                             (suseconds_t)((f->until_ms - now) % 1000 * 1000 + 1000)};
        evtimer_add(f->holds_timer, &tv);
        return;
    }
    ended = mg_agents_expire(f->agents, now);
    if (ended == 0)
        return; /* every agent came back in time */
    mg_info("agent_ports_released", "ports=%zu reason=\"--agent-port-hold passed\"", ended);
    mg_gateway_agents_changed(f->gw);
}

/* ---- reading the file at start ---- */

/* Up to max + 1 bytes of the file into a buffer of its own (*len). NULL when there is no
 * file (ENOENT: nothing to hold) or it cannot be read (logged). */
static char *slurp(const char *path, size_t max, size_t *len)
{
    char q[PATH_MAX + 8], *buf = NULL;
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    *len = 0;
    if (fd < 0) {
        if (errno != ENOENT)
            mg_warn("agents_state_ignored", "file=%s error=\"%s\"",
                    mg_log_quote(q, sizeof(q), path), strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        mg_warn("agents_state_ignored", "file=%s reason=\"not a regular file\"",
                mg_log_quote(q, sizeof(q), path));
    } else if ((buf = malloc(max + 1)) == NULL) {
        mg_warn("agents_state_ignored", "file=%s reason=\"out of memory\"",
                mg_log_quote(q, sizeof(q), path));
    } else {
        for (;;) {
            ssize_t k = read(fd, buf + *len, max + 1 - *len);
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0) {
                mg_warn("agents_state_ignored", "file=%s error=\"%s\"",
                        mg_log_quote(q, sizeof(q), path), strerror(errno));
                free(buf);
                buf = NULL;
                break;
            }
            *len += (size_t)k;
            if (k == 0 || *len > max)
                break;
        }
    }
    close(fd);
    return buf;
}

/* Holds the ports of entries v[0..n) until f->until_ms; logs those it cannot hold. Returns how
 * many it holds. */
static size_t hold_all(struct mg_agentfile *f, const mg_agent_entry *v, size_t n)
{
    char why[300], q[PATH_MAX + 8], qw[320];
    size_t held = 0, refused = 0;
    for (size_t i = 0; i < n; i++) {
        if (mg_agents_hold(f->agents, &v[i], f->until_ms, why, sizeof(why)) == 0) {
            held++;
        } else if (refused++ < REFUSALS_SHOWN) {
            mg_warn("agent_port_not_held",
                    "file=%s line=%zu tenant=%s agent=\"%s\" port=%u reason=%s",
                    mg_log_quote(q, sizeof(q), f->path), i + 2, v[i].tenant, v[i].name, v[i].port,
                    mg_log_quote(qw, sizeof(qw), why));
        }
    }
    if (refused > REFUSALS_SHOWN)
        mg_warn("agent_port_not_held", "file=%s more=%zu note=\"only the first %d are logged\"",
                mg_log_quote(q, sizeof(q), f->path), refused - REFUSALS_SHOWN, REFUSALS_SHOWN);
    return held;
}

/* The file the daemon before this one left: its agents' ports held. A file that is not what a
 * daemon writes is logged, naming its line, and ignored whole. */
static void load(struct mg_agentfile *f)
{
    const mg_config *cfg = f->gw->cfg;
    size_t max_entries = 2 * (size_t)cfg->max_agents; /* the agents, and as many holds */
    size_t max = (max_entries + 1) * MG_AGENTSTATE_LINE_MAX, len, n, line;
    char why[300], q[PATH_MAX + 8], qw[320];
    mg_agent_entry *v = NULL;
    char *text = slurp(f->path, max, &len);
    if (text == NULL)
        return;
    if (len > max) {
        line = 1;
        for (size_t i = 0; i < max; i++)
            line += text[i] == '\n';
        snprintf(why, sizeof(why),
                 "line %zu: the file runs past %zu bytes, more than a daemon "
                 "of --max-agents %llu writes",
                 line, max, (unsigned long long)cfg->max_agents);
    } else if ((v = calloc(max_entries, sizeof(*v))) == NULL) {
        snprintf(why, sizeof(why), "out of memory");
    } else if (mg_agentstate_parse(text, len, v, max_entries, &n, &line, why, sizeof(why)) == 0) {
        size_t held = hold_all(f, v, n);
        mg_info("agent_ports_held", "file=%s ports=%zu for_s=%llu",
                mg_log_quote(q, sizeof(q), f->path), held,
                (unsigned long long)cfg->agent_port_hold);
        why[0] = '\0';
    }
    if (why[0])
        mg_warn("agents_state_ignored", "file=%s reason=%s", mg_log_quote(q, sizeof(q), f->path),
                mg_log_quote(qw, sizeof(qw), why));
    free(v);
    free(text);
}

/* ---- the core's side (mg_server_int.h) ---- */

int mg_agentfile_new(mg_gateway *gw, mg_agents *agents)
{
    struct mg_agentfile *f = calloc(1, sizeof(*f));
    const char *dir = gw->cfg->shm_dir;
    if ((gw->core->agentfile = f) == NULL)
        return MG_ERR_NOMEM;
    f->gw = gw;
    f->agents = agents;
    if ((f->retry = evtimer_new(gw->base, retry_cb, f)) == NULL ||
        (f->holds_timer = evtimer_new(gw->base, holds_end_cb, f)) == NULL)
        return MG_ERR_NOMEM;
    if (dir == NULL || dir[0] == '\0' ||
        snprintf(f->path, sizeof(f->path), "%s/%s", dir, MG_AGENTSTATE_FILE) >=
            (int)sizeof(f->path) ||
        snprintf(f->tmp, sizeof(f->tmp), "%s.tmp", f->path) >= (int)sizeof(f->tmp)) {
        f->closed = 1; /* no file: the shm directory's path is too long for one */
        return 0;
    }
    if (gw->cfg->agent_port_hold > 0) {
        f->until_ms = gw->start_mono_ns / 1000000 + gw->cfg->agent_port_hold * 1000;
        load(f);
        if (mg_agents_holds(agents, 0, NULL, 0) > 0) {
            struct timeval tv = {(time_t)gw->cfg->agent_port_hold, 0};
            evtimer_add(f->holds_timer, &tv);
        }
    }
    return 0;
}

void mg_agentfile_drain(mg_gateway *gw)
{
    struct mg_agentfile *f = gw->core->agentfile;
    if (f == NULL || f->frozen)
        return;
    if (f->dirty && !f->closed) {
        if ((f->pending = snapshot(f)) == NULL)
            failed(f, "snapshot", strerror(ENOMEM));
        f->dirty = 0;
    }
    f->frozen = 1;
    kick(f);
}

void mg_agentfile_close(mg_gateway *gw)
{
    struct mg_agentfile *f = gw->core->agentfile;
    if (f == NULL)
        return;
    f->closed = 1;
    if (f->retry)
        evtimer_del(f->retry);
    if (f->holds_timer)
        evtimer_del(f->holds_timer);
}

void mg_agentfile_free(mg_gateway *gw)
{
    struct mg_agentfile *f = gw->core->agentfile;
    if (f == NULL)
        return;
    if (f->retry)
        event_free(f->retry);
    if (f->holds_timer)
        event_free(f->holds_timer);
    job_free(f->pending);
    free(f);
    gw->core->agentfile = NULL;
}

/* ---- what the services get (mg_service.h) ---- */

void mg_gateway_agents_changed(mg_gateway *gw)
{
    struct mg_agentfile *f = gw->core->agentfile;
    if (f == NULL || f->frozen || f->closed)
        return;
    f->dirty = 1;
    kick(f);
}

void mg_gateway_agents_file_stats(const mg_gateway *gw, uint64_t *written, uint64_t *failed_writes)
{
    const struct mg_agentfile *f = gw->core->agentfile;
    *written = f ? f->written : 0;
    *failed_writes = f ? f->failed : 0;
}
