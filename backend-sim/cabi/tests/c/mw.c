/* Memory windows, ibv_resize_cq and ibv_rereg_mr through the C ABI (tests/mw.rs runs this
 * with libibverbs_sim.so preloaded under each profile): a type 1 window bound with
 * ibv_bind_mw (its rkey rotated by ibv_inc_rkey, as rxe's and mlx5's providers do), a
 * type 2 window bound by an IBV_WR_BIND_MW of ibv_post_send and by ibv_wr_bind_mw, remote
 * access through each, IBV_WR_LOCAL_INV and ibv_wr_local_inv, IBV_WR_SEND_WITH_INV whose
 * receive completes with IBV_WC_WITH_INV and the invalidated rkey (ibv_poll_cq and
 * ibv_wc_read_invalidated_rkey), an access through an invalidated window refused with
 * IBV_WC_REM_ACCESS_ERR, ibv_dealloc_mw of a bound window; ibv_resize_cq keeping the
 * completions it holds, in order, and refusing to shrink below them; ibv_rereg_mr as the
 * profile's device answers. argv[1] names the profile (or the real device's kind): under
 * "mlx5" ibv_rereg_mr is served, elsewhere it fails with IBV_REREG_MR_ERR_CMD and
 * EOPNOTSUPP; under "rxe" the receive of a SEND_WITH_INV is marked with the kernel's
 * IB_WC_WITH_INVALIDATE bit, which reads as IBV_WC_IP_CSUM_OK (rxe_resp.c do_complete()),
 * elsewhere with IBV_WC_WITH_INV. Also runs on rxe0 (built with -DGID_INDEX=1).
 * Prints one line per check and exits with the number of failed checks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "check.h"

/* The GID index of a RoCE port's connections (rxe0 in ci/rxe-vm.sh's guest needs 1). */
#ifndef GID_INDEX
#define GID_INDEX 0
#endif

static struct ibv_context *ctx;
static struct ibv_pd *pd;
/* The wc_flags bit that marks an invalidated rkey (see above). */
static unsigned inv_flag = IBV_WC_WITH_INV;

/* One completion of `cq` (ibv_poll_cq), waiting up to 10 s; status -1 if none came. */
static struct ibv_wc one(struct ibv_cq *cq)
{
	struct ibv_wc wc = { .status = (enum ibv_wc_status)-1 };
	time_t end = time(NULL) + 10;
	while (time(NULL) < end) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n != 0)
			return wc;
	}
	return wc;
}

/* Connects `qp` to the QP `dest` of this device. */
static int connect_to(struct ibv_qp *qp, uint32_t dest)
{
	return to_init(qp) ? -1 : init_to_rts(ctx, qp, dest, GID_INDEX);
}

/* An RC QP on `cq`, created with `ops` for the ibv_wr_* API. */
static struct ibv_qp *rc_qp(struct ibv_cq *cq, uint64_t ops)
{
	struct ibv_qp_init_attr_ex qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD, .pd = pd };
	if (ops) {
		qa.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		qa.send_ops_flags = ops;
	}
	return ibv_create_qp_ex(ctx, &qa);
}

/* An RC QP on `cq` connected to itself, created with `ops` for the ibv_wr_* API. */
static struct ibv_qp *self_qp(struct ibv_cq *cq, uint64_t ops)
{
	struct ibv_qp *qp = rc_qp(cq, ops);
	if (qp && connect_to(qp, qp->qp_num)) {
		ibv_destroy_qp(qp);
		return NULL;
	}
	return qp;
}

/* Posts one signaled RDMA `op` of 8 bytes from `local` to `remote` under `rkey`. */
static int rdma(struct ibv_qp *qp, struct ibv_mr *mr, enum ibv_wr_opcode op, char *local,
		char *remote, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 50, .sg_list = &sge, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)remote, .rkey = rkey } }, *bad;
	return ibv_post_send(qp, &wr, &bad);
}

