/*
 * bench_pingpong: the floor of a small transfer between two daemons on this host — a TCP
 * ping-pong of `size` bytes between two processes over loopback (TCP_NODELAY, blocking
 * sockets). Prints each round trip's time in microseconds, one per line, after `warm` unprinted
 * ones.
 *
 *   bench_pingpong [size 4096] [count 2000] [warm 200]
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int full(int fd, char *buf, size_t n, int out)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r =
            out ? send(fd, buf + got, n - got, MSG_NOSIGNAL) : recv(fd, buf + got, n - got, 0);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
    size_t size = argc > 1 ? strtoul(argv[1], NULL, 0) : 4096;
    int count = argc > 2 ? atoi(argv[2]) : 2000, warm = argc > 3 ? atoi(argv[3]) : 200, one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    int ls = socket(AF_INET, SOCK_STREAM, 0), fd;
    char *buf = calloc(1, size ? size : 1);
    pid_t pid;
    if (ls < 0 || buf == NULL || bind(ls, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(ls, 1) != 0 || getsockname(ls, (struct sockaddr *)&sa, &sl) != 0) {
        perror("bench_pingpong");
        return 1;
    }
    if ((pid = fork()) == 0) { /* the echo */
        fd = accept(ls, NULL, NULL);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        while (full(fd, buf, size, 0) == 0 && full(fd, buf, size, 1) == 0)
            ;
        _exit(0);
    }
    close(ls);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        perror("bench_pingpong: connect");
        return 1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    for (int i = 0; i < warm + count; i++) {
        double t0 = now_us();
        if (full(fd, buf, size, 1) != 0 || full(fd, buf, size, 0) != 0) {
            perror("bench_pingpong: round trip");
            return 1;
        }
        if (i >= warm)
            printf("%.2f\n", now_us() - t0);
    }
    close(fd);
    waitpid(pid, NULL, 0);
    return 0;
}
