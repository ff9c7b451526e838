/* The reply to a datagram (tests/answers.rs runs this with libibverbs_sim.so preloaded,
 * under the portable profile with GID index 0 and under the rxe profile with GID index
 * 1, its IPv4-mapped RoCE v2 GID): a UD QP sends itself a datagram through a global
 * address handle, and the address handle that ibv_init_ah_from_wc and
 * ibv_create_ah_from_wc make from the receive answers the sender: its GID as the
 * destination, the GID the datagram came to as the source, and a reply sent with it
 * arrives. On RoCE v2 between IPv4 addresses the receive's first 40 bytes hold 20
 * unused bytes and the packet's IPv4 header, not a GRH (rxe, and libibverbs reads them
 * so), as udaddy's server finds. Argument: the GID index. Prints one line per check and
 * exits with the number of failed checks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

#define QKEY 0x11111111

static struct ibv_context *ctx;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static char buf[2 * (40 + 64)];

static int post_recv(void)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 40 + 64, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	return ibv_post_recv(qp, &wr, &bad);
}

static int send_to(struct ibv_ah *ah, const char *text)
{
	char *out = buf + 40 + 64;
	strcpy(out, text);
	struct ibv_sge sge = { .addr = (uintptr_t)out, .length = strlen(text) + 1, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.ud = { .ah = ah, .remote_qpn = qp->qp_num, .remote_qkey = QKEY } }, *bad;
	return ibv_post_send(qp, &wr, &bad);
}

/* Polls until both the send's and the receive's completions came; the receive's in *rwc. */
static int exchange(struct ibv_wc *rwc)
{
	int got = 0;
	for (long spins = 0; got < 2 && spins < 100000000; spins++) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0 || (n == 1 && wc.status != IBV_WC_SUCCESS))
			return -1;
		if (n == 1) {
			got++;
			if (wc.wr_id == 1)
				*rwc = wc;
		}
	}
	return got == 2 ? 0 : -1;
}

int main(int argc, char **argv)
{
	int index = argc > 1 ? atoi(argv[1]) : 0;
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	ctx = ibv_open_device(list[0]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr init = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 } };
	qp = ibv_create_qp(pd, &init);
	CHECK(ctx && pd && cq && mr && qp, "resources");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0, "INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "RTS");

	union ibv_gid gid;
	struct ibv_port_attr port;
	CHECK(ibv_query_gid(ctx, 1, index, &gid) == 0 && ibv_query_port(ctx, 1, &port) == 0, "GID %d", index);
	struct ibv_ah_attr to_self = { .is_global = 1, .dlid = port.lid, .port_num = 1,
		.grh = { .dgid = gid, .sgid_index = index, .hop_limit = 64, .traffic_class = 32 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &to_self);
	CHECK(ah != NULL, "the address handle to itself");

	struct ibv_wc wc;
	CHECK(post_recv() == 0 && send_to(ah, "ping") == 0 && exchange(&wc) == 0, "the datagram");
	CHECK(wc.wc_flags & IBV_WC_GRH, "flags %#x", wc.wc_flags);
	CHECK(strcmp(buf + 40, "ping") == 0, "payload %.8s", buf + 40);

	struct ibv_ah_attr reply;
	memset(&reply, 0xa5, sizeof reply);
	int rc = ibv_init_ah_from_wc(ctx, 1, &wc, (struct ibv_grh *)buf, &reply);
	CHECK(rc == 0, "ibv_init_ah_from_wc: %d", rc);
	CHECK(reply.is_global == 1, "is_global %d", reply.is_global);
	CHECK(memcmp(&reply.grh.dgid, &gid, sizeof gid) == 0, "the sender's GID");
	CHECK(reply.grh.sgid_index == index, "sgid_index %d", reply.grh.sgid_index);
	CHECK(reply.grh.traffic_class == 32, "traffic_class %d", reply.grh.traffic_class);
	CHECK(reply.port_num == 1, "port_num %d", reply.port_num);

	struct ibv_ah *back = ibv_create_ah_from_wc(pd, &wc, (struct ibv_grh *)buf, 1);
	CHECK(back != NULL, "ibv_create_ah_from_wc");
	memset(buf, 0, 40 + 64);
	CHECK(back && post_recv() == 0 && send_to(back, "pong") == 0 && exchange(&wc) == 0, "the reply");
	CHECK(strcmp(buf + 40, "pong") == 0, "payload %.8s", buf + 40);

	printf("%d failed\n", failures);
	return failures;
}
