/* MPI ranks on the sim (tests/openmpi.rs, ci/real-programs.sh), in pairs (rank r with
 * rank r^1; the number of ranks must be even): a ping-pong of messages from 8 bytes to
 * 1 MiB, each checked byte by byte on both sides, then an Allreduce checked against its
 * sum and a loop of Barriers. Each rank prints "rank R of N: ok" and exits 0, or "BAD"
 * and exits 1; rank 0 then prints the figures of its pair and of the Barriers:
 * "latency 8 B: X us, bandwidth 1 MiB: Y MB/s, barrier: Z us". */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#define MAX (1 << 20)
static char buf[MAX];

static char pattern(int i, int round, int n) { return (char)(i * 7 + round + n); }

/* One checked round trip of `n` bytes between `rank` and `peer`; the lower rank starts.
 * Returns the number of wrong buffers seen (0 or 1). */
static int round_trip(int rank, int peer, int n, int round)
{
	if (rank < peer) {
		for (int i = 0; i < n; i++)
			buf[i] = pattern(i, round, n);
		MPI_Send(buf, n, MPI_CHAR, peer, round, MPI_COMM_WORLD);
		memset(buf, 0, n);
		MPI_Recv(buf, n, MPI_CHAR, peer, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		for (int i = 0; i < n; i++)
			if (buf[i] != (char)(pattern(i, round, n) + 1)) {
				printf("rank %d: byte %d of %d wrong in round %d\n", rank, i, n, round);
				return 1;
			}
	} else {
		MPI_Recv(buf, n, MPI_CHAR, peer, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		for (int i = 0; i < n; i++)
			if (buf[i] != pattern(i, round, n)) {
				printf("rank %d: byte %d of %d wrong in round %d\n", rank, i, n, round);
				return 1;
			}
		for (int i = 0; i < n; i++)
			buf[i]++;
		MPI_Send(buf, n, MPI_CHAR, peer, round, MPI_COMM_WORLD);
	}
	return 0;
}

/* Seconds per iteration of `iters` unchecked round trips of `n` bytes with `peer`. */
static double timed(int rank, int peer, int n, int iters)
{
	MPI_Barrier(MPI_COMM_WORLD);
	double t = MPI_Wtime();
	for (int k = 0; k < iters; k++) {
		if (rank < peer) {
			MPI_Send(buf, n, MPI_CHAR, peer, 0, MPI_COMM_WORLD);
			MPI_Recv(buf, n, MPI_CHAR, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else {
			MPI_Recv(buf, n, MPI_CHAR, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(buf, n, MPI_CHAR, peer, 0, MPI_COMM_WORLD);
		}
	}
	return (MPI_Wtime() - t) / iters;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int bad = 0;
	int peer = rank ^ 1;
	if (size % 2 != 0) {
		if (rank == 0)
			printf("an even number of ranks is needed, not %d\n", size);
		MPI_Finalize();
		return 1;
	}
	for (int n = 8; n <= MAX; n *= 4)
		for (int round = 0; round < 10; round++)
			bad += round_trip(rank, peer, n, round);
	double lat = timed(rank, peer, 8, 2000) / 2;
	double bw = 2.0 * MAX / timed(rank, peer, MAX, 50);
	long mine = rank + 1, sum = 0;
	MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	if (sum != (long)size * (size + 1) / 2) {
		printf("rank %d: Allreduce gave %ld\n", rank, sum);
		bad++;
	}
	MPI_Barrier(MPI_COMM_WORLD);
	double t = MPI_Wtime();
	for (int k = 0; k < 1000; k++)
		MPI_Barrier(MPI_COMM_WORLD);
	double barrier = (MPI_Wtime() - t) / 1000;
	printf("rank %d of %d: %s\n", rank, size, bad ? "BAD" : "ok");
	if (rank == 0)
		printf("latency 8 B: %.2f us, bandwidth 1 MiB: %.0f MB/s, barrier: %.2f us\n", lat * 1e6,
		       bw / 1e6, barrier * 1e6);
	MPI_Finalize();
	return bad != 0;
}
