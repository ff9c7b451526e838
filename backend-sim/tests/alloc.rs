//! The data path allocates nothing in its steady state (issue 5: "allocation-free steady
//! state"): once a connection is up and every operation has run a few times, posting,
//! transmitting, executing, answering and completing SEND/RECV (with immediate), RDMA
//! WRITE (with immediate), RDMA READ and both atomics, alone and in batches, moves no
//! byte through the heap on any thread of the process: not the application's, not the
//! progress threads', not the runtime's. The same holds for UD datagrams once the link
//! between the two devices is up: to the other device and back over the link (with and
//! without immediate, in a batch) and to a QP of the same device.
//!
//! A counting global allocator (this test file is its own binary) records every
//! allocation while the measured loop runs, and the backtrace of the first one, so a
//! regression names the line that allocates.
//!
//! Two things that are no part of the steady state are kept out of the count, each of
//! which made the test fail on a loaded host (4 CPU hogs on the 2-core machine: a debug
//! build's 2200 rounds took 80-130 s instead of 8):
//!
//! - The test harness: libtest's main thread, waiting for the test, lists the tests that
//!   have run for over 60 seconds, in a `Vec` it allocates, and that counted as an
//!   allocation of the process. This binary runs without it (`harness = false`, through
//!   libtest-mimic, whose main thread blocks on a channel while the test runs).
//! - Resends: under that load a round trip took longer than the default local ACK
//!   timeout (67 ms) now and then (8 resends in one run of 2200 rounds, with gaps of
//!   100-200 ms between rounds), and 8 timeouts in a row ended one run with
//!   `IBV_WC_RETRY_EXC_ERR`. A resend is the recovery path, not the steady state: the
//!   responder executes the repeated request again, and the requester builds it again
//!   (the allocations seen were a resent 64 KiB READ's scatter list being rebuilt; such
//!   a READ, resent while its response arrived, is no longer resent at all). The pair
//!   uses a timeout longer than the wait for any completion ([`WAIT`]), so no resend can
//!   come before a stall fails the wait, while the ACK timer is still armed and moved
//!   with every request as in the steady state (an infinite timeout would take that out
//!   of the count).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Trial};
use verbs_api::timers::local_ack_timeout;
use verbs_api::*;

mod common;
use common::Pair;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static FIRST: Mutex<Option<String>> = Mutex::new(None);

