/* A port that goes down and comes back, for a C program (tests/port.rs runs this with
 * RDMA_SIM_PORT_DOWN=AFTER:FOR under each profile; man ibv_get_async_event, man
 * ibv_query_port): IBV_EVENT_PORT_ERR on port 1 and the port reads IBV_PORT_DOWN, a SEND
 * posted meanwhile on an RC QP connected to itself through GID 1 (timeout 16, retry_cnt 7: about two
 * seconds of retries), then IBV_EVENT_PORT_ACTIVE and IBV_PORT_ACTIVE. The SEND
 * completes SUCCESS and is received once (the port came back within its retries), or
 * with argument "fails" IBV_WC_LOC_QP_OP_ERR (rxe fails a send through a netdev that is
 * down). Prints one line per check and exits with the number of failed checks. */
#include <string.h>
#include "port_events.h"

int main(int argc, char **argv)
{
	int fails = argc > 1 && !strcmp(argv[1], "fails");
	struct self_qp s;
	CHECK(open_self_qp(&s) == 0, "open the device, an RC QP");
	if (!s.qp)
		return 1;
	CHECK(self_connect_global(s.ctx, s.qp) == 0, "an RC QP connected to itself");
	struct ibv_port_attr pa;

	int port = 0;
	int ev = next_event(s.ctx, 10000, &port);
	CHECK(ev == IBV_EVENT_PORT_ERR && port == 1, "IBV_EVENT_PORT_ERR on port 1 (got %d on %d)", ev, port);
	CHECK(ibv_query_port(s.ctx, 1, &pa) == 0 && pa.state == IBV_PORT_DOWN && pa.phys_state == 3,
	      "the port reads DOWN, phys_state DISABLED (%d, %d)", pa.state, pa.phys_state);

	CHECK(post_send_and_recv(s.qp, s.mr, s.buf) == 0, "post a SEND while the port is down");

	ev = next_event(s.ctx, 10000, &port);
	CHECK(ev == IBV_EVENT_PORT_ACTIVE && port == 1, "IBV_EVENT_PORT_ACTIVE on port 1 (got %d)", ev);
	CHECK(ibv_query_port(s.ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE && pa.phys_state == 5,
	      "the port reads ACTIVE, phys_state LINK_UP (%d, %d)", pa.state, pa.phys_state);

	struct ibv_wc wc[4];
	int got = poll_for(s.cq, wc, 2, 10000);
	if (fails) {
		CHECK(send_failed(wc, got, IBV_WC_LOC_QP_OP_ERR),
		      "the SEND fails LOC_QP_OP_ERR, the receive is flushed (%d: %s)", got,
		      got ? ibv_wc_status_str(wc[0].status) : "-");
	} else {
		CHECK(sent_and_received(wc, got, s.buf), "the SEND completes and is received once (%d: %s)", got,
		      got ? ibv_wc_status_str(wc[0].status) : "-");
		CHECK(poll_for(s.cq, wc, 1, 200) == 0, "nothing more");
	}
	printf("%d failed\n", failures);
	return failures;
}
