/* What the C checks run under the preloaded library share (tests/common/mod.rs builds
 * each program from tests/c/): CHECK, which prints one line per check and counts the
 * failed ones, and a QP connected to itself. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <infiniband/verbs.h>

static int failures;

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (cond) {                                                    \
			printf("ok   %s\n", #cond);                            \
		} else {                                                       \
			printf("FAIL %s (errno %d): ", #cond, errno);          \
			printf(__VA_ARGS__);                                   \
			printf("\n");                                          \
			failures++;                                            \
		}                                                              \
		fflush(stdout);                                                \
	} while (0)

static __attribute__((unused)) int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				     IBV_QP_ACCESS_FLAGS);
}

/* Moves `qp` from INIT to RTS connected to the QP `dest` of this device: by LID, or by
 * GID `gid_index` where the port has no LID (RoCE). */
static __attribute__((unused)) int init_to_rts(struct ibv_context *ctx, struct ibv_qp *qp,
					      uint32_t dest, int gid_index)
{
	struct ibv_port_attr port;
	union ibv_gid gid;
	if (ibv_query_port(ctx, 1, &port) || ibv_query_gid(ctx, 1, gid_index, &gid))
		return -1;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
		.dest_qp_num = dest, .rq_psn = 7, .max_dest_rd_atomic = 4,
		.min_rnr_timer = 12, .ah_attr = { .dlid = port.lid, .port_num = 1 } };
	if (port.lid == 0) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = gid;
		a.ah_attr.grh.hop_limit = 1;
		a.ah_attr.grh.sgid_index = gid_index;
	}
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS, .sq_psn = 7, .timeout = 14,
		.retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 4 };
	return ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
				     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Moves `qp` from INIT to RTS connected to itself (its own LID, or GID 0, and QPN). */
static __attribute__((unused)) int init_to_rts_self(struct ibv_context *ctx, struct ibv_qp *qp)
{
	return init_to_rts(ctx, qp, qp->qp_num, 0);
}

/* Connects `qp` to itself (its own LID and QPN). */
static __attribute__((unused)) int self_connect(struct ibv_context *ctx, struct ibv_qp *qp)
{
	return to_init(qp) ? -1 : init_to_rts_self(ctx, qp);
}
