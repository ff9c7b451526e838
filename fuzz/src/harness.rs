//! The harness ([`Harness`]): one QP under attack, its regions and its bookkeeping, set
//! up from an input's [`Setup`] and driven step by step ([`Harness::run`],
//! [`Harness::step`]). What the peer sends is built in [`frames`](crate::frames), what the
//! application posts in [`app`](crate::app), the engine's passes and the peer's reads in
//! [`link`](crate::link), and the invariants checked in [`checks`](crate::checks).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_sim_proto::engine::DriveState;
use backend_sim_proto::link_rx::LinkReader;
use backend_sim_proto::memory::{MrShared, MrTable};
use backend_sim_proto::requester::{ReqAttrs, Requester};
use backend_sim_proto::responder::{RespAttrs, Responder};
use backend_sim_proto::rx::Reader;
use backend_sim_proto::tx::TxQueue;
use backend_sim_proto::wire::Frame;
use verbs_api::timers::local_ack_timeout;
use verbs_api::{AccessFlags, QpCap, Sge, WorkCompletion, PSN_MASK};

use crate::input::{Input, Setup, Step};
use crate::limits::{MAX_STEPS, MAX_STREAM};
use crate::regions::{region_access, region_pd, CANARY, DEAD, GUARD, KEYS, LOCAL, NREG, PD, REGION_LEN};

/// One QP under attack.
pub struct Harness {
    pub(crate) base: *mut u8,
    pub(crate) total: usize,
    pub(crate) offs: [usize; NREG],
    pub(crate) initial: Vec<u8>,
    pub(crate) regions: Vec<Arc<MrShared>>,
    pub(crate) mrs: MrTable,
    /// Regions deregistered during the input, with their bytes at that moment.
    pub(crate) frozen: Vec<(usize, Vec<u8>)>,
    pub(crate) req: Requester,
    pub(crate) resp: Responder,
    pub(crate) rx: Reader,
    pub(crate) tx: TxQueue,
    pub(crate) st: DriveState,
    pub(crate) now: Instant,
    pub(crate) send_wc: Vec<WorkCompletion>,
    pub(crate) recv_wc: Vec<(WorkCompletion, bool)>,
    pub(crate) target_writable: bool,
    pub(crate) sq_psn: u32,
    pub(crate) err: bool,
    /// The connection was closed (protocol error) or cannot come back (QP in ERR).
    pub(crate) closed: bool,
    /// Memory once the QP is in ERR and nothing is landing any more.
    pub(crate) err_snapshot: Option<Vec<u8>>,
    /// Bytes queued for the peer when the QP entered ERR.
    pub(crate) err_pending: usize,
    pub(crate) next_id: u64,
    pub(crate) last_send_id: u64,
    pub(crate) send_ids_done: bool,
    pub(crate) recvs: VecDeque<(u64, u64)>,
    /// The last requests the QP sent (what a peer could answer).
    pub(crate) sent: VecDeque<Frame>,
    pub(crate) chunk: usize,
    pub(crate) streamed: usize,
    pub(crate) out: Vec<u8>,
    /// The QP is a UD QP, the peer a device on a link.
    pub(crate) ud: bool,
    /// The link's incoming bytes (UD).
    pub(crate) link: LinkReader,
}

impl Drop for Harness {
    fn drop(&mut self) {
        for r in &self.regions {
            r.kill();
        }
        // Segments still queued hold Arcs of the regions, but every copy after `kill`
        // is skipped, so the buffer can go.
        let words = self.total / 8;
        // SAFETY: allocated in `new` as a boxed slice of `words` u64s; nothing reads it
        // any more (every region is killed).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.base.cast::<u64>(), words)) });
    }
}

/// The QP's capacities.
fn cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

