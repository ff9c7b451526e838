/* Multicast through the preloaded library (man ibv_attach_mcast; tests/mcast.rs runs
 * this under each profile): the device reports its limits, attach and detach answer as
 * the kernel does (EINVAL for a unicast GID, an RC QP, an InfiniBand LID below 0xc000,
 * a pair never attached; attaching twice is fine), ibv_destroy_qp of an attached QP is
 * EBUSY, and a datagram to the group reaches the attached QPs of both devices, behind a
 * GRH flagged in the completion, from the sender's QP. Prints one line per check and
 * exits with the number of failed checks. */
#include <poll.h>
#include <time.h>
#include "check.h"
#include "ud.h"

/* Polls `o`'s CQ for 300 ms after the last completion (2 s for the first); how many came,
 * in `wcs`. */
static int drain(struct dev *o, struct ibv_wc *wcs, int max)
{
	int n = 0;
	for (int quiet = 0; quiet < (n ? 300 : 2000) && n < max; quiet++) {
		int r = ibv_poll_cq(o->cq, max - n, wcs + n);
		if (r > 0) {
			n += r;
			quiet = 0;
		} else {
			usleep(1000);
		}
	}
	return n;
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct dev a, b;
	if (n < 2 || open_dev(list[0], &a) || open_dev(list[1], &b)) {
		printf("FAIL setup: %d devices\n", n);
		return 1;
	}
	struct ibv_device_attr da;
	CHECK(ibv_query_device(a.ctx, &da) == 0 && da.max_mcast_grp > 0 &&
		      da.max_mcast_qp_attach > 0 && da.max_total_mcast_qp_attach >= da.max_mcast_qp_attach,
	      "limits %d %d %d", da.max_mcast_grp, da.max_mcast_qp_attach, da.max_total_mcast_qp_attach);
	struct ibv_port_attr port;
	ibv_query_port(a.ctx, 1, &port);
	int roce = port.link_layer == IBV_LINK_LAYER_ETHERNET;

	union ibv_gid mgid = group(roce);
	union ibv_gid unicast;
	ibv_query_gid(a.ctx, 1, 1, &unicast);

	struct ibv_qp *s = ud_qp(&a), *r1 = ud_qp(&a), *r2 = ud_qp(&b), *spare = ud_qp(&b);
	if (!s || !r1 || !r2 || !spare) {
		printf("FAIL setup: UD QPs\n");
		return 1;
	}
	CHECK(ibv_attach_mcast(r1, &unicast, MLID) == EINVAL, "a unicast GID");
	if (!roce)
		CHECK(ibv_attach_mcast(r1, &mgid, 0x10) == EINVAL, "a unicast LID");
	struct ibv_qp_init_attr rca = { .send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *rc = ibv_create_qp(a.pd, &rca);
	CHECK(rc && ibv_attach_mcast(rc, &mgid, MLID) == EINVAL, "an RC QP");
	if (rc)
		ibv_destroy_qp(rc);
	CHECK(ibv_attach_mcast(r1, &mgid, MLID) == 0, "attach");
	CHECK(ibv_attach_mcast(r1, &mgid, MLID) == 0, "attach again");
	CHECK(ibv_attach_mcast(r2, &mgid, MLID) == 0, "attach on the other device");
	CHECK(ibv_attach_mcast(spare, &mgid, MLID) == 0, "attach a QP to destroy");
	CHECK(ibv_detach_mcast(r1, &mgid, MLID + 1) == EINVAL, "detach a pair never attached");
	CHECK(ibv_destroy_qp(spare) == EBUSY, "destroy an attached QP");
	CHECK(ibv_detach_mcast(spare, &mgid, MLID) == 0 && ibv_destroy_qp(spare) == 0,
	      "detach, then destroy");

	struct ibv_ah_attr aa = { .is_global = 1, .dlid = MLID, .port_num = 1,
		.grh = { .dgid = mgid, .sgid_index = 1, .hop_limit = 2 } };
	struct ibv_ah *ah = ibv_create_ah(a.pd, &aa);
	CHECK(ah != NULL, "an address handle to the group");
	post_recv(&a, r1, 1);
	post_recv(&b, r2, 2);
	memcpy(a.buf + 8192, "to everyone", 12);
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf + 8192, .length = 12, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = 0xffffff;
	wr.wr.ud.remote_qkey = QKEY;
	CHECK(ah && ibv_post_send(s, &wr, &bad) == 0, "send to the group");
	struct ibv_wc wc[4];
	int got = drain(&a, wc, 4);
	int sent = 0, on_a = 0;
	for (int i = 0; i < got; i++) {
		if (wc[i].wr_id == 9)
			sent = wc[i].status == IBV_WC_SUCCESS;
		else if (wc[i].qp_num == r1->qp_num && wc[i].status == IBV_WC_SUCCESS &&
			 wc[i].src_qp == s->qp_num && (wc[i].wc_flags & IBV_WC_GRH) &&
			 wc[i].byte_len == 40 + 12 && !memcmp(a.buf + 1024 + 40, "to everyone", 12))
			on_a++;
	}
	CHECK(sent && on_a == 1, "the sender completes, its device's member receives (%d)", got);
	got = drain(&b, wc, 4);
	CHECK(got == 1 && wc[0].qp_num == r2->qp_num && wc[0].src_qp == s->qp_num &&
		      !memcmp(b.buf + 2048 + 40, "to everyone", 12),
	      "the other device's member receives (%d)", got);
	if (roce)
		CHECK(!memcmp(b.buf + 2048 + 36, mgid.raw + 12, 4), "to the group's IPv4 address");
	else
		CHECK(!memcmp(b.buf + 2048 + 24, mgid.raw, 16), "to the group's GID");
	CHECK(ibv_detach_mcast(r1, &mgid, MLID) == 0 && ibv_detach_mcast(r2, &mgid, MLID) == 0,
	      "detach");
	printf("%d failed\n", failures);
	return failures;
}