static void windows(void)
{
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
				       IBV_ACCESS_MW_BIND);
	/* The server's QP `qp` binds the windows; the client's `qa` uses them. */
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_cq *cqa = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_qp *qp = mr && cq ? rc_qp(cq, 0) : NULL;
	struct ibv_qp *qa = qp && cqa ? rc_qp(cqa, 0) : NULL;
	CHECK(qa && connect_to(qp, qa->qp_num) == 0 && connect_to(qa, qp->qp_num) == 0,
	      "a region with MW_BIND and two connected QPs");
	if (!qa)
		return;
	struct ibv_wc wc;

	/* Type 1: ibv_bind_mw rotates the rkey's tag. */
	struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	CHECK(mw1 && mw1->type == IBV_MW_TYPE_1 && mw1->pd == pd, "ibv_alloc_mw type 1");
	if (!mw1)
		return;
	uint32_t before = mw1->rkey;
	struct ibv_mw_bind b1 = { .wr_id = 11, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = mr, .addr = (uintptr_t)buf + 1024, .length = 1024,
			       .mw_access_flags = IBV_ACCESS_REMOTE_READ } };
	CHECK(ibv_bind_mw(qp, mw1, &b1) == 0, "ibv_bind_mw");
	CHECK(mw1->rkey == ibv_inc_rkey(before), "the window's rkey is %#x, was %#x", mw1->rkey,
	      before);
	wc = one(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 11,
	      "bind completion: status %d opcode %d", wc.status, wc.opcode);
	memcpy(buf + 1024, "window-1", 8);
	CHECK(rdma(qa, mr, IBV_WR_RDMA_READ, buf, buf + 1024, mw1->rkey) == 0, "READ posted");
	wc = one(cqa);
	CHECK(wc.status == IBV_WC_SUCCESS && memcmp(buf, "window-1", 8) == 0,
	      "READ through the type 1 window: status %d", wc.status);

	/* Type 2 by IBV_WR_BIND_MW of ibv_post_send. */
	struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw2 != NULL, "ibv_alloc_mw type 2");
	if (!mw2)
		return;
	uint32_t rkey2 = ibv_inc_rkey(mw2->rkey);
	struct ibv_send_wr bw = { .wr_id = 12, .opcode = IBV_WR_BIND_MW,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_mw = { .mw = mw2, .rkey = rkey2,
			     .bind_info = { .mr = mr, .addr = (uintptr_t)buf + 2048, .length = 1024,
					    .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } } },
		*bad;
	CHECK(ibv_post_send(qp, &bw, &bad) == 0, "IBV_WR_BIND_MW posted");
	wc = one(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 12,
	      "type 2 bind completion: status %d opcode %d", wc.status, wc.opcode);
	/* The providers pass mw->rkey with the next bind and rxe refuses a stale one
	 * (rxe_mw.c rxe_bind_mw()): the program keeps it current. */
	mw2->rkey = rkey2;
	memcpy(buf + 8, "window-2", 8);
	CHECK(rdma(qa, mr, IBV_WR_RDMA_WRITE, buf + 8, buf + 2048, rkey2) == 0, "WRITE posted");
	wc = one(cqa);
	CHECK(wc.status == IBV_WC_SUCCESS && memcmp(buf + 2048, "window-2", 8) == 0,
	      "WRITE through the type 2 window: status %d", wc.status);

	/* IBV_WR_LOCAL_INV. */
	struct ibv_send_wr inv = { .wr_id = 13, .opcode = IBV_WR_LOCAL_INV,
		.send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = rkey2 };
	CHECK(ibv_post_send(qp, &inv, &bad) == 0, "IBV_WR_LOCAL_INV posted");
	wc = one(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV && wc.wr_id == 13,
	      "LOCAL_INV completion: status %d opcode %d", wc.status, wc.opcode);

	/* Bound again, then invalidated by a SEND_WITH_INV the QP receives. */
	rkey2 = ibv_inc_rkey(rkey2);
	bw.bind_mw.rkey = rkey2;
	CHECK(ibv_post_send(qp, &bw, &bad) == 0 && one(cq).status == IBV_WC_SUCCESS,
	      "bound again");
	mw2->rkey = rkey2;
	struct ibv_sge rs = { .addr = (uintptr_t)buf + 64, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 14, .sg_list = &rs, .num_sge = 1 }, *rbad;
	struct ibv_sge ss = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 15, .sg_list = &ss, .num_sge = 1,
		.opcode = IBV_WR_SEND_WITH_INV, .send_flags = IBV_SEND_SIGNALED,
		.invalidate_rkey = rkey2 };
	CHECK(ibv_post_recv(qp, &rw, &rbad) == 0 && ibv_post_send(qa, &sw, &bad) == 0,
	      "SEND_WITH_INV posted");
	wc = one(cq);
	CHECK(wc.wr_id == 14 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
	      (wc.wc_flags & inv_flag) && wc.invalidated_rkey == rkey2,
	      "the receive: status %d flags %#x invalidated_rkey %#x (want %#x)", wc.status,
	      wc.wc_flags, wc.invalidated_rkey, rkey2);
	wc = one(cqa);
	CHECK(wc.wr_id == 15 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND,
	      "the send: status %d opcode %d", wc.status, wc.opcode);

	/* A bound type 1 window is deallocated. */
	CHECK(ibv_dealloc_mw(mw1) == 0, "ibv_dealloc_mw of a bound window");

	/* The invalidated window refuses access; the QP goes to ERR. */
	CHECK(rdma(qa, mr, IBV_WR_RDMA_WRITE, buf, buf + 2048, rkey2) == 0, "WRITE posted");
	wc = one(cqa);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR,
	      "WRITE through the invalidated window: status %d", wc.status);
	CHECK(ibv_destroy_qp(qa) == 0 && ibv_destroy_qp(qp) == 0 && ibv_dealloc_mw(mw2) == 0,
	      "cleanup");
	ibv_destroy_cq(cqa);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
}