/// Both halves of the QP under attack, connected as `setup` says: the requester, the
/// responder (granting the remote rights `setup` does not refuse), the requester's first
/// PSN and whether the peer may change `TARGET`.
fn connected_qp(setup: &Setup) -> (Requester, Responder, u32, bool) {
    if setup.ud {
        // A UD QP in RTS: no peer, no remote rights; it sends to an address the
        // harness never dials.
        let mut resp = Responder::new(2, PD, cap().max_recv_wr, cap().max_recv_sge).datagram();
        resp.qkey = crate::QKEY;
        let mut req = Requester::new(1, PD, &cap(), false).datagram();
        req.qkey = crate::QKEY;
        let sq_psn = setup.sq_psn & PSN_MASK;
        req.connect(ReqAttrs {
            sq_psn,
            timeout: None,
            retry_cnt: 0,
            rnr_retry: 0,
            max_rd_atomic: 0,
        });
        return (req, resp, sq_psn, false);
    }
    let mut qp_access = AccessFlags::REMOTE;
    if setup.qp_refuses & 1 != 0 {
        qp_access.remove(AccessFlags::REMOTE_WRITE);
    }
    if setup.qp_refuses & 2 != 0 {
        qp_access.remove(AccessFlags::REMOTE_READ);
    }
    if setup.qp_refuses & 4 != 0 {
        qp_access.remove(AccessFlags::REMOTE_ATOMIC);
    }
    // Atomics write only with responder resources for them.
    let target_writable = qp_access.contains(AccessFlags::REMOTE_WRITE)
        || (qp_access.contains(AccessFlags::REMOTE_ATOMIC) && setup.qp_refuses & 8 == 0);
    let mut resp = Responder::new(2, PD, cap().max_recv_wr, cap().max_recv_sge);
    resp.connect(RespAttrs {
        rq_psn: setup.rq_psn & PSN_MASK,
        min_rnr_timer: setup.min_rnr_timer % 32,
    });
    resp.access = qp_access;
    resp.max_dest_rd_atomic = if setup.qp_refuses & 8 != 0 { 0 } else { 16 };
    let sq_psn = setup.sq_psn & PSN_MASK;
    let mut req = Requester::new(1, PD, &cap(), false);
    req.connect(ReqAttrs {
        sq_psn,
        timeout: local_ack_timeout(setup.ack_timeout % 32),
        retry_cnt: setup.retry_cnt % 8,
        rnr_retry: setup.rnr_retry % 8,
        max_rd_atomic: setup.max_rd_atomic % 17,
    });
    (req, resp, sq_psn, target_writable)
}

impl Harness {
    /// A connected QP with regions, receives and send WRs as `setup` says.
    pub fn new(setup: &Setup) -> Harness {
        let mut offs = [0usize; NREG];
        let mut at = GUARD;
        for (r, o) in offs.iter_mut().enumerate() {
            *o = at;
            at += REGION_LEN[r] + GUARD;
        }
        let total = at;
        debug_assert_eq!(total % 8, 0);
        // A u64 buffer, so that region addresses are 8-byte aligned (atomics).
        let base = Box::into_raw(vec![0u64; total / 8].into_boxed_slice()).cast::<u8>();
        let mut initial = vec![CANARY; total];
        for r in 0..NREG {
            for i in 0..REGION_LEN[r] {
                initial[offs[r] + i] = (i as u8).wrapping_mul(13) ^ (0x40 + r as u8);
            }
        }
        // SAFETY: `base` points to `total` bytes we own; nothing else refers to them yet.
        unsafe { std::ptr::copy_nonoverlapping(initial.as_ptr(), base, total) };
        let mrs = MrTable::default();
        let mut regions = Vec::new();
        for r in 0..NREG {
            // SAFETY: the range lies in our buffer, which outlives every use of the
            // region: `Drop` kills the regions before it frees the buffer.
            let mr = Arc::new(unsafe {
                MrShared::new_borrowed(
                    region_pd(r),
                    KEYS[r],
                    base.add(offs[r]),
                    REGION_LEN[r],
                    region_access(r),
                )
            });
            mrs.insert(mr.clone());
            regions.push(mr);
        }
        mrs.remove(KEYS[DEAD]);
        regions[DEAD].kill();

        let (req, resp, sq_psn, target_writable) = connected_qp(setup);
        let mut h = Harness {
            base,
            total,
            offs,
            initial,
            regions,
            mrs,
            frozen: Vec::new(),
            req,
            resp,
            rx: Reader::new(),
            tx: TxQueue::new(),
            st: DriveState::default(),
            now: Instant::now(),
            send_wc: Vec::new(),
            recv_wc: Vec::new(),
            target_writable,
            sq_psn,
            err: false,
            closed: false,
            err_snapshot: None,
            err_pending: 0,
            next_id: 1,
            last_send_id: 0,
            send_ids_done: false,
            recvs: VecDeque::new(),
            sent: VecDeque::new(),
            chunk: usize::MAX,
            streamed: 0,
            out: Vec::new(),
            ud: setup.ud,
            link: LinkReader::new(),
        };
        for k in 0..(setup.recvs % 9) as usize {
            let sge = Sge::new(h.addr(LOCAL, k * 512), 512, KEYS[LOCAL]);
            h.post_recv(&[sge]);
        }
        for w in setup.wrs.iter().take(8) {
            h.post_send(w);
        }
        h.peer_reads();
        h.check();
        h
    }