thread_local! {
    /// Set while this thread records a backtrace (which allocates itself).
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

impl Counting {
    fn note(&self) {
        if !COUNTING.load(Ordering::Relaxed) || IN_HOOK.get() {
            return;
        }
        if ALLOCS.fetch_add(1, Ordering::Relaxed) == 0 {
            IN_HOOK.set(true);
            let bt = std::backtrace::Backtrace::force_capture().to_string();
            if let Ok(mut f) = FIRST.lock() {
                f.get_or_insert(bt);
            }
            IN_HOOK.set(false);
        }
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator. The counting
// around it allocates only to record the backtrace of the run's first counted
// allocation; those nested allocations skip the counting (`IN_HOOK`) and go straight to
// the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.note();
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.note();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.note();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const WAIT: Duration = Duration::from_secs(10);
/// Local ACK timeout code of the pair: 17.2 s, beyond [`WAIT`] (see the module docs).
const ACK_TIMEOUT: u8 = 22;
/// Size and offset of the large payloads (both regions are twice as large).
const BIG: usize = 64 << 10;

/// Polls `cq` until `n` completions came, all successful (no allocation: a fixed array).
fn wait(cq: &impl CompletionQueue, n: usize, what: &str) {
    let mut wcs = [WorkCompletion::default(); 16];
    let mut got = 0;
    let t0 = Instant::now();
    while got < n {
        let k = cq.poll(&mut wcs).unwrap();
        for wc in &wcs[..k] {
            assert!(wc.is_ok(), "{what}: {:?}", wc.status);
        }
        got += k;
        assert!(
            t0.elapsed() < WAIT,
            "{what}: {got} of {n} completions after {WAIT:?}"
        );
    }
}

/// One round of every operation: SEND with and without immediate, WRITE with and
/// without immediate, READ, CMP_AND_SWP, FETCH_AND_ADD, a 64 KiB WRITE and READ (the
/// payloads that go straight between socket and region), and a batch of 8 WRITEs and 8
/// SENDs posted in one call each.
#[allow(clippy::too_many_arguments)]
fn round(
    i: u64,
    a: &impl QueuePair,
    b: &impl QueuePair,
    cq_a: &impl CompletionQueue,
    cq_b: &impl CompletionQueue,
    la: &impl MemoryRegion,
    lb: &impl MemoryRegion,
    remote: RemoteMr,
) {
    let src = [la.sge(0, 256).unwrap()];
    let small = [la.sge(0, 8).unwrap()];
    let old = [la.sge(4096, 8).unwrap()];
    let rx = [lb.sge(0, 256).unwrap()];
    let big = [la.sge(BIG, BIG).unwrap()];

    b.post_recv(&[RecvWr::new(i, &rx)]).unwrap();
    a.post_send(&[SendWr::send(i, &src).signaled()]).unwrap();
    wait(cq_a, 1, "send");
    wait(cq_b, 1, "recv");

    b.post_recv(&[RecvWr::new(i, &rx)]).unwrap();
    a.post_send(&[SendWr::send_with_imm(i, &small, i as u32).signaled()])
        .unwrap();
    wait(cq_a, 1, "send with imm");
    wait(cq_b, 1, "recv with imm");

    a.post_send(&[SendWr::write(i, &src, remote.at(0)).signaled()])
        .unwrap();
    wait(cq_a, 1, "write");

    b.post_recv(&[RecvWr::new(i, &[])]).unwrap();
    a.post_send(&[SendWr::write_with_imm(i, &src, remote.at(256), i as u32).signaled()])
        .unwrap();
    wait(cq_a, 1, "write with imm");
    wait(cq_b, 1, "recv of write with imm");

    a.post_send(&[SendWr::read(i, &src, remote.at(512)).signaled()])
        .unwrap();
    wait(cq_a, 1, "read");

    a.post_send(&[SendWr::write(i, &big, remote.at(BIG as u64)).signaled()])
        .unwrap();
    wait(cq_a, 1, "64 KiB write");
    a.post_send(&[SendWr::read(i, &big, remote.at(BIG as u64)).signaled()])
        .unwrap();
    wait(cq_a, 1, "64 KiB read");

    a.post_send(&[SendWr::fetch_and_add(i, &old, remote.at(4096), 1).signaled()])
        .unwrap();
    wait(cq_a, 1, "fetch and add");
    a.post_send(&[SendWr::cmp_and_swp(i, &old, remote.at(4104), i, i + 1).signaled()])
        .unwrap();
    wait(cq_a, 1, "compare and swap");

    let writes: [SendWr<'_>; 8] = std::array::from_fn(|k| {
        let wr = SendWr::write(k as u64, &src, remote.at(1024 + 256 * k as u64));
        if k == 7 {
            wr.signaled()
        } else {
            wr
        }
    });
    a.post_send(&writes).unwrap();
    wait(cq_a, 1, "batch of writes");

    let recvs: [RecvWr<'_>; 8] = std::array::from_fn(|k| RecvWr::new(k as u64, &rx));
    b.post_recv(&recvs).unwrap();
    let sends: [SendWr<'_>; 8] = std::array::from_fn(|k| SendWr::send(k as u64, &small).signaled());
    a.post_send(&sends).unwrap();
    wait(cq_a, 8, "batch of sends");
    wait(cq_b, 8, "batch of recvs");
}

/// UD QPs on both devices of a pair, their CQs and the address handles between them.
struct Ud {
    ua: backend_sim::SimQp,
    ub: backend_sim::SimQp,
    cq_ua: backend_sim::SimCq,
    cq_ub: backend_sim::SimCq,
    /// sim0 → `ub`, sim1 → `ua`, sim1 → `ub` (the same device).
    ah_ab: backend_sim::SimAh,
    ah_ba: backend_sim::SimAh,
    ah_bb: backend_sim::SimAh,
}

const QKEY: u32 = 0x1111_1111;

impl Ud {
    fn new(p: &Pair) -> Ud {
        let up = |qp: &backend_sim::SimQp| {
            let m = QpAttrMask::STATE;
            let init = QpAttr {
                qp_state: QpState::Init,
                port_num: 1,
                qkey: QKEY,
                ..Default::default()
            };
            qp.modify(
                &init,
                m | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
            )
            .unwrap();
            let rtr = QpAttr {
                qp_state: QpState::Rtr,
                ..Default::default()
            };
            qp.modify(&rtr, m).unwrap();
            let rts = QpAttr {
                qp_state: QpState::Rts,
                ..Default::default()
            };
            qp.modify(&rts, m | QpAttrMask::SQ_PSN).unwrap();
        };
        let (cq_ua, cq_ub) = (
            p.c0.create_cq(64, None).unwrap(),
            p.c1.create_cq(64, None).unwrap(),
        );
        let ua = p
            .pd0
            .create_qp(&QpInitAttr::ud(&cq_ua, &cq_ua, QpCap::new(32, 32)))
            .unwrap();
        let ub = p
            .pd1
            .create_qp(&QpInitAttr::ud(&cq_ub, &cq_ub, QpCap::new(32, 32)))
            .unwrap();
        up(&ua);
        up(&ub);
        let rp = RcParams::default();
        let ea = local_endpoint(&p.c0, &ua, &rp, 0).unwrap();
        let eb = local_endpoint(&p.c1, &ub, &rp, 0).unwrap();
        Ud {
            ah_ab: p.pd0.create_ah(&ah_attr_for(&eb, &rp)).unwrap(),
            ah_ba: p.pd1.create_ah(&ah_attr_for(&ea, &rp)).unwrap(),
            ah_bb: p.pd1.create_ah(&ah_attr_for(&eb, &rp)).unwrap(),
            ua,
            ub,
            cq_ua,
            cq_ub,
        }
    }

    /// One round: a datagram sim0 → sim1, one with immediate back, one within sim1, and a
    /// batch of 8 sim0 → sim1.
    fn round(&self, i: u64, la: &impl MemoryRegion, lb: &impl MemoryRegion) {
        let src_a = [la.sge(8192, 256).unwrap()];
        let src_b = [lb.sge(8192, 64).unwrap()];
        let rx_a = [la.sge(16384, 40 + 256).unwrap()];
        let rx_b = [lb.sge(16384, 40 + 256).unwrap()];
        let (ua, ub) = (self.ua.qp_num(), self.ub.qp_num());

        self.ub.post_recv(&[RecvWr::new(i, &rx_b)]).unwrap();
        self.ua
            .post_send(&[SendWr::send(i, &src_a).signaled().ud(&self.ah_ab, ub, QKEY)])
            .unwrap();
        wait(&self.cq_ua, 1, "UD send");
        wait(&self.cq_ub, 1, "UD recv");

        self.ua.post_recv(&[RecvWr::new(i, &rx_a)]).unwrap();
        self.ub
            .post_send(&[SendWr::send_with_imm(i, &src_b, i as u32)
                .signaled()
                .ud(&self.ah_ba, ua, QKEY)])
            .unwrap();
        wait(&self.cq_ub, 1, "UD send with imm, back");
        wait(&self.cq_ua, 1, "UD recv with imm");

        self.ub.post_recv(&[RecvWr::new(i, &rx_b)]).unwrap();
        self.ub
            .post_send(&[SendWr::send(i, &src_b).signaled().ud(&self.ah_bb, ub, QKEY)])
            .unwrap();
        wait(&self.cq_ub, 2, "UD send and recv within a device");

        let recvs: [RecvWr<'_>; 8] = std::array::from_fn(|k| RecvWr::new(k as u64, &rx_b));
        self.ub.post_recv(&recvs).unwrap();
        let sends: [SendWr<'_>; 8] = std::array::from_fn(|k| {
            SendWr::send(k as u64, &src_a)
                .signaled()
                .ud(&self.ah_ab, ub, QKEY)
        });
        self.ua.post_send(&sends).unwrap();
        wait(&self.cq_ua, 8, "batch of UD sends");
        wait(&self.cq_ub, 8, "batch of UD recvs");
    }
}

/// `parking_lot` allocates its table of parked threads the first time a thread parks
/// on a lock, and grows it when more threads have parked than it has room for: once per
/// process, not per operation, but whenever the first contention happens to come. Have
/// 16 threads park at once so the table is at full size before the count starts.
fn size_the_parking_table() {
    let lock = parking_lot::Mutex::new(());
    let held = lock.lock();
    std::thread::scope(|s| {
        for _ in 0..16 {
            s.spawn(|| drop(lock.lock()));
        }
        // Longer than the lock's spinning before it parks (microseconds).
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
    });
}

fn main() {
    // Another process's `rdma-sim status` may connect to a device's control socket at any
    // time, and serving it allocates: no part of the data path, so no endpoint here.
    // (Set while the process has one thread.)
    std::env::set_var("RDMA_SIM_CONTROL", "off");
    // Likewise a process that starts a device sweeps the same-host sockets of its
    // network namespace by connecting to each, and accepting allocates: a directory of
    // this process's own keeps its sockets out of others' sight.
    let links = std::env::temp_dir().join(format!("rdma-sim-link-alloc-{}", std::process::id()));
    std::env::set_var("RDMA_SIM_LINK_DIR", &links);
    let args = Arguments::from_args();
    let trials = vec![Trial::test("the_data_path_allocates_nothing_once_warm", || {
        the_data_path_allocates_nothing_once_warm();
        Ok(())
    })];
    let done = libtest_mimic::run(&args, trials);
    let _ = std::fs::remove_dir_all(&links);
    done.exit();
}

fn the_data_path_allocates_nothing_once_warm() {
    size_the_parking_table();
    assert!(local_ack_timeout(ACK_TIMEOUT).is_some_and(|t| t > WAIT));
    let params = RcParams {
        timeout: ACK_TIMEOUT,
        ..RcParams::default()
    };
    let p = Pair::new(&params, QpCap::new(32, 32));
    let (a, b, cq_a, cq_b) = (&p.a, &p.b, &p.cq0, &p.cq1);
    let la = p.pd0.reg_mr(2 * BIG, AccessFlags::LOCAL_WRITE).unwrap();
    let flags = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let lb = p.pd1.reg_mr(2 * BIG, flags).unwrap();
    let remote = lb.remote();
    let ud = Ud::new(&p);

    // Warm up: connections and the link set up, queues, scratch vectors and free lists
    // at size.
    for i in 0..200 {
        round(i, a, b, cq_a, cq_b, &la, &lb, remote);
        ud.round(i, &la, &lb);
    }
    let rounds = 2000;
    COUNTING.store(true, Ordering::SeqCst);
    for i in 0..rounds {
        round(i, a, b, cq_a, cq_b, &la, &lb, remote);
        ud.round(i, &la, &lb);
    }
    COUNTING.store(false, Ordering::SeqCst);

    let n = ALLOCS.load(Ordering::SeqCst);
    let first = FIRST.lock().unwrap().take().unwrap_or_default();
    assert_eq!(
        n, 0,
        "{n} allocations in {rounds} rounds of 36 work requests each; the first:\n{first}"
    );
    // The rounds really ran: the counters moved by exactly as many atomics.
    assert_eq!(lb.read_u64(4096).unwrap(), 200 + rounds);
}
