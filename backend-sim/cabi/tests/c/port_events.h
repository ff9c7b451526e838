/* What the checks of a port's events share (port.c, addr_change.c): the next async
 * event, polling a CQ for a while, an RC QP connected to itself through GID index 1 (the
 * GRH a RoCE port needs; timeout 16, retry_cnt 7: about two seconds of retries), a SEND
 * to it and what its completions say. */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "check.h"

/* The next async event within `ms`, acknowledged; -1 if none. */
static __attribute__((unused)) int next_event(struct ibv_context *ctx, int ms, int *port)
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
static __attribute__((unused)) int poll_for(struct ibv_cq *cq, struct ibv_wc *wc, int n, int ms)
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
static __attribute__((unused)) int self_connect_global(struct ibv_context *ctx, struct ibv_qp *qp)
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

/* Posts a receive into `buf` + 4096 (wr_id 2) and a signaled SEND of `buf`'s first 4096
 * bytes (wr_id 1), both in `mr`; 0 if both were posted. */
static __attribute__((unused)) int post_send_and_recv(struct ibv_qp *qp, struct ibv_mr *mr, char *buf)
{
	memset(buf, 0x5a, 4096);
	struct ibv_sge rs = { .addr = (uintptr_t)buf + 4096, .length = 4096, .lkey = mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 }, *rbad;
	struct ibv_sge ss = { .addr = (uintptr_t)buf, .length = 4096, .lkey = mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 1, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED }, *sbad;
	return ibv_post_recv(qp, &rw, &rbad) || ibv_post_send(qp, &sw, &sbad);
}

/* Whether the `got` completions in `wc` are post_send_and_recv's SEND failed with
 * `status` and its receive flushed. */
static __attribute__((unused)) int send_failed(const struct ibv_wc *wc, int got, enum ibv_wc_status status)
{
	return got == 2 && wc[0].wr_id == 1 && wc[0].status == status && wc[1].wr_id == 2 &&
	       wc[1].status == IBV_WC_WR_FLUSH_ERR;
}

/* Whether the `got` completions in `wc` are post_send_and_recv's SEND and receive, both
 * successful, the payload received as sent into `buf`. */
static __attribute__((unused)) int sent_and_received(const struct ibv_wc *wc, int got, const char *buf)
{
	int sent = 0, recvd = 0;
	for (int i = 0; i < got; i++) {
		sent += wc[i].wr_id == 1 && wc[i].status == IBV_WC_SUCCESS;
		recvd += wc[i].wr_id == 2 && wc[i].status == IBV_WC_SUCCESS && wc[i].byte_len == 4096;
	}
	return got == 2 && sent == 1 && recvd == 1 && !memcmp(buf, buf + 4096, 4096);
}

/* The first device, a PD, a CQ, 8 KiB of memory registered for local writes and an RC
 * QP of that CQ, not yet connected. */
struct self_qp {
	struct ibv_context *ctx;
	struct ibv_cq *cq;
	char *buf;
	struct ibv_mr *mr;
	struct ibv_qp *qp;
};

/* Opens `s` (see struct self_qp); 0 if every piece is there. */
static __attribute__((unused)) int open_self_qp(struct self_qp *s)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	s->ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
	if (!s->ctx)
		return -1;
	struct ibv_pd *pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0);
	s->buf = calloc(1, 8192);
	s->mr = pd && s->buf ? ibv_reg_mr(pd, s->buf, 8192, IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_qp_init_attr ia = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	s->qp = pd && s->cq ? ibv_create_qp(pd, &ia) : NULL;
	return s->mr && s->qp ? 0 : -1;
}