/* ibv_wr_bind_mw, ibv_wr_local_inv, ibv_wr_send_inv and ibv_wc_read_invalidated_rkey. */
static void wr_api(void)
{
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
				       IBV_ACCESS_MW_BIND);
	struct ibv_cq_init_attr_ex ca = { .cqe = 64, .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &ca);
	struct ibv_cq *cq = cqx ? ibv_cq_ex_to_cq(cqx) : NULL;
	struct ibv_qp *qp = mr && cq ? self_qp(cq, IBV_QP_EX_WITH_RDMA_READ |
					       IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW |
					       IBV_QP_EX_WITH_SEND_WITH_INV) : NULL;
	struct ibv_qp_ex *qx = qp ? ibv_qp_to_qp_ex(qp) : NULL;
	struct ibv_mw *mw = qx ? ibv_alloc_mw(pd, IBV_MW_TYPE_2) : NULL;
	CHECK(mw != NULL, "an extended CQ, a QP with the window operations, a type 2 window");
	if (!mw)
		return;
	struct ibv_wc wc;
	uint32_t rkey = ibv_inc_rkey(mw->rkey);
	struct ibv_mw_bind_info info = { .mr = mr, .addr = (uintptr_t)buf + 1024, .length = 512,
		.mw_access_flags = IBV_ACCESS_REMOTE_READ };
	ibv_wr_start(qx);
	qx->wr_id = 21;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(qx, mw, rkey, &info);
	qx->wr_id = 22;
	ibv_wr_rdma_read(qx, rkey, (uintptr_t)buf + 1024);
	ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf, 8);
	memcpy(buf + 1024, "wr-bind!", 8);
	CHECK(ibv_wr_complete(qx) == 0, "ibv_wr_bind_mw and a READ through it");
	wc = one(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 21,
	      "bind: status %d opcode %d", wc.status, wc.opcode);
	wc = one(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 22 && memcmp(buf, "wr-bind!", 8) == 0,
	      "READ: status %d", wc.status);
	mw->rkey = rkey;

	ibv_wr_start(qx);
	qx->wr_id = 23;
	ibv_wr_local_inv(qx, rkey);
	CHECK(ibv_wr_complete(qx) == 0, "ibv_wr_local_inv");
	wc = one(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV,
	      "LOCAL_INV: status %d opcode %d", wc.status, wc.opcode);

	rkey = ibv_inc_rkey(rkey);
	struct ibv_sge rs = { .addr = (uintptr_t)buf + 64, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 24, .sg_list = &rs, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(qp, &rw, &rbad) == 0, "a receive");
	ibv_wr_start(qx);
	qx->wr_id = 25;
	qx->wr_flags = 0;
	ibv_wr_bind_mw(qx, mw, rkey, &info);
	qx->wr_id = 26;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_inv(qx, rkey);
	ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf, 8);
	CHECK(ibv_wr_complete(qx) == 0, "an unsignaled bind and ibv_wr_send_inv");
	/* Both completions, through the extended CQ's interface. */
	int seen = 0;
	for (int i = 0; i < 2; i++) {
		struct ibv_poll_cq_attr pa = {};
		int ret;
		time_t end = time(NULL) + 10;
		while ((ret = ibv_start_poll(cqx, &pa)) == ENOENT && time(NULL) < end)
			;
		if (ret) {
			CHECK(0, "a completion: %d", ret);
			break;
		}
		if (cqx->wr_id == 24) {
			uint32_t got = ibv_wc_read_invalidated_rkey(cqx);
			CHECK(cqx->status == IBV_WC_SUCCESS &&
			      (ibv_wc_read_wc_flags(cqx) & inv_flag) && got == rkey,
			      "the receive: status %d, invalidated_rkey %#x (want %#x)",
			      cqx->status, got, rkey);
		} else {
			CHECK(cqx->wr_id == 26 && cqx->status == IBV_WC_SUCCESS,
			      "the send: wr_id %lu status %d", (unsigned long)cqx->wr_id,
			      cqx->status);
		}
		seen |= cqx->wr_id == 24 ? 1 : 2;
		ibv_end_poll(cqx);
	}
	CHECK(seen == 3, "both completions");
	ibv_destroy_qp(qp);
	ibv_dealloc_mw(mw);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
}

