/* tcp-connect: TCP connection setup and teardown of N connections between two processes,
 * the yardstick of cmtime's rate on the sim (ci/rdmacm-bench.sh). As cmtime does with
 * rdma_cm ids, the client opens all N connections before it ends any: it connects each
 * and waits for the server's byte on each (the server accepted it: rdma_cm's
 * ESTABLISHED), then shuts each down and waits for the server's end of each (its
 * DISCONNECTED), and prints the connections per second of the whole.
 *
 *   tcp-connect -s PORT N          server: serves N connections, then exits
 *   tcp-connect HOST PORT N        client: prints "N connections: T ms, R/s"
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static int server(int port, int n)
{
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 4096))
		die("listen");
	int *fds = calloc(n, sizeof *fds);
	for (int i = 0; i < n; i++) {
		fds[i] = accept(l, NULL, NULL);
		if (fds[i] < 0 || write(fds[i], "x", 1) != 1)
			die("accept");
	}
	/* Each connection's end: the client's shutdown, answered with this side's close. */
	for (int i = 0; i < n; i++) {
		char c;
		while (read(fds[i], &c, 1) > 0)
			;
		close(fds[i]);
	}
	return 0;
}

static int client(const char *host, int port, int n)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
		die("address");
	int *fds = calloc(n, sizeof *fds);
	double t0 = now_ms();
	for (int i = 0; i < n; i++) {
		fds[i] = socket(AF_INET, SOCK_STREAM, 0);
		if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&a, sizeof a))
			die("connect");
	}
	for (int i = 0; i < n; i++) {
		char c;
		if (read(fds[i], &c, 1) != 1)
			die("read");
	}
	double t1 = now_ms();
	for (int i = 0; i < n; i++)
		shutdown(fds[i], SHUT_WR);
	for (int i = 0; i < n; i++) {
		char c;
		while (read(fds[i], &c, 1) > 0)
			;
		close(fds[i]);
	}
	double t2 = now_ms();
	printf("%d connections: %.2f ms (connect %.2f ms, disconnect %.2f ms), %.0f/s\n", n, t2 - t0,
	       t1 - t0, t2 - t1, n / ((t2 - t0) / 1e3));
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "-s") == 0)
		return server(atoi(argv[2]), atoi(argv[3]));
	if (argc == 4)
		return client(argv[1], atoi(argv[2]), atoi(argv[3]));
	fprintf(stderr, "usage: tcp-connect -s PORT N | tcp-connect HOST PORT N\n");
	return 2;
}
