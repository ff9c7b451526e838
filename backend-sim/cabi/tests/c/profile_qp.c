/* QP answers that depend on the HCA a profile plays (tests/answers.rs runs this with
 * libibverbs_sim.so preloaded under the portable and mlx5 profiles; rxe's port is
 * Ethernet, which this program's connection by LID does not reach): the create flag
 * that blocks self multicast loopback is taken where the device takes it (mlx5; what it
 * blocks is in tests/mcast.rs of backend-sim), and a send built with ibv_wr_* on a
 * QP that has not reached RTS fails in ibv_wr_complete with EINVAL, as rdma-core's mlx5
 * answers it (while its ibv_post_send answers ENOMEM). Prints one line per check and
 * exits with the number of failed checks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static char buf[64];

static struct ibv_qp *create(enum ibv_qp_type type, uint32_t create_flags)
{
	struct ibv_qp_init_attr_ex a = { .send_cq = cq, .recv_cq = cq, .qp_type = type,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
			     IBV_QP_INIT_ATTR_CREATE_FLAGS,
		.pd = pd, .create_flags = create_flags,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE };
	return ibv_create_qp_ex(ctx, &a);
}

/* A signaled RDMA WRITE of 8 bytes to the QP itself through the ibv_wr_* API. */
static int wr_write(struct ibv_qp *qp, uint64_t id)
{
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(qp);
	ibv_wr_start(qx);
	qx->wr_id = id;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, mr->rkey, (uintptr_t)buf + 32);
	ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf, 8);
	return ibv_wr_complete(qx);
}

/* The same through ibv_post_send: 0, or the errno. */
static int post_write(struct ibv_qp *qp, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + 32, .rkey = mr->rkey } }, *bad;
	return ibv_post_send(qp, &wr, &bad);
}

/* Polls until the completion of `wr_id` arrives (at most 10 s): how many came, the
 * wr_id of the last in *last. WRs posted before it complete before it. */
static int completions_until(uint64_t wr_id, uint64_t *last)
{
	int n = 0;
	for (int i = 0; i < 10000 && *last != wr_id; i++) {
		struct ibv_wc wc;
		while (ibv_poll_cq(cq, 1, &wc) == 1) {
			n++;
			*last = wc.wr_id;
		}
		if (*last != wr_id)
			usleep(1000);
	}
	return n;
}

int main(void)
{
	const char *profile = getenv("RDMA_SIM_PROFILE");
	int mlx5 = profile && !strcmp(profile, "mlx5");
	struct ibv_device **list = ibv_get_device_list(NULL);
	ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	cq = ctx ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE |
						 IBV_ACCESS_REMOTE_WRITE) : NULL;
	if (!mr || !cq) {
		printf("FAIL setup\n");
		return 1;
	}

	errno = 0;
	struct ibv_qp *ud = create(IBV_QPT_UD, IBV_QP_CREATE_BLOCK_SELF_MCAST_LB);
	if (mlx5)
		CHECK(ud != NULL, "mlx5 takes IBV_QP_CREATE_BLOCK_SELF_MCAST_LB");
	else
		CHECK(!ud && errno == EOPNOTSUPP, "IBV_QP_CREATE_BLOCK_SELF_MCAST_LB refused");
	if (ud)
		ibv_destroy_qp(ud);
	errno = 0;
	struct ibv_qp *fcs = create(IBV_QPT_UD, IBV_QP_CREATE_SCATTER_FCS);
	CHECK(!fcs && errno == EOPNOTSUPP, "IBV_QP_CREATE_SCATTER_FCS refused");

	struct ibv_qp *qp = create(IBV_QPT_RC, 0);
	CHECK(qp != NULL, "an RC QP with the ibv_wr_* API");
	if (!qp) {
		printf("%d failed\n", failures);
		return failures;
	}
	int r = wr_write(qp, 1);
	CHECK(r == EINVAL, "ibv_wr_complete in RESET: %d", r);
	r = post_write(qp, 2);
	CHECK(r == (mlx5 ? ENOMEM : EINVAL), "ibv_post_send in RESET: %d", r);
	CHECK(to_init(qp) == 0, "RESET -> INIT");
	r = wr_write(qp, 3);
	CHECK(r == EINVAL, "ibv_wr_complete in INIT: %d", r);
	CHECK(init_to_rts_self(ctx, qp) == 0, "INIT -> RTS");
	r = wr_write(qp, 4);
	CHECK(r == 0, "ibv_wr_complete in RTS: %d", r);
	/* Nothing refused was posted. */
	uint64_t last = 0;
	int n = completions_until(4, &last);
	CHECK(n == 1 && last == 4, "completions: %d, the last %lu", n,
	      (unsigned long)last);
	printf("%d failed\n", failures);
	return failures;
}
