/* ibv_get_cq_event and ibv_get_async_event meet signals as libibverbs' read(2) of the
 * descriptor does (tests/signals.rs runs this with libibverbs_sim.so preloaded): a signal
 * whose handler was installed without SA_RESTART interrupts the wait (-1, EINTR), one
 * with SA_RESTART lets the wait go on until the event, and a descriptor made
 * O_NONBLOCK answers EAGAIN at once, every time. A helper thread sends the signal only
 * once the main thread is blocked waiting on the descriptor (as /proc says), so what
 * is checked is the wait's answer, not a race with the signal. Prints one line per
 * check and exits with the number of failed checks. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"

static atomic_int handled;
static pid_t main_tid;
static pthread_t main_thread;

static void on_alarm(int sig)
{
	(void)sig;
	atomic_fetch_add(&handled, 1);
}

static void install(int flags)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, NULL);
}

static void sleep_ms(int ms)
{
	struct timespec t = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
	nanosleep(&t, NULL);
}

/* Whether the main thread is blocked waiting on `fd` now: in read(2) of it, as
 * libibverbs waits, or in poll(2)/ppoll(2) of a set that holds it, as the sim's
 * ibv_get_cq_event waits on the channel and its device's connections (its answer to a
 * signal is still read(2)'s). The set is read through /proc/self/mem: the main thread
 * owns that memory. */
static int main_waits(int fd)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)main_tid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	long nr = -1;
	unsigned long arg0 = ~0UL, arg1 = 0;
	int n = fgets(line, sizeof(line), f) ? sscanf(line, "%ld %lx %lx", &nr, &arg0, &arg1) : 0;
	fclose(f);
	if (n >= 2 && nr == SYS_read)
		return arg0 == (unsigned long)fd;
	int polls = 0;
#ifdef SYS_poll
	polls |= nr == SYS_poll;
#endif
	polls |= nr == SYS_ppoll;
	if (n < 3 || !polls || arg1 > 4096)
		return 0;
	struct pollfd fds[4096];
	int mem = open("/proc/self/mem", O_RDONLY);
	if (mem < 0)
		return 0;
	ssize_t got = pread(mem, fds, arg1 * sizeof(fds[0]), (off_t)arg0);
	close(mem);
	for (unsigned long i = 0; got == (ssize_t)(arg1 * sizeof(fds[0])) && i < arg1; i++)
		if (fds[i].fd == fd && fds[i].events & POLLIN)
			return 1;
	return 0;
}

/* Waits (at most 10 s) until the main thread blocks waiting on `fd`. */
static int wait_main_reads(int fd)
{
	for (int i = 0; i < 10000; i++) {
		if (main_waits(fd))
			return 1;
		sleep_ms(1);
	}
	return 0;
}

/* What the helper thread does while the main thread waits for an event. */
struct helper {
	int fd;			/* the descriptor the main thread should read */
	int restart;		/* SA_RESTART: make the event after the signal */
	void (*make_event)(void);
	atomic_int done;	/* the main thread's wait returned */
	int saw_read;		/* the main thread blocked waiting on fd */
	int saw_restart;	/* ... and again after the handler ran */
	pthread_t thread;
};

static void *helper_main(void *arg)
{
	struct helper *h = arg;
	h->saw_read = wait_main_reads(h->fd);
	int before = atomic_load(&handled);
	pthread_kill(main_thread, SIGALRM);
	if (h->restart) {
		while (atomic_load(&handled) == before)
			sleep_ms(1);
		h->saw_restart = wait_main_reads(h->fd);
		h->make_event();
	}
	/* A wait that ignores the signal would hang the program: end it. */
	for (int i = 0; i < 5000 && !atomic_load(&h->done); i++)
		sleep_ms(1);
	if (!atomic_load(&h->done)) {
		printf("FAIL the wait did not return within 5 s of the signal (waiting on it: %d)\n",
		       h->saw_read);
		fflush(stdout);
		_exit(100);
	}
	return NULL;
}

static void start_helper(struct helper *h, int fd, int restart, void (*make_event)(void))
{
	memset(h, 0, sizeof(*h));
	h->fd = fd;
	h->restart = restart;
	h->make_event = make_event;
	install(restart ? SA_RESTART : 0);
	sigset_t all, old;
	/* The helper never takes the signal itself. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	pthread_create(&h->thread, NULL, helper_main, h);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* The main thread's wait returned: the helper ends before the next check starts. */
static void end_helper(struct helper *h)
{
	atomic_store(&h->done, 1);
	pthread_join(h->thread, NULL);
}

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_comp_channel *ch;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static char buf[64];

/* A completion: a signaled RDMA WRITE of the QP to itself. */
static void make_completion(void)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + 32, .rkey = mr->rkey } }, *bad;
	if (ibv_post_send(qp, &wr, &bad))
		printf("post_send failed: %s\n", strerror(errno));
}

