/* stream-copies: rstream against ib_send_bw on an HCA whose data path is a unix stream
 * socket between two processes on the programs' own CPUs (the sim's same-host path) and
 * which costs nothing else: two processes over a socketpair (4 MiB send buffer), each
 * busy-polling with non-blocking calls as the sim's polling threads do, moving COUNT
 * messages of SIZE bytes one way (defaults: 65536 x 20000).
 *
 *   stream-copies send [SIZE [COUNT]]  ib_send_bw's data movement: the sender sends each
 *                                      message from one buffer, the receiver reads it
 *                                      straight into one buffer (the socket's two copies,
 *                                      nothing else)
 *   stream-copies rs [SIZE [COUNT]]    rstream's: each end also copies as rsockets does
 *                                      (rstream asks for 512 KiB socket buffers): the
 *                                      sender copies the message into a 512 KiB send ring
 *                                      and sends it as the chunks rsend posts (2 KiB, then
 *                                      doubling up to 64 KiB: 2, 4, 8, 16, 32 and 2 KiB
 *                                      for 64 KiB) in one sendmsg; the receiver reads into
 *                                      a 512 KiB receive ring and copies the message out
 *                                      of it. SIZE at most 256 KiB (half the ring).
 *
 * Prints "MODE R Gb/s" (decimal, as rstream and perftest's --report_gbits count). The
 * ratio of `rs` to `send` over a sitting is what rstream / ib_send_bw comes to on such an
 * HCA (ci/rdmacm-bench.sh prints it beside the two programs; docs/performance.md).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RING (512 * 1024)
#define MAX_CHUNKS 16

/* The lengths rsend gives the WRITEs of one call of `size` bytes (rsocket.c: a transfer
 * starts at 2 KiB and doubles up to 64 KiB); their count. */
static size_t rsend_chunks(size_t size, size_t *len)
{
    size_t n = 0, olen = 2048;
    for (size_t left = size; left && n < MAX_CHUNKS; n++) {
        len[n] = olen < left ? olen : left;
        left -= len[n];
        if (olen < 65536)
            olen <<= 1;
    }
    return n;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* Reads exactly n bytes, polling. */
static void read_all(int fd, char *p, size_t n)
{
    while (n) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
        } else if (r == 0) {
            fprintf(stderr, "stream-copies: the sender closed early\n");
            exit(1);
        } else if (errno != EAGAIN && errno != EINTR) {
            die("recv");
        }
    }
}

/* Sends all of iov[0..cnt), polling. */
static void send_all(int fd, struct iovec *iov, size_t cnt)
{
    struct msghdr m = {0};
    m.msg_iov = iov;
    m.msg_iovlen = cnt;
    while (m.msg_iovlen) {
        ssize_t r = sendmsg(fd, &m, MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue;
            die("sendmsg");
        }
        while (r > 0) {
            if ((size_t)r >= m.msg_iov[0].iov_len) {
                r -= (ssize_t)m.msg_iov[0].iov_len;
                m.msg_iov++;
                m.msg_iovlen--;
            } else {
                m.msg_iov[0].iov_base = (char *)m.msg_iov[0].iov_base + r;
                m.msg_iov[0].iov_len -= (size_t)r;
                r = 0;
            }
        }
    }
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "send") && strcmp(argv[1], "rs"))) {
        fprintf(stderr, "usage: stream-copies send|rs [SIZE [COUNT]]\n");
        return 2;
    }
    int rs = !strcmp(argv[1], "rs");
    long size = argc > 2 ? atol(argv[2]) : 65536;
    long count = argc > 3 ? atol(argv[3]) : 20000;
    if (size < 1 || size > RING / 2 || count < 1) {
        fprintf(stderr, "stream-copies: SIZE 1..%d and COUNT >= 1\n", RING / 2);
        return 2;
    }
    const size_t msg = (size_t)size;
    size_t chunks[MAX_CHUNKS];
    size_t nchunks = rsend_chunks(msg, chunks);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
        die("socketpair");
    int sndbuf = 4 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    char *user = malloc(msg), *ring = malloc(RING);
    if (!user || !ring)
        die("malloc");
    memset(user, 3, msg);
    memset(ring, 0, RING);

    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        size_t off = 0;
        for (long i = 0; i < count; i++) {
            if (!rs) {
                read_all(sv[1], user, msg);
                continue;
            }
            if (off + msg > RING)
                off = 0;
            read_all(sv[1], ring + off, msg);
            memcpy(user, ring + off, msg);
            off += msg;
        }
        char done = 1;
        if (write(sv[1], &done, 1) != 1)
            die("write");
        _exit(0);
    }

    double t = now();
    size_t off = 0;
    for (long i = 0; i < count; i++) {
        struct iovec iov[MAX_CHUNKS];
        if (!rs) {
            iov[0].iov_base = user;
            iov[0].iov_len = msg;
            send_all(sv[0], iov, 1);
            continue;
        }
        if (off + msg > RING)
            off = 0;
        memcpy(ring + off, user, msg);
        size_t at = off;
        for (size_t k = 0; k < nchunks; k++) {
            iov[k].iov_base = ring + at;
            iov[k].iov_len = chunks[k];
            at += chunks[k];
        }
        send_all(sv[0], iov, nchunks);
        off += msg;
    }
    /* Timed until the receiver has every byte in place. */
    char done;
    for (;;) {
        ssize_t r = recv(sv[0], &done, 1, 0);
        if (r == 1)
            break;
        if (r == 0) {
            fprintf(stderr, "stream-copies: the receiver ended early\n");
            return 1;
        }
        if (errno != EINTR)
            die("recv");
    }
    t = now() - t;
    waitpid(pid, NULL, 0);
    printf("%s %.2f Gb/s\n", argv[1], count * (double)msg * 8 / t / 1e9);
    return 0;
}
