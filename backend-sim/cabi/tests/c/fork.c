/* Devices opened after fork (tests/fork.rs runs this under each profile): the parent
 * opens a device, then forks two children that each open the same device of the list.
 * As a child's ibv_open_device on a real HCA, each gets a device of its own, at an
 * address of its own (neither the parent's nor the other child's), with QP numbers and
 * keys drawn at random in each (not the same draws in both), and a datagram one child
 * sends to a multicast group reaches the other child's member of the group. The parent's
 * device still carries its own datagrams after the children are gone. Prints one line
 * per check and exits with the number of failed checks. */
#include <poll.h>
#include <sys/wait.h>
#include "check.h"
#include "ud.h"

#define RECVS 8

/* Where a device is reached: its LID and its GID 1; and what it drew: a QP's number and
 * an MR's rkey. */
struct where {
	uint16_t lid;
	union ibv_gid gid;
	uint32_t qpn, rkey;
};

/* Opens `d` as open_dev does; where it is reached and its MR's rkey in `w`. */
static int open_at(struct ibv_device *d, struct dev *o, struct where *w)
{
	struct ibv_port_attr port;
	memset(w, 0, sizeof(*w));
	if (open_dev(d, o) || ibv_query_port(o->ctx, 1, &port) || ibv_query_gid(o->ctx, 1, 1, &w->gid))
		return -1;
	w->lid = port.lid;
	w->rkey = o->mr->rkey;
	return 0;
}

static int same_place(const struct where *a, const struct where *b)
{
	return a->lid == b->lid && !memcmp(a->gid.raw, b->gid.raw, 16);
}

/* Posts the 12-byte message at buf + 8192 from `qp` to QP `qpn` behind `ah`. */
static int post_send(struct dev *o, struct ibv_qp *qp, struct ibv_ah *ah, uint32_t qpn)
{
	struct ibv_sge sge = { .addr = (uintptr_t)o->buf + 8192, .length = 12, .lkey = o->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 100, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = QKEY;
	return ibv_post_send(qp, &wr, &bad);
}

/* An address handle to the group or device at `gid`/`lid`. */
static struct ibv_ah *ah_to(struct dev *o, const union ibv_gid *gid, uint16_t lid)
{
	struct ibv_ah_attr aa = { .is_global = 1, .dlid = lid, .port_num = 1,
		.grh = { .dgid = *gid, .sgid_index = 1, .hop_limit = 2 } };
	return ibv_create_ah(o->pd, &aa);
}

/* Polls for a received message on `qp` for up to `ms` milliseconds: 1 if one came, with
 * `expect` as its payload behind the GRH (send completions are passed over). */
static int receive(struct dev *o, struct ibv_qp *qp, const char *expect, int ms)
{
	for (int waited = 0; waited < ms; waited++) {
		struct ibv_wc wc;
		int r = ibv_poll_cq(o->cq, 1, &wc);
		if (r > 0 && wc.qp_num == qp->qp_num && wc.opcode == IBV_WC_RECV) {
			if (wc.status == IBV_WC_SUCCESS &&
			    !memcmp(o->buf + wc.wr_id * 1024 + 40, expect, 12))
				return 1;
			post_recv(o, qp, wc.wr_id);
		} else if (r == 0) {
			usleep(1000);
		}
	}
	return 0;
}

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1;
}

/* A child's open of `d` (the child `who` exits if it fails), checked to be a device of
 * its own. */
static void child_open(const char *who, struct ibv_device *d, struct dev *o, struct where *me,
		       const struct where *parent)
{
	if (open_at(d, o, me)) {
		CHECK(0, "%s: open the device", who);
		_exit(1);
	}
	CHECK(!same_place(me, parent), "%s: a device of its own, not the parent's (LID %u)", who,
	      me->lid);
}

/* The receiving child: joins the group, tells the sender where it is (`ready`), and
 * waits for the group's datagram; tells the sender it came (`done`). */