/* ibv_resize_cq: three flushed receives stay through a resize, in order. */
static void resize(void)
{
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	CHECK(cq && ibv_resize_cq(cq, 1) == 0 && cq->cqe >= 1, "shrunk while empty: cqe %d",
	      cq ? cq->cqe : -1);
	CHECK(ibv_resize_cq(cq, 4) == 0 && cq->cqe >= 4, "grown: cqe %d", cq->cqe);
	CHECK(ibv_resize_cq(cq, 0) == EINVAL, "cqe 0 refused");
	struct ibv_qp *qp = mr ? self_qp(cq, 0) : NULL;
	CHECK(qp != NULL, "a QP on it");
	if (!qp)
		return;
	struct ibv_sge rs = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	for (uint64_t id = 1; id <= 3; id++) {
		struct ibv_recv_wr rw = { .wr_id = id, .sg_list = &rs, .num_sge = 1 }, *rbad;
		CHECK(ibv_post_recv(qp, &rw, &rbad) == 0, "receive %lu", (unsigned long)id);
	}
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	CHECK(ibv_modify_qp(qp, &err, IBV_QP_STATE) == 0, "to ERR: three flushed receives");
	CHECK(ibv_resize_cq(cq, 2) == EINVAL, "fewer than it holds refused");
	CHECK(ibv_resize_cq(cq, 16) == 0 && cq->cqe >= 16, "grown with three held: cqe %d",
	      cq->cqe);
	for (uint64_t id = 1; id <= 3; id++) {
		struct ibv_wc wc = one(cq);
		CHECK(wc.wr_id == id && wc.status == IBV_WC_WR_FLUSH_ERR,
		      "completion %lu: wr_id %lu status %d", (unsigned long)id,
		      (unsigned long)wc.wr_id, wc.status);
	}
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
}

/* ibv_rereg_mr where the device has it, and its refusal where not. */
static void rereg(int served)
{
	static char a[4096], b[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, a, sizeof(a), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	CHECK(mr && pd2, "a region and a second PD");
	if (!mr || !pd2)
		return;
	CHECK(ibv_rereg_mr(mr, 1 << 5, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT &&
	      errno == EINVAL, "unknown flag refused");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 0, 0) ==
	      IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "new translation without memory refused");
	int r = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!served) {
		CHECK(r == IBV_REREG_MR_ERR_CMD && errno == EOPNOTSUPP,
		      "refused as rxe refuses: %d", r);
		CHECK(mr->addr == a && mr->pd == pd, "the region stays");
	} else {
		CHECK(r == 0, "access changed");
		r = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD, pd2,
				 b, sizeof(b), 0);
		CHECK(r == 0 && mr->addr == b && mr->length == sizeof(b) && mr->pd == pd2,
		      "moved to new memory and PD: %d", r);
		CHECK(ibv_dealloc_pd(pd2) == EBUSY, "the new PD holds the region");
	}
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd2) == 0, "cleanup");
}

int main(int argc, char **argv)
{
	const char *kind = argc > 1 ? argv[1] : "portable";
	int served = strcmp(kind, "mlx5") == 0;
	if (strcmp(kind, "rxe") == 0)
		inv_flag = IBV_WC_IP_CSUM_OK;
	struct ibv_device **list = ibv_get_device_list(NULL);
	ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd) {
		printf("FAIL no device, context or PD\n");
		return 1;
	}
	windows();
	wr_api();
	resize();
	rereg(served);
	printf("%d failed\n", failures);
	return failures;
}
