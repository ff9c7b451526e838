/* context->cmd_fd is a valid descriptor, as libibverbs' always is (tests/answers.rs runs
 * this with libibverbs_sim.so preloaded): programs dup it (rdma-core's tests do before
 * ibv_import_device, which the sim answers EOPNOTSUPP) and expect it close-on-exec.
 * Prints one line per check and exits with the number of failed checks. */
#include <fcntl.h>
#include <unistd.h>
#include "check.h"

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
	if (!ctx) {
		printf("FAIL no device\n");
		return 1;
	}
	int fd = ctx->cmd_fd;
	CHECK(fd >= 0 && fcntl(fd, F_GETFD) >= 0, "cmd_fd %d is open", fd);
	CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC, "cmd_fd is close-on-exec");
	CHECK(fd != ctx->async_fd, "cmd_fd is not async_fd");
	int dup_fd = dup(fd);
	CHECK(dup_fd >= 0, "dup(cmd_fd)");
	errno = 0;
	struct ibv_context *imported = ibv_import_device(dup_fd);
	CHECK(!imported && errno == EOPNOTSUPP, "ibv_import_device: %p", (void *)imported);
	CHECK(close(dup_fd) == 0, "the dup closes");
	/* A second context has a descriptor of its own. */
	struct ibv_context *other = ibv_open_device(list[0]);
	CHECK(other && other->cmd_fd >= 0 && other->cmd_fd != fd, "a second context's cmd_fd");
	CHECK(other && ibv_close_device(other) == 0, "close the second context");
	CHECK(ibv_close_device(ctx) == 0, "close");
	CHECK(fcntl(fd, F_GETFD) == -1 && errno == EBADF, "ibv_close_device closes cmd_fd");
	ibv_free_device_list(list);
	printf("%d failed\n", failures);
	return failures;
}
