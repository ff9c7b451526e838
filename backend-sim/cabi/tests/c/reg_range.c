/* ibv_reg_mr over memory the program does not own is refused as the kernel refuses to
 * pin it (drivers/infiniband/core/umem.c): a range that wraps past the top of the
 * address space or spans more than 2^32 pages is EINVAL; one with a page that is not
 * mapped, not readable, or not writable where the access asks for writes is EFAULT.
 * Memory the program does own registers, read-only memory with read-only access too.
 * Run with libibverbs_sim.so preloaded (tests/reg_range.rs), or on a real device to
 * compare (rxe on Linux 6.1 gives the same answers but one, see PROT_NONE below).
 * Prints one line per check and exits with the number of failed checks. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <infiniband/verbs.h>

static int failures;

/* Registers `len` bytes at `addr` with `access`, expecting errno `want` (0: success). */
static void reg(struct ibv_pd *pd, const char *what, void *addr, size_t len, int access,
		int want)
{
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
	int got = mr ? 0 : errno;
	if (got == want && (mr != NULL) == (want == 0)) {
		printf("ok   %s: %s\n", what, want ? strerror(want) : "registered");
	} else {
		printf("FAIL %s: %s, errno %d (%s); expected %s\n", what,
		       mr ? "registered" : "refused", got, strerror(got),
		       want ? strerror(want) : "registered");
		failures++;
	}
	if (mr)
		ibv_dereg_mr(mr);
}

/* `pages` fresh pages of anonymous memory with `prot`. */
static char *map(size_t pages, int prot)
{
	void *p = mmap(NULL, pages * (size_t)sysconf(_SC_PAGESIZE), prot,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(100);
	}
	return p;
}

int main(void)
{
	const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	const int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd) {
		printf("FAIL no device, context or PD\n");
		return 1;
	}

	/* The four registrations. */
	char *small = malloc(8192);
	reg(pd, "8 KiB malloc, length 2^62 (more than 2^32 pages)", small, 1ULL << 62, rw, EINVAL);
	reg(pd, "8 KiB malloc, length 2^40", small, 1ULL << 40, rw, EFAULT);
	char *gone = map(256, PROT_READ | PROT_WRITE);
	munmap(gone, 256 * pg);
	reg(pd, "1 MiB unmapped", gone, 256 * pg, rw, EFAULT);
	reg(pd, "address 0x1000", (void *)0x1000, pg, IBV_ACCESS_REMOTE_READ, EFAULT);
	reg(pd, "the top page and one past it (wraps)", (void *)(UINTPTR_MAX - pg + 1), 2 * pg, rw,
	    EINVAL);
	reg(pd, "a malloc'd buffer to past the top (wraps)", small,
	    UINTPTR_MAX - (uintptr_t)small + 1 + pg, IBV_ACCESS_REMOTE_READ, EINVAL);

	/* Protections. */
	char *ro = map(4, PROT_READ);
	reg(pd, "read-only mapping, REMOTE_READ", ro, 4 * pg, IBV_ACCESS_REMOTE_READ, 0);
	reg(pd, "read-only mapping, no access flags", ro + 10, pg, 0, 0);
	reg(pd, "read-only mapping, LOCAL_WRITE", ro, 4 * pg, IBV_ACCESS_LOCAL_WRITE, EFAULT);
	reg(pd, "read-only mapping, REMOTE_WRITE", ro, pg,
	    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, EFAULT);
	reg(pd, "read-only mapping, REMOTE_ATOMIC", ro, pg,
	    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC, EFAULT);
	reg(pd, "read-only mapping, MW_BIND", ro, pg,
	    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND, EFAULT);
	/* Linux before 6.2 pinned read-only registrations with FOLL_FORCE, which reaches
	 * PROT_NONE pages too; later kernels refuse them, and the sim, which reads through
	 * the program's own mappings, must. */
	char *none = map(2, PROT_NONE);
	reg(pd, "PROT_NONE mapping, REMOTE_READ", none, 2 * pg, IBV_ACCESS_REMOTE_READ, EFAULT);
	char *holed = map(3, PROT_READ | PROT_WRITE);
	munmap(holed + pg, pg);
	reg(pd, "a hole in the middle", holed, 3 * pg, rw, EFAULT);
	reg(pd, "the page before the hole", holed, pg, rw, 0);
	reg(pd, "the last byte before the hole and the first in it", holed + pg - 1, 2, rw, EFAULT);
	char *mixed = map(4, PROT_READ | PROT_WRITE);
	mprotect(mixed + 2 * pg, 2 * pg, PROT_READ);
	reg(pd, "read-write then read-only, REMOTE_READ", mixed, 4 * pg, IBV_ACCESS_REMOTE_READ, 0);
	reg(pd, "read-write then read-only, LOCAL_WRITE", mixed, 4 * pg, rw, EFAULT);
	reg(pd, "its read-write part, LOCAL_WRITE", mixed, 2 * pg, rw, 0);

	/* Memory the program owns. */
	reg(pd, "8 KiB malloc", small, 8192, rw | IBV_ACCESS_REMOTE_ATOMIC, 0);
	char *big = map(16, PROT_READ | PROT_WRITE);
	reg(pd, "64 KiB mmap", big, 16 * pg, rw, 0);
	reg(pd, "inside it, unaligned", big + 123, 5000, rw, 0);
	char stack[256];
	memset(stack, 0, sizeof stack);
	reg(pd, "a stack buffer", stack, sizeof stack, rw, 0);

	printf("%d failed\n", failures);
	return failures;
}