    /// Runs one input to the end.
    pub fn run(input: &Input) {
        let mut h = Harness::new(&input.setup);
        for s in input.steps.iter().take(MAX_STEPS) {
            if h.closed || h.streamed > MAX_STREAM {
                break;
            }
            h.step(s);
            h.check();
        }
        h.check();
    }

    pub(crate) fn addr(&self, r: usize, off: usize) -> u64 {
        self.regions[r].addr() + off as u64
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `base..base + total` is our buffer; only this thread touches it and no
        // copy is in progress while we look (the sans-IO core runs on this thread).
        unsafe { std::slice::from_raw_parts(self.base, self.total) }
    }

    /// Runs one step.
    pub fn step(&mut self, s: &Step) {
        match s {
            Step::Frame(_) | Step::Repeat { .. } | Step::Partial { .. } | Step::Corrupt { .. } => {
                self.peer_sends(s)
            }
            Step::Raw(bytes) => self.deliver(bytes),
            Step::Chunk(n) => self.chunk = if *n == 0 { usize::MAX } else { *n as usize },
            Step::PostRecv { key, off, len, split } => self.post_recv_step(*key, *off, *len, *split),
            Step::PostSend(w) => {
                if !self.err {
                    self.post_send(w);
                }
            }
            Step::PeerReads => self.peer_reads(),
            Step::Tick(us) => {
                self.now += Duration::from_micros(*us as u64);
                if !self.err
                    && self
                        .req
                        .on_timer(self.now, None, None, &mut self.send_wc)
                        .is_err()
                {
                    self.enter_error();
                }
                self.check_completions();
            }
            Step::Reconnect => {
                if self.err {
                    // A QP in ERR refuses the new connection (HelloReject::Refused).
                    self.closed = true;
                    return;
                }
                if self.ud {
                    // A new link: the old one's bytes are gone with it.
                    self.link = LinkReader::new();
                    self.closed = false;
                    return;
                }
                // As `progress.rs` does when a connection is lost.
                self.resp.connection_lost();
                self.req.on_connection_lost();
                self.rx = Reader::new();
                self.st = DriveState::default();
                self.tx = TxQueue::new();
            }
            Step::Deregister(r) => {
                let r = *r as usize % NREG;
                if self.mrs.remove(KEYS[r]).is_some() {
                    self.regions[r].kill();
                    let o = self.offs[r];
                    let now = self.bytes()[o..o + REGION_LEN[r]].to_vec();
                    self.frozen.push((r, now));
                }
            }
        }
    }
}
