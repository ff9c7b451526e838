/* Destroys QPs whose completions nobody polled, as every MPI_Finalize does
 * (tests/answers.rs runs this with libibverbs_sim.so preloaded and reads its standard
 * error): the portable profile's advice that destroy removed them is said once per
 * process, and under the C ABI only when RDMA_SIM_PORTABILITY_WARNINGS asks for it.
 * Prints one line per check and exits with the number of failed checks. */
#include <stdint.h>
#include "check.h"

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	static char buf[64];
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE |
							     IBV_ACCESS_REMOTE_WRITE) : NULL;
	if (!mr) {
		printf("FAIL setup\n");
		return 1;
	}
	for (int round = 0; round < 3; round++) {
		struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
		struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 16, NULL, ch, 0) : NULL;
		struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq,
			.qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 4, .max_recv_wr = 4,
							.max_send_sge = 1, .max_recv_sge = 1 } };
		struct ibv_qp *qp = cq ? ibv_create_qp(pd, &qa) : NULL;
		CHECK(qp && self_connect(ctx, qp) == 0, "round %d: a QP connected to itself", round);
		if (!qp)
			break;
		struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
			.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = (uintptr_t)buf + 32, .rkey = mr->rkey } },
			*bad;
		CHECK(ibv_req_notify_cq(cq, 0) == 0, "arm the CQ");
		CHECK(ibv_post_send(qp, &wr, &bad) == 0, "a signaled WRITE");
		/* Its completion is in the CQ once the event came; nobody polls it. */
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0, "the completion event");
		ibv_ack_cq_events(cq, 1);
		CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_cq(cq) == 0 &&
		      ibv_destroy_comp_channel(ch) == 0, "destroyed unpolled");
	}
	printf("%d failed\n", failures);
	return failures;
}
