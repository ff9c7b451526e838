/*
 * call_cost.c - the C side of backend-ibverbs' per-call benchmark: the calls a data
 * path makes, straight to libibverbs, each in a function of its own so that
 * `valgrind --tool=callgrind` counts the instructions of each (inclusive of libibverbs
 * and the provider). examples/call_cost.rs makes the same calls through backend-ibverbs
 * with the same function names; ci/call-cost.sh runs both on rxe0 and prints the
 * difference per call.
 *
 *   call_cost [DEVICE [GID_INDEX [ITERS [PHASE]]]]   default: the first device, 1, 1000, all
 *
 * The phases, each ITERS times (a callgrind run takes one, and counts per function):
 *   send   cc_post_send: ibv_post_send of one signaled 8-byte RDMA WRITE from QP a to
 *          QP b; then cc_poll: ibv_poll_cq for one entry, which finds the completion
 *          (the CQ is armed before the post and its event awaited outside both)
 *   inline the same with the WRITE's 8 bytes inline (IBV_SEND_INLINE)
 *   empty  cc_poll on an empty CQ
 *   recv   cc_post_recv: ibv_post_recv of one receive WR with one SGE
 *
 * Build: cc -O2 -o call_cost call_cost.c -libverbs
 */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIE(...) do { fprintf(stderr, "call_cost: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

__attribute__((noinline)) int cc_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	return ibv_post_send(qp, wr, &bad);
}

__attribute__((noinline)) int cc_poll(struct ibv_cq *cq, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, 1, wc);
}

__attribute__((noinline)) int cc_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr)
{
	struct ibv_recv_wr *bad;
	return ibv_post_recv(qp, wr, &bad);
}

static void to_rts(struct ibv_qp *qp, uint32_t dest_qpn, union ibv_gid *dgid, int gid_index)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		DIE("modify_qp INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *dgid;
	a.ah_attr.grh.sgid_index = gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		DIE("modify_qp RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		DIE("modify_qp RTS");
}

int main(int argc, char **argv)
{
	const char *name = argc > 1 ? argv[1] : NULL;
	int gid_index = argc > 2 ? atoi(argv[2]) : 1;
	int iters = argc > 3 ? atoi(argv[3]) : 1000;
	const char *phase = argc > 4 ? argv[4] : "all";
	int all = !strcmp(phase, "all");
	int n, i;

	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_device *dev = NULL;
	for (i = 0; list && i < n; i++)
		if (!name || !strcmp(ibv_get_device_name(list[i]), name))
			dev = list[i];
	if (!dev)
		DIE("no device %s", name ? name : "");
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd)
		DIE("open/alloc_pd");
	char *buf = aligned_alloc(4096, 4096);
	memset(buf, 0, 4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq_a = ibv_create_cq(ctx, 64, NULL, ch, 0);
	struct ibv_cq *cq_b = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_cq *cq_e = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!mr || !ch || !cq_a || !cq_b || !cq_e)
		DIE("reg_mr/create_cq");
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 64;
	ia.cap.max_recv_wr = iters;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.cap.max_inline_data = 64;
	ia.send_cq = ia.recv_cq = cq_a;
	struct ibv_qp *a = ibv_create_qp(pd, &ia);
	ia.send_cq = ia.recv_cq = cq_b;
	struct ibv_qp *b = ibv_create_qp(pd, &ia);
	if (!a || !b)
		DIE("create_qp");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, gid_index, &gid))
		DIE("query_gid");
	to_rts(a, b->qp_num, &gid, gid_index);
	to_rts(b, a->qp_num, &gid, gid_index);

	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr wr;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = 1;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = (uintptr_t)buf + 64;
	wr.wr.rdma.rkey = mr->rkey;
	struct ibv_wc wc;
	int sends = (all || !strcmp(phase, "send")) ? iters : 0;
	if (all || !strcmp(phase, "inline"))
		sends += iters;
	for (i = 0; i < sends; i++) {
		wr.send_flags = IBV_SEND_SIGNALED;
		if (!strcmp(phase, "inline") || (all && i >= iters))
			wr.send_flags |= IBV_SEND_INLINE;
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		/* armed before the post, the CQ raises an event for the completion: waiting
		 * for it keeps the polls out of cc_poll_one, which then finds exactly one */
		if (ibv_req_notify_cq(cq_a, 0))
			DIE("req_notify_cq");
		if (cc_post_send(a, &wr))
			DIE("post_send");
		if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx))
			DIE("get_cq_event");
		ibv_ack_cq_events(ev_cq, 1);
		if (cc_poll(cq_a, &wc) != 1 || wc.status != IBV_WC_SUCCESS)
			DIE("no successful completion after its event");
	}
	for (i = 0; (all || !strcmp(phase, "empty")) && i < iters; i++)
		if (cc_poll(cq_e, &wc) != 0)
			DIE("a completion on the empty CQ");
	struct ibv_sge rsge = { .addr = (uintptr_t)buf + 128, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 2, .next = NULL, .sg_list = &rsge, .num_sge = 1 };
	for (i = 0; (all || !strcmp(phase, "recv")) && i < iters; i++)
		if (cc_post_recv(b, &rwr))
			DIE("post_recv %d", i);
	printf("call_cost (C): %s, %d iterations on %s\n", phase, iters, ibv_get_device_name(dev));
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_cq(cq_a);
	ibv_destroy_cq(cq_b);
	ibv_destroy_cq(cq_e);
	ibv_destroy_comp_channel(ch);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
