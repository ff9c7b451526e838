/* Prints what the sim's devices say of themselves (tests/answers.rs runs it with
 * libibverbs_sim.so preloaded under several settings and reads the lines): how many
 * devices are listed, and the first one's vendor_id and vendor_part_id. A vendor_id of
 * 0 fails, as rdma-core's tests fail it (a device without a vendor id is broken). */
#include "check.h"

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "ibv_get_device_list");
	if (!list || n == 0) {
		printf("%d failed\n", failures);
		return failures;
	}
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_device_attr attr;
	CHECK(ctx && ibv_query_device(ctx, &attr) == 0, "ibv_query_device");
	if (ctx) {
		printf("devices %d\nvendor_id 0x%x\nvendor_part_id %u\n", n, attr.vendor_id,
		       attr.vendor_part_id);
		CHECK(attr.vendor_id != 0, "vendor_id is not 0");
		ibv_close_device(ctx);
	}
	ibv_free_device_list(list);
	printf("%d failed\n", failures);
	return failures;
}
