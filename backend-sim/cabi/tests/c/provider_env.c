/* The mlx5 provider's MLX_<OBJ>_ALLOC_TYPE settings (tests/answers.rs runs this with
 * libibverbs_sim.so preloaded, each of MLX_CQ_ALLOC_TYPE, MLX_QP_ALLOC_TYPE and
 * MLX_SRQ_ALLOC_TYPE set to HUGE, under the mlx5 and the portable profile): on a device
 * with Mellanox's vendor id the object is made where the kernel hands out huge pages
 * (as rdma-core's alloc_huge_mem() asks for them) and refused with ENOMEM where it does
 * not; on any other device the setting means nothing. */
#include <stdlib.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include "check.h"

/* Whether the kernel hands out a segment of huge pages now. */
static int huge_pages(void)
{
	int id = shmget(IPC_PRIVATE, 1 << 21, SHM_HUGETLB | SHM_R | SHM_W);
	if (id == -1)
		return 0;
	shmctl(id, IPC_RMID, NULL);
	return 1;
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = list ? ibv_open_device(list[0]) : NULL;
	struct ibv_device_attr attr;
	CHECK(ctx && ibv_query_device(ctx, &attr) == 0, "open and query the device");
	if (!ctx) {
		printf("%d failed\n", failures);
		return 1;
	}
	int refused = attr.vendor_id == 0x02c9 && !huge_pages();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	errno = 0;
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	const char *cq_huge = getenv("MLX_CQ_ALLOC_TYPE");
	if (cq_huge && refused)
		CHECK(!cq && errno == ENOMEM, "the CQ is refused with ENOMEM");
	else
		CHECK(cq != NULL, "the CQ is made");
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	errno = 0;
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	if (getenv("MLX_SRQ_ALLOC_TYPE") && refused)
		CHECK(!srq && errno == ENOMEM, "the SRQ is refused with ENOMEM");
	else
		CHECK(srq != NULL, "the SRQ is made");
	if (cq) {
		struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
		errno = 0;
		struct ibv_qp *qp = ibv_create_qp(pd, &qa);
		if (getenv("MLX_QP_ALLOC_TYPE") && refused)
			CHECK(!qp && errno == ENOMEM, "the QP is refused with ENOMEM");
		else
			CHECK(qp != NULL, "the QP is made");
		if (qp)
			ibv_destroy_qp(qp);
		ibv_destroy_cq(cq);
	}
	if (srq)
		ibv_destroy_srq(srq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("%d failed\n", failures);
	return failures;
}
