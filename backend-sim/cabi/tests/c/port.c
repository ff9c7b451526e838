/* A port that goes down and comes back, for a C program (tests/port.rs runs this with
 * RDMA_SIM_PORT_DOWN=AFTER:FOR under each profile; man ibv_get_async_event, man
 * ibv_query_port): IBV_EVENT_PORT_ERR on port 1 and the port reads IBV_PORT_DOWN, a SEND
 * posted meanwhile on an RC QP connected to itself through GID 1 (timeout 16, retry_cnt 7: about two
 * seconds of retries), then IBV_EVENT_PORT_ACTIVE and IBV_PORT_ACTIVE. The SEND
 * completes SUCCESS and is received once (the port came back within its retries), or
 * with argument "fails" IBV_WC_LOC_QP_OP_ERR (rxe fails a send through a netdev that is
 * down). Prints one line per check and exits with the number of failed checks. */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "check.h"

/* The next async event within `ms`, acknowledged; -1 if none. */
static int next_event(struct ibv_context *ctx, int ms, int *port)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	if (poll(&p, 1, ms) != 1)
		return -1;
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev))
		return -1;
	int t = ev.event_type;
	*port = ev.element.port_num;
	ibv_ack_async_event(&ev);
	return t;
}

/* Polls `cq` until `n` completions are in `wc` or `ms` pass; how many there are. */
static int poll_for(struct ibv_cq *cq, struct ibv_wc *wc, int n, int ms)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int got = 0;
	for (;;) {
		int r = ibv_poll_cq(cq, n - got, wc + got);
		if (r > 0)
			got += r;
		clock_gettime(CLOCK_MONOTONIC, &t);
		long el = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
		if (got >= n || r < 0 || el > ms)
			return got;
	}
}

/* Connects `qp` to itself as check.h's self_connect does, through GID index 1 (the
 * GRH a RoCE port needs). */
static int self_connect_global(struct ibv_context *ctx, struct ibv_qp *qp)
{
	union ibv_gid gid;
	struct ibv_port_attr port;
	if (to_init(qp) || ibv_query_gid(ctx, 1, 1, &gid) || ibv_query_port(ctx, 1, &port))
		return -1;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
		.dest_qp_num = qp->qp_num, .rq_psn = 7, .max_dest_rd_atomic = 4,
		.min_rnr_timer = 12, .ah_attr = { .is_global = 1, .port_num = 1, .dlid = port.lid,
			.grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 1 } } };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS, .sq_psn = 7, .timeout = 16,
		.retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 4 };
	return ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
				     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

int main(int argc, char **argv)
{
	int fails = argc > 1 && !strcmp(argv[1], "fails");
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
	CHECK(ctx, "open the device");
	if (!ctx)
		return 1;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	char *buf = calloc(1, 8192);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 8192, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp && mr && self_connect_global(ctx, qp) == 0, "an RC QP connected to itself");
	struct ibv_port_attr pa;

	int port = 0;
	int ev = next_event(ctx, 10000, &port);
	CHECK(ev == IBV_EVENT_PORT_ERR && port == 1, "IBV_EVENT_PORT_ERR on port 1 (got %d on %d)", ev, port);
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_DOWN && pa.phys_state == 3,
	      "the port reads DOWN, phys_state DISABLED (%d, %d)", pa.state, pa.phys_state);

	memset(buf, 0x5a, 4096);
	struct ibv_sge rs = { .addr = (uintptr_t)buf + 4096, .length = 4096, .lkey = mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 }, *rbad;
	struct ibv_sge ss = { .addr = (uintptr_t)buf, .length = 4096, .lkey = mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 1, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED }, *sbad;
	CHECK(ibv_post_recv(qp, &rw, &rbad) == 0 && ibv_post_send(qp, &sw, &sbad) == 0,
	      "post a SEND while the port is down");

	ev = next_event(ctx, 10000, &port);
	CHECK(ev == IBV_EVENT_PORT_ACTIVE && port == 1, "IBV_EVENT_PORT_ACTIVE on port 1 (got %d)", ev);
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE && pa.phys_state == 5,
	      "the port reads ACTIVE, phys_state LINK_UP (%d, %d)", pa.state, pa.phys_state);

	struct ibv_wc wc[4];
	int got = poll_for(cq, wc, 2, 10000);
	if (fails) {
		CHECK(got == 2 && wc[0].wr_id == 1 && wc[0].status == IBV_WC_LOC_QP_OP_ERR &&
			      wc[1].wr_id == 2 && wc[1].status == IBV_WC_WR_FLUSH_ERR,
		      "the SEND fails LOC_QP_OP_ERR, the receive is flushed (%d: %s)", got,
		      got ? ibv_wc_status_str(wc[0].status) : "-");
	} else {
		int sent = 0, recvd = 0;
		for (int i = 0; i < got; i++) {
			sent += wc[i].wr_id == 1 && wc[i].status == IBV_WC_SUCCESS;
			recvd += wc[i].wr_id == 2 && wc[i].status == IBV_WC_SUCCESS && wc[i].byte_len == 4096;
		}
		CHECK(got == 2 && sent == 1 && recvd == 1 && !memcmp(buf, buf + 4096, 4096),
		      "the SEND completes and is received once (%d: %s)", got,
		      got ? ibv_wc_status_str(wc[0].status) : "-");
		CHECK(poll_for(cq, wc, 1, 200) == 0, "nothing more");
	}
	printf("%d failed\n", failures);
	return failures;
}