/* An asynchronous event: the QP drains its (empty) send queue in SQD. */
static void make_async_event(void)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_SQD, .en_sqd_async_notify = 1 };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY))
		printf("modify to SQD failed: %s\n", strerror(errno));
}

static int back_to_rts(void)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

static void cq_event_interrupted(void)
{
	ibv_req_notify_cq(cq, 0);
	struct helper h;
	start_helper(&h, ch->fd, 0, NULL);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	errno = 0;
	int r = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	int e = errno;
	end_helper(&h);
	errno = e;
	CHECK(h.saw_read, "ibv_get_cq_event waits on the channel's fd");
	CHECK(r == -1 && e == EINTR, "ibv_get_cq_event without SA_RESTART: %d", r);
}

static void cq_event_restarted(void)
{
	struct helper h;
	start_helper(&h, ch->fd, 1, make_completion);
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx;
	int r = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	end_helper(&h);
	CHECK(h.saw_restart, "the read goes on after the handler (SA_RESTART)");
	CHECK(r == 0 && ev_cq == cq, "ibv_get_cq_event with SA_RESTART: %d", r);
	if (r == 0)
		ibv_ack_cq_events(cq, 1);
	struct ibv_wc wc;
	int n = 0;
	for (int i = 0; i < 5000 && n == 0; i++) {
		n = ibv_poll_cq(cq, 1, &wc);
		if (n == 0)
			sleep_ms(1);
	}
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS, "the WRITE completed: %d", n);
}

static void async_event_interrupted(void)
{
	struct helper h;
	start_helper(&h, ctx->async_fd, 0, NULL);
	struct ibv_async_event ev;
	errno = 0;
	int r = ibv_get_async_event(ctx, &ev);
	int e = errno;
	end_helper(&h);
	errno = e;
	CHECK(h.saw_read, "ibv_get_async_event waits in read(2) of async_fd");
	CHECK(r == -1 && e == EINTR, "ibv_get_async_event without SA_RESTART: %d", r);
}

static void async_event_restarted(void)
{
	struct helper h;
	start_helper(&h, ctx->async_fd, 1, make_async_event);
	struct ibv_async_event ev = { 0 };
	int r = ibv_get_async_event(ctx, &ev);
	end_helper(&h);
	CHECK(h.saw_restart, "the read goes on after the handler (SA_RESTART)");
	CHECK(r == 0 && ev.event_type == IBV_EVENT_SQ_DRAINED && ev.element.qp == qp,
	      "ibv_get_async_event with SA_RESTART: %d, event %d", r, ev.event_type);
	if (r == 0)
		ibv_ack_async_event(&ev);
	CHECK(back_to_rts() == 0, "SQD -> RTS");
}

static void non_blocking(void)
{
	install(0);
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
	ibv_req_notify_cq(cq, 0);
	for (int i = 0; i < 3; i++) {
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		struct ibv_async_event ev;
		errno = 0;
		int r = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
		CHECK(r == -1 && errno == EAGAIN, "ibv_get_cq_event on O_NONBLOCK: %d", r);
		errno = 0;
		r = ibv_get_async_event(ctx, &ev);
		CHECK(r == -1 && errno == EAGAIN, "ibv_get_async_event on O_NONBLOCK: %d", r);
	}
	CHECK(atomic_load(&handled) == 4, "only the helpers signalled: %d", atomic_load(&handled));
}

int main(void)
{
	main_tid = (pid_t)syscall(SYS_gettid);
	main_thread = pthread_self();
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0]) {
		printf("FAIL no device\n");
		return 1;
	}
	ctx = ibv_open_device(list[0]);
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	ch = ctx ? ibv_create_comp_channel(ctx) : NULL;
	cq = ch ? ibv_create_cq(ctx, 16, NULL, ch, 0) : NULL;
	mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE |
						 IBV_ACCESS_REMOTE_WRITE) : NULL;
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 } };
	qp = (pd && cq) ? ibv_create_qp(pd, &qa) : NULL;
	if (!mr || !qp || self_connect(ctx, qp)) {
		printf("FAIL setup: %s\n", strerror(errno));
		return 1;
	}
	cq_event_interrupted();
	cq_event_restarted();
	async_event_interrupted();
	async_event_restarted();
	non_blocking();
	printf("%d failed\n", failures);
	return failures;
}
