/* What ibv_reg_mr + ibv_dereg_mr cost: of 4 KiB of malloc'd memory and of 1 GiB of
 * untouched anonymous memory, the median of many rounds, in microseconds. Run it with
 * libibverbs_sim.so preloaded, or on a real device to compare:
 *
 *   cc -O2 -o reg_mr_cost backend-sim/cabi/bench/reg_mr_cost.c -libverbs
 *   LD_PRELOAD=target/release/libibverbs_sim.so RDMA_SIM_DEVICES=1 ./reg_mr_cost [ROUNDS]
 *
 * A figure, not a test: nothing is asserted. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <infiniband/verbs.h>

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

/* The median time of `rounds` registrations (and deregistrations) of `len` bytes at `p`. */
static double median_us(struct ibv_pd *pd, void *p, size_t len, int rounds)
{
	double *t = calloc(rounds, sizeof *t);
	for (int i = 0; i < rounds; i++) {
		double t0 = now_us();
		struct ibv_mr *mr = ibv_reg_mr(pd, p, len, IBV_ACCESS_LOCAL_WRITE |
						   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
		if (!mr) {
			perror("ibv_reg_mr");
			exit(1);
		}
		ibv_dereg_mr(mr);
		t[i] = now_us() - t0;
	}
	qsort(t, rounds, sizeof *t, by_value);
	double m = t[rounds / 2];
	free(t);
	return m;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 2000;
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd) {
		fprintf(stderr, "no device\n");
		return 1;
	}
	void *small = malloc(4096);
	size_t gib = (size_t)1 << 30;
	void *big = mmap(NULL, gib, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (big == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	printf("ibv_reg_mr + ibv_dereg_mr, median of %d: 4 KiB %.2f us, 1 GiB %.2f us\n", rounds,
	       median_us(pd, small, 4096, rounds), median_us(pd, big, gib, rounds / 20 + 1));
	return 0;
}
