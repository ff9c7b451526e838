/* pipe-pingpong.c - the host's own blocking wake-up: a one-byte ping-pong over two pipes
 * between two processes, each blocked in read(2) until the other writes. Prints the
 * median round trip in microseconds (one number), the yardstick of ci/event-latency.sh.
 *
 *   pipe-pingpong [ROUND_TRIPS]     (default 5000; the first tenth are a warm-up)
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void move(int fd_in, int fd_out, char *c)
{
    if (read(fd_in, c, 1) != 1 || write(fd_out, c, 1) != 1)
        _exit(1);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 5000, warm = n / 10;
    int ping[2], pong[2];
    char c = 0;
    if (n < 10 || pipe(ping) || pipe(pong)) {
        fprintf(stderr, "usage: pipe-pingpong [ROUND_TRIPS >= 10]\n");
        return 2;
    }
    pid_t child = fork();
    if (child < 0)
        return 1;
    if (child == 0) {
        for (int i = 0; i < n + warm; i++)
            move(ping[0], pong[1], &c);
        _exit(0);
    }
    double *rt = malloc(sizeof(double) * n);
    if (!rt)
        return 1;
    for (int i = 0; i < n + warm; i++) {
        double t = now_us();
        if (write(ping[1], &c, 1) != 1 || read(pong[0], &c, 1) != 1)
            return 1;
        if (i >= warm)
            rt[i - warm] = now_us() - t;
    }
    int status;
    waitpid(child, &status, 0);
    qsort(rt, n, sizeof(double), by_value);
    printf("%.2f\n", rt[n / 2]);
    free(rt);
    return 0;
}
