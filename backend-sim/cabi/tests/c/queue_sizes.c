/* Prints the sizes the first device gives the queues it is asked for (tests/answers.rs
 * runs it under each profile and compares the lines with what rxe0 printed in CI's VM):
 * the cqe of ibv_create_cq and ibv_resize_cq, the cap ibv_create_qp hands back and the
 * one ibv_query_qp reports, the max_wr ibv_create_srq hands back and the one
 * ibv_query_srq reports after create and after ibv_modify_srq. */
#include <string.h>

#include "check.h"

static void cq_sizes(struct ibv_context *ctx, int asked)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, asked, NULL, NULL, 0);
	CHECK(cq != NULL, "ibv_create_cq");
	if (!cq)
		return;
	int created = cq->cqe;
	int resized = asked * 2 + 1;
	CHECK(ibv_resize_cq(cq, resized) == 0, "ibv_resize_cq");
	printf("cq %d cqe %d resize %d cqe %d\n", asked, created, resized, cq->cqe);
	ibv_destroy_cq(cq);
}

static void print_cap(const char *what, const struct ibv_qp_cap *c)
{
	printf(" %s %u/%u/%u/%u/%u", what, c->max_send_wr, c->max_recv_wr, c->max_send_sge,
	       c->max_recv_sge, c->max_inline_data);
}

static void qp_sizes(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_srq *srq,
		     struct ibv_qp_cap asked)
{
	struct ibv_qp_init_attr init;
	memset(&init, 0, sizeof(init));
	init.send_cq = cq;
	init.recv_cq = cq;
	init.srq = srq;
	init.qp_type = IBV_QPT_RC;
	init.cap = asked;
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp != NULL, "ibv_create_qp");
	if (!qp)
		return;
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr qinit;
	memset(&attr, 0, sizeof(attr));
	memset(&qinit, 0, sizeof(qinit));
	CHECK(ibv_query_qp(qp, &attr, IBV_QP_CAP, &qinit) == 0, "ibv_query_qp");
	printf("qp%s", srq ? " srq" : "");
	print_cap("asked", &asked);
	print_cap("created", &init.cap);
	print_cap("queried", &attr.cap);
	printf("\n");
	ibv_destroy_qp(qp);
}

static struct ibv_srq *srq_sizes(struct ibv_pd *pd, unsigned asked)
{
	struct ibv_srq_init_attr init;
	memset(&init, 0, sizeof(init));
	init.attr.max_wr = asked;
	init.attr.max_sge = 1;
	struct ibv_srq *srq = ibv_create_srq(pd, &init);
	CHECK(srq != NULL, "ibv_create_srq");
	if (!srq)
		return NULL;
	struct ibv_srq_attr q;
	memset(&q, 0, sizeof(q));
	CHECK(ibv_query_srq(srq, &q) == 0, "ibv_query_srq");
	unsigned queried = q.max_wr;
	struct ibv_srq_attr m;
	memset(&m, 0, sizeof(m));
	m.max_wr = asked * 2 + 1;
	CHECK(ibv_modify_srq(srq, &m, IBV_SRQ_MAX_WR) == 0, "ibv_modify_srq");
	memset(&q, 0, sizeof(q));
	CHECK(ibv_query_srq(srq, &q) == 0, "ibv_query_srq");
	printf("srq %u created %u queried %u modify %u queried %u\n", asked, init.attr.max_wr,
	       queried, asked * 2 + 1, q.max_wr);
	return srq;
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "ibv_get_device_list");
	if (!list || n == 0) {
		printf("%d failed\n", failures);
		return failures;
	}
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL, "ibv_open_device");
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = ctx ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	CHECK(pd && cq, "ibv_alloc_pd, ibv_create_cq");
	if (pd && cq) {
		int cqs[] = {1, 2, 4, 8, 100};
		for (unsigned i = 0; i < sizeof(cqs) / sizeof(cqs[0]); i++)
			cq_sizes(ctx, cqs[i]);
		struct ibv_qp_cap caps[] = {
			{16, 4, 1, 1, 0}, {1, 1, 1, 1, 0}, {31, 32, 2, 3, 64}, {5, 6, 5, 1, 100},
		};
		for (unsigned i = 0; i < sizeof(caps) / sizeof(caps[0]); i++)
			qp_sizes(pd, cq, NULL, caps[i]);
		srq_sizes(pd, 1);
		struct ibv_srq *srq = srq_sizes(pd, 100);
		if (srq) {
			struct ibv_qp_cap on_srq = {3, 5, 1, 1, 0};
			qp_sizes(pd, cq, srq, on_srq);
			ibv_destroy_srq(srq);
		}
	}
	if (cq)
		ibv_destroy_cq(cq);
	if (pd)
		ibv_dealloc_pd(pd);
	if (ctx)
		ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("%d failed\n", failures);
	return failures;
}
