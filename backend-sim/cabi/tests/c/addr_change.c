/* A port whose address changes, for a C program (tests/addr_change.rs runs this with
 * RDMA_SIM_ADDR_CHANGE=AFTER:FOR; man ibv_get_async_event, man ibv_query_port, man
 * ibv_query_gid). With argument "ib" (an InfiniBand port): IBV_EVENT_LID_CHANGE on port 1
 * and ibv_query_port reads a new LID; a SEND on an RC QP connected to itself before the
 * change, whose address vector names the old LID, reaches nothing and ends
 * IBV_WC_RETRY_EXC_ERR; then another LID_CHANGE and another LID. With "roce" (an Ethernet
 * port): IBV_EVENT_GID_CHANGE and GID entry 2 (after the port's own two) holds a new
 * address; the QP connected through GID 1 is unaffected, its SEND completes and is
 * received; then GID_CHANGE again and entry 2 is empty. Prints one line per check and
 * exits with the number of failed checks. */
#include <string.h>
#include "port_events.h"

static int is_zero(const union ibv_gid *g)
{
	static const union ibv_gid zero;
	return !memcmp(g, &zero, sizeof(zero));
}

int main(int argc, char **argv)
{
	int ib = argc > 1 && !strcmp(argv[1], "ib");
	struct self_qp s;
	CHECK(open_self_qp(&s) == 0, "open the device, an RC QP");
	if (!s.qp)
		return 1;
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(s.ctx, 1, &pa) == 0, "query the port");
	uint16_t lid0 = pa.lid;
	union ibv_gid own, g;
	CHECK(ibv_query_gid(s.ctx, 1, 1, &own) == 0, "query GID 1");
	CHECK(self_connect_global(s.ctx, s.qp) == 0,
	      "an RC QP connected to itself");

	int port = 0;
	int ev = next_event(s.ctx, 10000, &port);
	if (ib) {
		CHECK(ev == IBV_EVENT_LID_CHANGE && port == 1, "IBV_EVENT_LID_CHANGE on port 1 (got %d on %d)", ev, port);
		CHECK(ibv_query_port(s.ctx, 1, &pa) == 0 && pa.lid != lid0 && pa.lid != 0 && pa.lid < 0xc000,
		      "a new unicast LID (%#x, was %#x)", pa.lid, lid0);
	} else {
		CHECK(ev == IBV_EVENT_GID_CHANGE && port == 1, "IBV_EVENT_GID_CHANGE on port 1 (got %d on %d)", ev, port);
		CHECK(ibv_query_gid(s.ctx, 1, 2, &g) == 0 && !is_zero(&g) && memcmp(&g, &own, sizeof(g)),
		      "GID entry 2 holds a new address");
		CHECK(ibv_query_port(s.ctx, 1, &pa) == 0 && pa.lid == 0, "LID 0 (%#x)", pa.lid);
	}
	uint16_t lid1 = pa.lid;

	CHECK(post_send_and_recv(s.qp, s.mr, s.buf) == 0, "post a SEND after the change");
	struct ibv_wc wc[4];
	int got = poll_for(s.cq, wc, 2, 10000);
	if (ib)
		CHECK(send_failed(wc, got, IBV_WC_RETRY_EXC_ERR),
		      "the SEND to the old LID ends RETRY_EXC_ERR, the receive is flushed (%d: %s)", got,
		      got ? ibv_wc_status_str(wc[0].status) : "-");
	else
		CHECK(sent_and_received(wc, got, s.buf), "the SEND through GID 1 completes and is received (%d: %s)",
		      got, got ? ibv_wc_status_str(wc[0].status) : "-");

	ev = next_event(s.ctx, 10000, &port);
	if (ib) {
		CHECK(ev == IBV_EVENT_LID_CHANGE && port == 1, "another IBV_EVENT_LID_CHANGE (got %d)", ev);
		CHECK(ibv_query_port(s.ctx, 1, &pa) == 0 && pa.lid != lid1 && pa.lid != 0,
		      "another LID (%#x, was %#x)", pa.lid, lid1);
	} else {
		CHECK(ev == IBV_EVENT_GID_CHANGE && port == 1, "another IBV_EVENT_GID_CHANGE (got %d)", ev);
		CHECK(ibv_query_gid(s.ctx, 1, 2, &g) == 0 && is_zero(&g), "GID entry 2 is empty again");
	}
	printf("%d failed\n", failures);
	return failures;
}
