/*
 * What pages a directory's files are made of, from the mount that holds it (see mg_shm.h).
 */
#include "mg_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

/* mountinfo's octal escapes (\040 a space, \011, \012, \134) undone, in place. */
static void unescape(char *s)
{
    char *out = s;
    for (; *s; s++) {
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
            s[3] >= '0' && s[3] <= '7') {
            *out++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
            s += 3;
        } else {
            *out++ = *s;
        }
    }
    *out = '\0';
}

/* Whether mount point mp holds path: equal, or a directory above it. */
static int holds(const char *mp, const char *path)
{
    size_t n = strlen(mp);
    if (!strcmp(mp, "/"))
        return path[0] == '/';
    return strncmp(mp, path, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

/* The value of option `key` (e.g. "huge=") in a comma-separated list, copied into out ("" when
 * it is not there). */
static void option(const char *opts, const char *key, char *out, size_t cap)
{
    size_t k = strlen(key);
    out[0] = '\0';
    for (const char *p = opts; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        if (strncmp(p, key, k) == 0) {
            size_t n = strcspn(p + k, ",");
            snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), p + k);
            return;
        }
    }
}

/* The bracketed word of shmem_enabled ("always within_size advise [never] deny force"). */
static void current(const char *text, char *out, size_t cap)
{
    const char *a = text ? strchr(text, '[') : NULL, *b = a ? strchr(a, ']') : NULL;
    out[0] = '\0';
    if (a && b)
        snprintf(out, cap, "%.*s", (int)(b - a - 1), a + 1);
}

/* One line of mountinfo, split in place: its mount point (unescaped), filesystem type and
 * super options. Returns 0, or -1 for a line that is not one. */
static int parse_line(char *line, char **mp, char **type, const char **super)
{
    char *save = NULL, *tok = strtok_r(line, " ", &save);
    /* id, parent, major:minor, root, then the mount point */
    for (int i = 0; i < 4 && tok; i++)
        tok = strtok_r(NULL, " ", &save);
    if ((*mp = tok) == NULL)
        return -1;
    while (tok && strcmp(tok, "-") != 0) /* options and optional fields end at "-" */
        tok = strtok_r(NULL, " ", &save);
    if (tok == NULL || (*type = strtok_r(NULL, " ", &save)) == NULL ||
        strtok_r(NULL, " ", &save) == NULL) /* the source */
        return -1;
    *super = strtok_r(NULL, " ", &save);
    if (*super == NULL)
        *super = "";
    unescape(*mp);
    return 0;
}

int mg_shm_pages_of(const char *mountinfo, const char *shmem_enabled, const char *path, char *desc,
                    size_t cap)
{
    char fstype[64] = "", opts[512] = "", huge[32], global[32];
    size_t best = 0;
    int found = 0;
    for (const char *line = mountinfo; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[4096], *mp, *type;
        const char *super;
        if (len < sizeof(buf)) {
            memcpy(buf, line, len);
            buf[len] = '\0';
            /* the longest mount point holding path; of equal ones the later, mounted on top */
            if (parse_line(buf, &mp, &type, &super) == 0 && holds(mp, path) && strlen(mp) >= best) {
                best = strlen(mp);
                found = 1;
                snprintf(fstype, sizeof(fstype), "%s", type);
                snprintf(opts, sizeof(opts), "%s", super);
            }
        }
        line = end ? end + 1 : NULL;
    }
    if (!found) {
        snprintf(desc, cap, "no mount holds %s", path);
        return -1;
    }
    if (!strcmp(fstype, "hugetlbfs")) {
        option(opts, "pagesize=", huge, sizeof(huge));
        snprintf(desc, cap, "hugetlbfs%s%s", huge[0] ? " pagesize=" : "", huge);
        return 1;
    }
    if (strcmp(fstype, "tmpfs") != 0) {
        snprintf(desc, cap, "%s (not tmpfs: page cache of 4 KiB pages)", fstype);
        return 0;
    }
    option(opts, "huge=", huge, sizeof(huge));
    current(shmem_enabled, global, sizeof(global));
    if (!strcmp(global, "deny") || !strcmp(global, "force")) {
        snprintf(desc, cap, "tmpfs, shmem_enabled %s", global);
        return !strcmp(global, "force");
    }
    if (!huge[0] || !strcmp(huge, "never")) {
        snprintf(desc, cap, "tmpfs without huge=");
        return 0;
    }
    snprintf(desc, cap, "tmpfs huge=%s", huge);
    /* advise: only where a mapping asks before the pages exist; segments' are allocated
     * (fallocate) before any mapping */
    return !strcmp(huge, "always") || !strcmp(huge, "within_size");
}

/* A whole small file of /proc or /sys, NUL-terminated (malloc'd), or NULL. */
static char *slurp(const char *file)
{
    FILE *f = fopen(file, "r");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (f == NULL)
        return NULL;
    for (;;) {
        if (cap - len < 4096) {
            char *grown = cap < (8u << 20) ? realloc(buf, cap + 65536) : NULL;
            if (grown == NULL) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = grown;
            cap += 65536;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

int mg_shm_pages(const char *dir, char *desc, size_t cap)
{
    char real[PATH_MAX], *mounts, *thp;
    int rc;
    if (realpath(dir, real) == NULL) {
        snprintf(desc, cap, "%s does not exist", dir);
        return -1;
    }
    if ((mounts = slurp("/proc/self/mountinfo")) == NULL) {
        snprintf(desc, cap, "cannot read /proc/self/mountinfo");
        return -1;
    }
    thp = slurp("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
    rc = mg_shm_pages_of(mounts, thp, real, desc, cap);
    free(mounts);
    free(thp);
    return rc;
}

/* The holder's own words from the lock file: "pid=N host=H", or "" when it wrote none yet. */
static void read_holder(int fd, char *buf, size_t cap)
{
    ssize_t n = pread(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
}

int mg_shm_dir_lock(const char *dir, char *why, size_t cap)
{
    char path[PATH_MAX], me[300], host[256] = "";
    int fd, n;
    if (snprintf(path, sizeof(path), "%s/%s", dir, MG_SHM_LOCK_FILE) >= (int)sizeof(path)) {
        snprintf(why, cap, "the shm directory's path is too long");
        return -1;
    }
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        snprintf(why, cap, "open %s: %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char holder[300];
        read_holder(fd, holder, sizeof(holder));
        if (e == EWOULDBLOCK)
            snprintf(why, cap,
                     "another daemon holds this shm directory (%s; lock %s): give each daemon "
                     "a --shm-dir of its own",
                     holder[0] ? holder : "it has not said who it is yet", path);
        else
            snprintf(why, cap, "flock %s: %s", path, strerror(e));
        close(fd);
        return -1;
    }
    gethostname(host, sizeof(host) - 1);
    n = snprintf(me, sizeof(me), "pid=%ld host=%s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, me, (size_t)n, 0) != n) {
        snprintf(why, cap, "write %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}
