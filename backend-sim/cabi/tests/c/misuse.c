/* Bad use of libibverbs meets libibverbs' documented answers, and the data path works
 * for a C program through the header's inline functions: run with libibverbs_sim.so
 * preloaded (tests/misuse.rs). Prints one line per check and exits with the number of
 * failed checks. Ends without destroying what is left, as a program that exits early
 * would. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"

/* Calls a pointer-returning verb, expecting NULL with errno `want`. */
#define REFUSED(call, want)                                                    \
	do {                                                                   \
		errno = 0;                                                     \
		void *p_ = (void *)(call);                                     \
		int e_ = errno;                                                \
		if (p_ == NULL && e_ == (want)) {                              \
			printf("ok   %s: NULL, errno %s\n", #call, #want);     \
		} else {                                                       \
			printf("FAIL %s: %p, errno %d\n", #call, p_, e_);      \
			failures++;                                            \
		}                                                              \
	} while (0)

/* Polls until `n` completions arrived (at most 5 s); the last in *last. */
static int poll_n(struct ibv_cq *cq, int n, struct ibv_wc *last)
{
	for (int spins = 0; spins < 5000000 && n > 0; spins++) {
		struct ibv_wc wc;
		int got = ibv_poll_cq(cq, 1, &wc);
		if (got < 0)
			return got;
		if (got == 1) {
			*last = wc;
			if (wc.status != IBV_WC_SUCCESS)
				return -100 - wc.status;
			n--;
		}
	}
	return n == 0 ? 0 : -1;
}

int main(void)
{
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list != NULL && num >= 1, "ibv_get_device_list");
	if (!list || num < 1)
		return 1;

	/* Devices and contexts. */
	REFUSED(ibv_open_device(NULL), EINVAL);
	REFUSED(ibv_open_device((struct ibv_device *)&num), EINVAL);
	REFUSED(ibv_get_device_name(NULL), EINVAL);
	CHECK(ibv_get_device_index(NULL) == -1, "index of NULL");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL, "open");
	if (!ctx)
		return 1;
	CHECK(ibv_close_device(NULL) == EINVAL, "close NULL");
	REFUSED(ibv_alloc_pd(NULL), EINVAL);

	/* Queries. */
	struct ibv_port_attr port;
	CHECK(ibv_query_port(ctx, 2, &port) == EINVAL, "no port 2");
	CHECK(ibv_query_port(ctx, 1, &port) == 0 && port.lid > 0 && port.lid < 0xc000,
	      "LID %#x", port.lid);
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 99, &gid) == -1, "no GID 99");
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "GID 0");
	__be16 pkey;
	CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && pkey == 0xffff, "pkey");
	CHECK(ibv_query_pkey(ctx, 1, 1, &pkey) == -1, "no pkey 1");
	struct ibv_device_attr_ex ax;
	struct ibv_query_device_ex_input in = { .comp_mask = 1 };
	CHECK(ibv_query_device_ex(ctx, &in, &ax) == EINVAL, "query_device_ex comp_mask");
	CHECK(ibv_query_device_ex(ctx, NULL, &ax) == 0 && ax.orig_attr.phys_port_cnt == 1,
	      "query_device_ex");
	struct ibv_values_ex values = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	CHECK(ibv_query_rt_values_ex(ctx, &values) == EOPNOTSUPP, "no raw clock");

	/* Features the sim does not have. */
	struct ibv_xrcd_init_attr xi = { 0 };
	REFUSED(ibv_open_xrcd(ctx, &xi), EOPNOTSUPP);
	struct ibv_alloc_dm_attr dm = { .length = 64 };
	REFUSED(ibv_alloc_dm(ctx, &dm), EOPNOTSUPP);
	struct ibv_td_init_attr td = { 0 };
	REFUSED(ibv_alloc_td(ctx, &td), EOPNOTSUPP);
	struct ibv_counters_init_attr ci = { 0 };
	REFUSED(ibv_create_counters(ctx, &ci), EOPNOTSUPP);
	struct ibv_wq_init_attr wi = { 0 };
	REFUSED(ibv_create_wq(ctx, &wi), EOPNOTSUPP);
	REFUSED(ibv_import_device(3), EOPNOTSUPP);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL, "alloc_pd");
	REFUSED(ibv_alloc_mw(pd, (enum ibv_mw_type)3), EINVAL);
	REFUSED(ibv_alloc_null_mr(pd), EOPNOTSUPP);

	/* Memory regions. */
	static char buf[1 << 16] __attribute__((aligned(4096)));
	REFUSED(ibv_reg_mr(NULL, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE), EINVAL);
	REFUSED(ibv_reg_mr(pd, NULL, sizeof buf, IBV_ACCESS_LOCAL_WRITE), EINVAL);
	REFUSED(ibv_reg_mr(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE), EINVAL);
	REFUSED(ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_REMOTE_WRITE), EINVAL);
	REFUSED(ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_ON_DEMAND), EOPNOTSUPP);
	REFUSED(ibv_reg_mr_iova(pd, buf, sizeof buf, 0x1000, IBV_ACCESS_LOCAL_WRITE),
		EOPNOTSUPP);
	unsigned int relaxed = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
			       IBV_ACCESS_RELAXED_ORDERING;
	struct ibv_mr *mr = ibv_reg_mr_iova2(pd, buf, sizeof buf, (uintptr_t)buf, relaxed);
	CHECK(mr != NULL && mr->addr == buf && mr->lkey != 0, "reg_mr with relaxed ordering");
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE) == IBV_REREG_MR_ERR_CMD && errno == EOPNOTSUPP,
	      "rereg, which the portable profile's device lacks (as rxe's provider)");
	errno = 0;
	CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
	      "rereg: access bits without IBV_REREG_MR_CHANGE_ACCESS");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc a PD with an MR");

	/* CQs and channels. */
	REFUSED(ibv_create_cq(ctx, 0, NULL, NULL, 0), EINVAL);
	REFUSED(ibv_create_cq(ctx, 16, NULL, NULL, 5), EINVAL);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch != NULL && ch->fd >= 0, "channel");
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, (void *)0x1234, ch, 0);
	CHECK(cq != NULL && cq->cqe >= 64 && cq->channel == ch, "create_cq");
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "destroy a busy channel");
	CHECK(ibv_resize_cq(cq, 128) == 0 && cq->cqe >= 128, "resize");
	CHECK(ibv_resize_cq(cq, 0) == EINVAL, "resize to 0");
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, -1, &wc) < 0, "poll -1 entries");
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "poll an empty CQ");
	int flags = fcntl(ch->fd, F_GETFL);
	CHECK(!(flags & O_NONBLOCK), "the channel's fd blocks, as libibverbs'");
	fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN,
	      "no event on a non-blocking channel");
	flags = fcntl(ctx->async_fd, F_GETFL);
	fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
	struct ibv_async_event aev;
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &aev) == -1 && errno == EAGAIN, "no async event");
	struct ibv_cq_init_attr_ex cxa = { .cqe = 16,
		.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
	REFUSED(ibv_create_cq_ex(ctx, &cxa), EOPNOTSUPP);
	cxa.wc_flags = IBV_WC_STANDARD_FLAGS;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cxa);
	CHECK(cqx != NULL, "create_cq_ex");

	/* QPs. */
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 64 },
		.qp_type = IBV_QPT_XRC_SEND };
	REFUSED(ibv_create_qp(pd, &qa), EOPNOTSUPP);
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 1 << 30;
	REFUSED(ibv_create_qp(pd, &qa), EINVAL);
	qa.cap.max_send_wr = 16;
	qa.send_cq = NULL;
	REFUSED(ibv_create_qp(pd, &qa), EINVAL);
	qa.send_cq = cq;
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	CHECK(qp != NULL && qp->state == IBV_QPS_RESET && qa.cap.max_inline_data >= 64,
	      "create_qp");
	CHECK(ibv_destroy_cq(cq) == EBUSY, "destroy a CQ a QP uses");
	CHECK(ibv_qp_to_qp_ex(qp) == NULL, "qp_ex of a QP created without send ops");
	struct ibv_qp_attr bad = { .qp_state = IBV_QPS_RTS };
	CHECK(ibv_modify_qp(qp, &bad, IBV_QP_STATE) == EINVAL, "RESET -> RTS");
	CHECK(ibv_modify_qp(qp, &bad, IBV_QP_STATE | IBV_QP_RATE_LIMIT) == EINVAL,
	      "rate limit");
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad_wr = NULL;
	CHECK(ibv_post_send(qp, &swr, &bad_wr) == EINVAL && bad_wr == &swr,
	      "send before RTS");
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad_rwr = NULL;
	CHECK(ibv_post_recv(qp, &rwr, &bad_rwr) == EINVAL && bad_rwr == &rwr,
	      "receive in RESET");
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK(srq != NULL && sa.attr.max_wr >= 16, "create_srq");
	struct ibv_recv_wr *bad_srq_wr = NULL;
	CHECK(srq && ibv_post_srq_recv(srq, &rwr, &bad_srq_wr) == 0, "post_srq_recv");
	CHECK(srq && ibv_destroy_srq(srq) == 0 && ibv_destroy_srq(srq) == EINVAL,
	      "destroy an SRQ, then again");
	struct ibv_ah_attr aha = { .dlid = port.lid, .port_num = 1 };
	struct ibv_ah *ah = ibv_create_ah(pd, &aha);
	CHECK(ah != NULL, "create_ah");
	CHECK(ah && ibv_destroy_ah(ah) == 0 && ibv_destroy_ah(ah) == EINVAL,
	      "destroy an AH, then again");
	struct ibv_ah_attr bad_port = { .dlid = port.lid, .port_num = 2 };
	REFUSED(ibv_create_ah(pd, &bad_port), EINVAL);
	CHECK(ibv_attach_mcast(qp, &gid, 0xc001) == EINVAL, "multicast on an RC QP");

	/* The data path through the inline ops: SEND, inline SEND from the stack with no
	 * lkey, WRITE, READ, atomics, and a bad opcode in the middle of a list. */
	CHECK(self_connect(ctx, qp) == 0 && qp->state == IBV_QPS_RTS, "connect to itself");
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	CHECK(ibv_query_qp(qp, &qattr, IBV_QP_STATE, &qinit) == 0 &&
		      qattr.qp_state == IBV_QPS_RTS && qinit.send_cq == cq,
	      "query_qp");
	memset(buf, 0, sizeof buf);
	memcpy(buf, "hello", 6);
	struct ibv_sge rsge = { .addr = (uintptr_t)buf + 4096, .length = 4096, .lkey = mr->lkey };
	struct ibv_recv_wr rwrs[2] = {
		{ .wr_id = 10, .sg_list = &rsge, .num_sge = 1, .next = &rwrs[1] },
		{ .wr_id = 11, .sg_list = &rsge, .num_sge = 1 },
	};
	CHECK(ibv_post_recv(qp, rwrs, &bad_rwr) == 0, "post two receives");
	CHECK(ibv_post_send(qp, &swr, &bad_wr) == 0, "send");
	CHECK(poll_n(cq, 2, &wc) == 0, "send and receive complete");
	CHECK(memcmp(buf + 4096, "hello", 6) == 0, "the message arrived");
	char stack[8] = "inline!";
	struct ibv_sge isge = { .addr = (uintptr_t)stack, .length = 8, .lkey = 0 };
	struct ibv_send_wr iwr = { .wr_id = 3, .sg_list = &isge, .num_sge = 1,
		.opcode = IBV_WR_SEND_WITH_IMM, .imm_data = htobe32(0xabcd),
		.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE };
	CHECK(ibv_post_send(qp, &iwr, &bad_wr) == 0, "inline send from the stack");
	memset(stack, 0, sizeof stack);
	struct ibv_wc w2[2];
	int got = 0;
	for (int spins = 0; spins < 5000000 && got < 2; spins++) {
		int n = ibv_poll_cq(cq, 2 - got, w2 + got);
		if (n < 0)
			break;
		got += n;
	}
	struct ibv_wc *recv = w2[0].opcode == IBV_WC_RECV ? &w2[0] : &w2[1];
	CHECK(got == 2 && recv->status == IBV_WC_SUCCESS && (recv->wc_flags & IBV_WC_WITH_IMM) &&
		      be32toh(recv->imm_data) == 0xabcd && recv->byte_len == 8 &&
		      memcmp(buf + 4096, "inline!", 8) == 0,
	      "inline data and immediate arrived");
	/* Inline data is read in place, in a list as alone; its pieces count as SGEs and
	 * its length against max_inline_data, as rxe and mlx5 check them. */
	char piece[6] = "piece";
	struct ibv_sge psge = { .addr = (uintptr_t)piece, .length = 6, .lkey = 0 };
	struct ibv_send_wr lw[2] = {
		{ .wr_id = 30, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		  .wr.rdma = { .remote_addr = (uintptr_t)buf + 9000, .rkey = mr->rkey },
		  .next = &lw[1] },
		{ .wr_id = 31, .sg_list = &psge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
		  .wr.rdma = { .remote_addr = (uintptr_t)buf + 9100, .rkey = mr->rkey } },
	};
	CHECK(ibv_post_send(qp, lw, &bad_wr) == 0 && poll_n(cq, 1, &wc) == 0 && wc.wr_id == 31 &&
		      memcmp(buf + 9000, "hello", 6) == 0 && memcmp(buf + 9100, "piece", 6) == 0,
	      "an inline write from the stack after a write, in one list");
	struct ibv_sge two[2] = { { .addr = (uintptr_t)piece, .length = 3 },
				  { .addr = (uintptr_t)piece + 3, .length = 3 } };
	lw[1].sg_list = two;
	lw[1].num_sge = 2;
	bad_wr = NULL;
	CHECK(ibv_post_send(qp, &lw[1], &bad_wr) == EINVAL && bad_wr == &lw[1],
	      "inline data in two pieces on a QP of max_send_sge 1");
	static char big[4096];
	struct ibv_sge bsge = { .addr = (uintptr_t)big, .length = qa.cap.max_inline_data + 1 };
	lw[1].sg_list = &bsge;
	lw[1].num_sge = 1;
	bad_wr = NULL;
	CHECK(ibv_post_send(qp, &lw[1], &bad_wr) == EINVAL && bad_wr == &lw[1],
	      "inline data longer than max_inline_data (%u)", qa.cap.max_inline_data);
	struct ibv_send_wr wwr = { .wr_id = 4, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + 8192, .rkey = mr->rkey } };
	struct ibv_send_wr inv = { .wr_id = 5, .opcode = IBV_WR_TSO };
	wwr.next = &inv;
	CHECK(ibv_post_send(qp, &wwr, &bad_wr) == EINVAL && bad_wr == &inv,
	      "a list with an opcode the sim lacks: the first is posted");
	CHECK(poll_n(cq, 1, &wc) == 0 && wc.wr_id == 4 && memcmp(buf + 8192, "hello", 6) == 0,
	      "the write before it completed");
	uint64_t *counter = (uint64_t *)(buf + 12288);
	*counter = 40;
	struct ibv_sge asge = { .addr = (uintptr_t)buf + 12296, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr fwr = { .wr_id = 6, .sg_list = &asge, .num_sge = 1,
		.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD, .send_flags = IBV_SEND_SIGNALED,
		.wr.atomic = { .remote_addr = (uintptr_t)counter, .compare_add = 2,
			       .rkey = mr->rkey } };
	CHECK(ibv_post_send(qp, &fwr, &bad_wr) == 0 && poll_n(cq, 1, &wc) == 0 &&
		      *counter == 42 && *(uint64_t *)(buf + 12296) == 40,
	      "fetch and add");
	/* A WR posted alone is read in place, its SGEs too: refused as in a list. */
	bad_wr = NULL;
	CHECK(ibv_post_send(qp, &inv, &bad_wr) == EINVAL && bad_wr == &inv,
	      "an opcode the sim lacks, alone");
	struct ibv_sge two_keyed[2] = { sge, sge };
	struct ibv_send_wr two_wr = { .wr_id = 8, .sg_list = two_keyed, .num_sge = 2,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + 8192, .rkey = mr->rkey } };
	bad_wr = NULL;
	CHECK(ibv_post_send(qp, &two_wr, &bad_wr) == EINVAL && bad_wr == &two_wr,
	      "two SGEs alone on a QP of max_send_sge 1");
	two_wr.num_sge = -1;
	bad_wr = NULL;
	CHECK(ibv_post_send(qp, &two_wr, &bad_wr) == EINVAL && bad_wr == &two_wr,
	      "a negative num_sge");
	two_wr.num_sge = 1;
	two_wr.sg_list = &two_keyed[1];
	memcpy(buf + 64, "alone", 6);
	two_keyed[1].addr = (uintptr_t)buf + 64;
	two_keyed[1].length = 6;
	CHECK(ibv_post_send(qp, &two_wr, &bad_wr) == 0 && poll_n(cq, 1, &wc) == 0 &&
		      wc.wr_id == 8 && memcmp(buf + 8192, "alone", 6) == 0,
	      "a write alone, its SGE read in place");
	struct ibv_sge bad_key = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey + 1 };
	struct ibv_send_wr rd = { .wr_id = 7, .sg_list = &bad_key, .num_sge = 1,
		.opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + 8192, .rkey = mr->rkey } };
	CHECK(ibv_post_send(qp, &rd, &bad_wr) == 0 && poll_n(cq, 1, &wc) == -100 - IBV_WC_LOC_PROT_ERR,
	      "a bad lkey completes with LOC_PROT_ERR");

	/* The extended QP and CQ interfaces. */
	struct ibv_qp_init_attr_ex qx = { .send_cq = ibv_cq_ex_to_cq(cqx),
		.recv_cq = ibv_cq_ex_to_cq(cqx),
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC, .comp_mask = IBV_QP_INIT_ATTR_PD |
						   IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd, .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE };
	struct ibv_qp *q2 = ibv_create_qp_ex(ctx, &qx);
	struct ibv_qp_ex *x = q2 ? ibv_qp_to_qp_ex(q2) : NULL;
	CHECK(q2 != NULL && x != NULL, "create_qp_ex with send ops");
	if (x && self_connect(ctx, q2) == 0) {
		memset(buf + 8192, 0, 64);
		ibv_wr_start(x);
		x->wr_id = 20;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)buf + 8192);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf, 6);
		CHECK(ibv_wr_complete(x) == 0, "wr_complete");
		struct ibv_poll_cq_attr pa = { 0 };
		int r;
		for (int spins = 0; spins < 5000000; spins++)
			if ((r = ibv_start_poll(cqx, &pa)) != ENOENT)
				break;
		CHECK(r == 0 && cqx->wr_id == 20 && cqx->status == IBV_WC_SUCCESS &&
			      ibv_wc_read_opcode(cqx) == IBV_WC_RDMA_WRITE &&
			      memcmp(buf + 8192, "hello", 6) == 0,
		      "the write of the builder, polled with start_poll");
		if (r == 0) {
			CHECK(ibv_next_poll(cqx) == ENOENT, "nothing more");
			ibv_end_poll(cqx);
		}
		ibv_wr_start(x);
		ibv_wr_rdma_read(x, mr->rkey, (uintptr_t)buf);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf + 8192, 6);
		CHECK(ibv_wr_complete(x) == EINVAL, "an operation the QP was not created for");
		ibv_wr_start(x);
		ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)buf + 8192);
		ibv_wr_set_inline_data(x, piece, 6);
		CHECK(ibv_wr_complete(x) == EINVAL, "inline data on a QP of max_inline_data 0");
	}

	/* Destroying twice, and what close_device leaves. */
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	CHECK(ibv_dealloc_pd(pd2) == 0 && ibv_dealloc_pd(pd2) == EINVAL, "dealloc twice");
	CHECK(ibv_dealloc_pd((struct ibv_pd *)cq) == EINVAL, "a CQ is not a PD");
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_qp(qp) == EINVAL, "destroy twice");
	CHECK(ibv_close_device(ctx) == 0, "close with objects alive");
	REFUSED(ibv_alloc_pd(ctx), EINVAL);
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_comp_channel(ch) == 0,
	      "objects of a closed device can still be destroyed");

	/* q2, cqx, mr and pd are left for exit, as a program that ends early leaves them. */
	ibv_free_device_list(list);
	printf("%d failed\n", failures);
	return failures;
}