static void receiver(struct ibv_device *d, const struct where *parent, union ibv_gid mgid,
		     int ready, int done)
{
	struct dev o;
	struct where me;
	child_open("receiver", d, &o, &me, parent);
	struct ibv_qp *qp = ud_qp(&o);
	CHECK(qp && ibv_attach_mcast(qp, &mgid, MLID) == 0, "receiver: join the group");
	me.qpn = qp ? qp->qp_num : 0;
	for (int i = 0; qp && i < RECVS; i++)
		post_recv(&o, qp, i);
	CHECK(write(ready, &me, sizeof(me)) == sizeof(me), "receiver: ready");
	int got = qp && receive(&o, qp, "from a child", 20000);
	CHECK(got, "receiver: the other child's datagram to the group came");
	char one = got;
	CHECK(write(done, &one, 1) == 1, "receiver: done");
	_exit(failures);
}

/* The sending child: sends to the group every 50 ms until the receiver has it, polling
 * the send completions so that the send queue never fills. */
static void sender(struct ibv_device *d, const struct where *parent, union ibv_gid mgid,
		   int ready, int done)
{
	struct dev o;
	struct where me, peer;
	child_open("sender", d, &o, &me, parent);
	struct ibv_qp *qp = ud_qp(&o);
	struct ibv_ah *ah = ah_to(&o, &mgid, MLID);
	CHECK(qp && ah, "sender: a UD QP and an address handle to the group");
	me.qpn = qp ? qp->qp_num : 0;
	int heard = readable(ready, 20000) && read(ready, &peer, sizeof(peer)) == sizeof(peer);
	CHECK(heard, "sender: the receiver is ready");
	if (!heard)
		_exit(failures);
	CHECK(!same_place(&me, &peer), "sender: not the receiver's device (LID %u and %u)", me.lid,
	      peer.lid);
	CHECK(me.qpn != peer.qpn && me.rkey != peer.rkey,
	      "sender: its QP number and rkey are not the receiver's (%#x %#x and %#x %#x)", me.qpn,
	      me.rkey, peer.qpn, peer.rkey);
	memcpy(o.buf + 8192, "from a child", 12);
	int sent = 0;
	for (int i = 0; qp && ah && i < 400 && !readable(done, 50); i++) {
		struct ibv_wc wc[16];
		while (ibv_poll_cq(o.cq, 16, wc) > 0)
			;
		sent += post_send(&o, qp, ah, 0xffffff) == 0;
	}
	char one = 0;
	CHECK(sent > 0 && read(done, &one, 1) == 1 && one == 1, "sender: the receiver has it (%d sent)",
	      sent);
	_exit(failures);
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct dev p;
	struct where parent;
	if (n < 1 || open_at(list[0], &p, &parent)) {
		printf("FAIL setup: %d devices\n", n);
		return 1;
	}
	struct ibv_port_attr port;
	ibv_query_port(p.ctx, 1, &port);
	union ibv_gid mgid = group(port.link_layer == IBV_LINK_LAYER_ETHERNET);

	int ready[2], done[2];
	if (pipe(ready) || pipe(done)) {
		printf("FAIL setup: pipes\n");
		return 1;
	}
	fflush(stdout);
	pid_t r = fork();
	if (r == 0)
		receiver(list[0], &parent, mgid, ready[1], done[1]);
	pid_t s = fork();
	if (s == 0)
		sender(list[0], &parent, mgid, ready[0], done[0]);
	int rs = -1, ss = -1;
	waitpid(r, &rs, 0);
	waitpid(s, &ss, 0);
	CHECK(r > 0 && WIFEXITED(rs) && WEXITSTATUS(rs) == 0, "the receiving child passed (%#x)", rs);
	CHECK(s > 0 && WIFEXITED(ss) && WEXITSTATUS(ss) == 0, "the sending child passed (%#x)", ss);

	/* The parent's device, untouched by its children: a datagram to itself. */
	struct ibv_qp *a = ud_qp(&p), *b = ud_qp(&p);
	struct ibv_ah *ah = ah_to(&p, &parent.gid, parent.lid);
	CHECK(a && b && ah, "parent: UD QPs and an address handle to its device");
	if (a && b && ah) {
		post_recv(&p, b, 0);
		memcpy(p.buf + 8192, "from parent!", 12);
		CHECK(post_send(&p, a, ah, b->qp_num) == 0 && receive(&p, b, "from parent!", 10000),
		      "parent: its device still carries its datagrams");
	}
	printf("%d failed\n", failures);
	return failures;
}
