/* What the C checks that send UD datagrams share (mcast.c, fork.c): a device opened with a
 * PD, a CQ and a registered buffer of 16 KiB, a UD QP in RTS, a receive into a 1 KiB slot
 * of the buffer, and a multicast group of the run. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define QKEY 0x11111111
#define MLID 0xc001

struct dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
};

static __attribute__((unused)) int open_dev(struct ibv_device *d, struct dev *o)
{
	o->ctx = ibv_open_device(d);
	if (!o->ctx)
		return -1;
	o->pd = ibv_alloc_pd(o->ctx);
	o->cq = ibv_create_cq(o->ctx, 64, NULL, NULL, 0);
	o->buf = calloc(1, 16384);
	o->mr = o->pd ? ibv_reg_mr(o->pd, o->buf, 16384, IBV_ACCESS_LOCAL_WRITE) : NULL;
	return o->pd && o->cq && o->mr ? 0 : -1;
}

/* A UD QP of `o` with Q_Key QKEY, in RTS. */
static __attribute__((unused)) struct ibv_qp *ud_qp(struct dev *o)
{
	struct ibv_qp_init_attr ia = { .send_cq = o->cq, .recv_cq = o->cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 16, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(o->pd, &ia);
	if (!qp)
		return NULL;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		return NULL;
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return NULL;
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		return NULL;
	return qp;
}

/* A receive into slot `slot` (1 KiB at buf + slot * 1024), `slot` its wr_id. */
static __attribute__((unused)) int post_recv(struct dev *o, struct ibv_qp *qp, int slot)
{
	struct ibv_sge s = { .addr = (uintptr_t)o->buf + slot * 1024, .length = 1024,
		.lkey = o->mr->lkey };
	struct ibv_recv_wr w = { .wr_id = slot, .sg_list = &s, .num_sge = 1 }, *bad;
	return ibv_post_recv(qp, &w, &bad);
}

/* A group of this run: ::ffff:239.x.y.z (RoCE over IPv4) or ff12:401b::x. */
static __attribute__((unused)) union ibv_gid group(int roce)
{
	union ibv_gid mgid = { .raw = { 0 } };
	unsigned pid = getpid();
	if (roce) {
		mgid.raw[10] = mgid.raw[11] = 0xff;
		mgid.raw[12] = 239;
		mgid.raw[13] = pid >> 16;
		mgid.raw[14] = pid >> 8;
		mgid.raw[15] = pid;
	} else {
		mgid.raw[0] = 0xff;
		mgid.raw[1] = 0x12;
		mgid.raw[2] = 0x40;
		mgid.raw[3] = 0x1b;
		memcpy(mgid.raw + 12, &pid, 4);
	}
	return mgid;
}
