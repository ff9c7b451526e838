/* Two MPI ranks on the sim (tests/openmpi.rs): a ping-pong of messages from 1 byte to
 * 1 MiB, each checked byte by byte on both sides, then an Allreduce. Each rank prints
 * "rank R of N: ok" and exits 0, or "BAD" and exits 1. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

static char buf[1 << 20];

static char pattern(int i, int round, int n) { return (char)(i * 7 + round + n); }

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int bad = 0;
	for (int n = 1; n <= (int)sizeof buf; n *= 16) {
		for (int round = 0; round < 10; round++) {
			if (rank == 0) {
				for (int i = 0; i < n; i++)
					buf[i] = pattern(i, round, n);
				MPI_Send(buf, n, MPI_CHAR, 1, round, MPI_COMM_WORLD);
				memset(buf, 0, n);
				MPI_Recv(buf, n, MPI_CHAR, 1, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (int i = 0; i < n; i++)
					if (buf[i] != (char)(pattern(i, round, n) + 1)) {
						printf("rank 0: byte %d of %d wrong in round %d\n", i, n, round);
						bad++;
						break;
					}
			} else if (rank == 1) {
				MPI_Recv(buf, n, MPI_CHAR, 0, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (int i = 0; i < n; i++)
					if (buf[i] != pattern(i, round, n)) {
						printf("rank 1: byte %d of %d wrong in round %d\n", i, n, round);
						bad++;
						break;
					}
				for (int i = 0; i < n; i++)
					buf[i]++;
				MPI_Send(buf, n, MPI_CHAR, 0, round, MPI_COMM_WORLD);
			}
		}
	}
	long mine = rank + 1, sum = 0;
	MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	if (sum != (long)size * (size + 1) / 2) {
		printf("rank %d: Allreduce gave %ld\n", rank, sum);
		bad++;
	}
	printf("rank %d of %d: %s\n", rank, size, bad ? "BAD" : "ok");
	MPI_Finalize();
	return bad != 0;
}
