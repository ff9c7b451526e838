//! The requester's side of the same-host one-sided fast path (docs/sim.md "The one-sided
//! fast path"): an RC WRITE, RDMA READ or atomic the driver may execute on the
//! responder's memory itself, after running the responder's access check on state the
//! responder publishes. The protocol core stays free of I/O: the driver hands it a
//! [`DirectWrite`] for the connection, and the core decides which WQEs may ask it and
//! tells the responder what was executed: a placed WRITE as a
//! [`Frame::WritePlaced`](crate::wire::Frame::WritePlaced), which the responder runs every
//! rule of a WRITE on but moving the data, a READ or atomic as a notice,
//! [`Frame::ReadPlaced`](crate::wire::Frame::ReadPlaced),
//! [`Frame::AtomicPlaced`](crate::wire::Frame::AtomicPlaced) or, for several in a row,
//! [`Frame::PlacedRun`](crate::wire::Frame::PlacedRun) ([`run`](super::run)), which takes
//! the operations' PSNs so that the responder's PSN and MSN advance and its ACK covers
//! them.
//!
//! RC ordering: a WQE may go this way only when every WQE before it has completed or went
//! this way too, so no earlier message still travelling over the connection lands after
//! (or reads before) the data placed now. A WQE asks on its first send only, whatever
//! the answer: a resend of one that went the normal way (a WQE behind one still
//! unanswered, or refused) goes the normal way again, since the responder may have
//! executed it already and lost only its answer (a frame built while the QP has no
//! connection reached nobody: [`Requester::builds_are_lost`]). A placed WRITE completes on
//! the ACK as always, and a resend of it (a rewind after a lost connection, a timeout or
//! an RNR NAK) carries the payload the normal way and clears the mark, so WQEs after it
//! go the normal way as well.
//!
//! A placed READ or atomic is done when the driver returns (the data is in the WQE's
//! scatter list, the original value in its 8 bytes): its completion is produced at once
//! if every WQE before it has completed (or is such a READ or atomic), otherwise as soon
//! as they have, so completions stay in order. It no longer counts against
//! `max_rd_atomic` (the responder holds nothing for it) but keeps its send queue slot
//! until the ACK of its notice, and every resend of it (rewind, timeout, PSN sequence
//! NAK) is the notice again, never the operation: an atomic executes once. The ACK
//! retires it without a second completion. A responder only NAKs a notice if its QP has
//! no responder resources (`max_dest_rd_atomic` 0, which the published state does not
//! show) or the peer misbehaves: the WQE then fails as for that NAK (its status moves
//! the QP to ERR, the WQEs behind it are flushed) without a second completion for the
//! one already produced. A notice never acknowledged (the peer went away) ends the same
//! way once `retry_cnt` is spent; such an error of the QP's completes the first WQE whose
//! completion has not gone yet, so that it is seen. One executed but waiting for a WQE
//! ahead of it that then fails is flushed: after an error only flushes follow.

use super::*;

/// What the driver offers for one connection: the check and the copy of the fast path.
pub trait DirectWrite: Send + Sync {
    /// The shortest message worth placing directly (shorter ones are cheaper over the
    /// connection).
    fn min_len(&self) -> u64;

    /// Runs the responder's remote access check for a WRITE of the bytes of `segs` (the
    /// WQE's gather list, resolved and checked) to `addr` under `rkey` at the peer's QP
    /// `dest_qpn`, and copies them there. True if every byte was placed; false leaves the
    /// WQE to the normal way (bytes a short copy wrote lie inside the checked range, and
    /// the normal WRITE overwrites them).
    fn write(&self, dest_qpn: u32, rkey: u32, addr: u64, segs: &[Seg]) -> bool;

    /// Runs the responder's remote access check for an RDMA READ of the bytes at `addr`
    /// under `rkey` at the peer's QP `dest_qpn` (as many as `segs` hold: the WQE's
    /// scatter list, resolved and checked), and copies them into `segs`. True if every
    /// byte arrived; false leaves the WQE to the normal way. A driver that cannot read
    /// the peer's memory keeps the default.
    fn read(&self, dest_qpn: u32, rkey: u32, addr: u64, segs: &[Seg]) -> bool {
        let _ = (dest_qpn, rkey, addr, segs);
        false
    }

    /// Runs the responder's remote access check for an atomic operation on the 8 bytes
    /// at `addr` under `rkey` at the peer's QP `dest_qpn` and executes it there as one
    /// CPU atomic on memory both processes map (atomic with the responder's own atomics
    /// on that word, IBA 9.4.5). `Some(original value)` if it was executed; `None` leaves
    /// the WQE to the normal way. A driver without such a mapping keeps the default.
    fn atomic(&self, dest_qpn: u32, rkey: u32, addr: u64, op: DirectAtomic) -> Option<u64> {
        let _ = (dest_qpn, rkey, addr, op);
        None
    }
}

/// An atomic operation the fast path may execute on the responder's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectAtomic {
    /// FETCH_AND_ADD: adds `add` (wrapping) and returns the original value.
    FetchAdd {
        /// The addend.
        add: u64,
    },
    /// COMPARE_AND_SWAP: stores `swap` if the word equals `compare`, returns the
    /// original value either way.
    CompareSwap {
        /// The value compared with.
        compare: u64,
        /// The value stored on a match.
        swap: u64,
    },
}

impl Requester {
    /// Whether the frames built from now on are lost on the way (`true`: the QP has no
    /// connection, and builds them only for their local checks): a WQE built so has not
    /// had its first send, and may still ask the fast path once connected.
    pub fn builds_are_lost(&mut self, lost: bool) {
        self.lost_builds = lost;
    }

    /// Offers (or, with `None`, withdraws) the fast path of the QP's connection.
    pub fn set_direct(&mut self, direct: Option<Arc<dyn DirectWrite>>) {
        self.direct = direct;
    }

    /// The fast path, if WQE `idx` may ask it (an RC WRITE from registered memory or
    /// READ, long enough, or an atomic; on its first send, with every WQE before it
    /// complete or placed); marks the WQE as sent once.
    pub(super) fn direct_for(&mut self, idx: usize) -> Option<Arc<dyn DirectWrite>> {
        // Only on its first send: one that went the normal way may have been executed by
        // the responder already, its answer lost (an atomic must not run twice). A frame
        // built without a connection reached nobody.
        let first = !self.sq[idx].built_once;
        self.sq[idx].built_once |= !self.lost_builds;
        let d = self.direct.as_ref()?;
        if !first || self.uc || self.ud {
            return None;
        }
        let w = &self.sq[idx];
        let kind_fits = match w.op {
            WrOp::RdmaWrite { .. } | WrOp::RdmaWriteWithImm { .. } | WrOp::RdmaRead { .. } => {
                !w.inline && w.len >= d.min_len()
            }
            WrOp::AtomicCmpAndSwp { .. } | WrOp::AtomicFetchAndAdd { .. } => true,
            _ => false,
        };
        if !kind_fits {
            return None;
        }
        if !self.sq.iter().take(idx).all(|e| e.status.is_some() || e.placed) {
            return None;
        }
        Some(d.clone())
    }

    /// Asks the driver to execute atomic WQE `idx` on `remote`; if it did, stores the
    /// original value where the response's would go and marks the WQE placed. An error
    /// if the value has nowhere to go (its local region was deregistered meanwhile): the
    /// atomic was executed, so it may not go the normal way, and fails as a response
    /// would with `IBV_WC_LOC_PROT_ERR`.
    pub(super) fn place_atomic(
        &mut self,
        idx: usize,
        d: &dyn DirectWrite,
        remote: verbs_api::RemoteAddr,
    ) -> Result<bool, WcStatus> {
        let w = &mut self.sq[idx];
        let op = match w.op {
            WrOp::AtomicCmpAndSwp { compare, swap, .. } => DirectAtomic::CompareSwap { compare, swap },
            WrOp::AtomicFetchAndAdd { add, .. } => DirectAtomic::FetchAdd { add },
            _ => return Ok(false),
        };
        let Some(orig) = d.atomic(self.dest_qpn, remote.rkey, remote.addr, op) else {
            return Ok(false);
        };
        w.placed = true;
        if !ack::store_orig(&w.local, orig) {
            return Err(WcStatus::LocProtErr);
        }
        Ok(true)
    }

    /// The oldest WQE not finished as the application sees it (one whose completion went
    /// early is finished), else the oldest one unfinished: the WQE an error of the QP's
    /// (retries spent, the port down) completes with, so that it is seen.
    pub(super) fn oldest_unfinished(&self) -> Option<usize> {
        self.sq
            .iter()
            .position(|w| w.status.is_none() && !w.reported)
            .or_else(|| self.sq.iter().position(|w| w.status.is_none()))
    }

    /// Sends the notice of executed READ or atomic WQE `idx`, at `psn`.
    pub(super) fn push_notice(&mut self, idx: usize, psn: u32, tx: &mut TxQueue) {
        let ack_req = self.ack_req_due();
        self.push_notice_with(idx, psn, ack_req, tx);
    }

    /// [`Requester::push_notice`] with the AckReq bit decided.
    pub(super) fn push_notice_with(&mut self, idx: usize, psn: u32, ack_req: bool, tx: &mut TxQueue) {
        let w = &self.sq[idx];
        let Some(r) = w.op.remote() else { return };
        let (compare, swap_add) = match w.op {
            WrOp::AtomicCmpAndSwp { compare, swap, .. } => (Some(compare), swap),
            WrOp::AtomicFetchAndAdd { add, .. } => (None, add),
            _ => {
                tx.push_frame(&Frame::ReadPlaced {
                    psn,
                    len: w.len as u32,
                    addr: r.addr,
                    rkey: r.rkey,
                    ack_req,
                });
                return;
            }
        };
        tx.push_frame(&Frame::AtomicPlaced {
            psn,
            addr: r.addr,
            rkey: r.rkey,
            compare,
            swap_add,
            ack_req,
        });
    }

    /// Produces the completions of the executed READs and atomics at the front of the
    /// queue (behind only completed WQEs, which `retire` took off first) that have none
    /// yet: they complete before the responder acknowledges their notices.
    pub(super) fn report_placed(&mut self, out: &mut Vec<WorkCompletion>) {
        let mut number = self.retired;
        for w in self.sq.iter_mut() {
            if w.status.is_some() || !w.executed() {
                break;
            }
            number += 1;
            if std::mem::replace(&mut w.reported, true) {
                continue;
            }
            self.early += 1;
            if !w.signaled {
                continue;
            }
            if self.sw.sq_slot_release == SlotRelease::AtPoll {
                // The number it will retire as: its slot is freed when it retires and
                // this completion was polled, whichever comes last.
                self.marks.push(number);
            }
            out.push(w.completion(self.qpn, WcStatus::Success));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use verbs_api::{AccessFlags, QpCap};

    use super::*;
    use crate::memory::MrShared;

    /// A fast path that places or refuses as told, and records what it was asked.
    struct Fake {
        place: Mutex<bool>,
        asked: Mutex<Vec<(u32, u32, u64, u64)>>,
    }

    impl DirectWrite for Fake {
        fn min_len(&self) -> u64 {
            32
        }
        fn write(&self, dest_qpn: u32, rkey: u32, addr: u64, segs: &[Seg]) -> bool {
            let len = segs.iter().map(|s| s.len as u64).sum();
            self.asked.lock().unwrap().push((dest_qpn, rkey, addr, len));
            *self.place.lock().unwrap()
        }
    }

    /// The frames `req` sends now: each one's header and how many payload bytes follow.
    fn sent(req: &mut Requester, mrs: &MrTable) -> Vec<(Frame, usize)> {
        let (mut tx, mut out, mut wire) = (TxQueue::new(), Vec::new(), Vec::new());
        req.poll_transmit(mrs, Instant::now(), &mut tx, 64, &mut out)
            .unwrap();
        tx.drain_into(&mut wire);
        let mut frames = Vec::new();
        let mut at = 0;
        while at < wire.len() {
            let (f, head) = Frame::decode(&wire[at..]).unwrap().unwrap();
            let payload = f.payload_len() as usize;
            frames.push((f, payload));
            at += head + payload;
        }
        frames
    }

    fn kinds(frames: &[(Frame, usize)]) -> Vec<(&'static str, usize)> {
        frames
            .iter()
            .map(|(f, n)| match f {
                Frame::WritePlaced { .. } => ("placed", *n),
                Frame::Write { .. } => ("write", *n),
                Frame::Send { .. } => ("send", *n),
                _ => ("other", *n),
            })
            .collect()
    }

    /// The fast path is asked only for a long enough RC WRITE whose predecessors all
    /// completed or were placed, once per WQE: a placed WRITE goes as a header without
    /// payload, a refused one and every resend as a WRITE with its payload, and after a
    /// resend the WRITEs behind it go the normal way too (RC ordering).
    #[test]
    fn placed_only_in_order_once_and_resent_with_payload() {
        let mrs = MrTable::default();
        let mr = Arc::new(MrShared::new_owned(1, 7, 4096, AccessFlags::LOCAL_WRITE).unwrap());
        mrs.insert(mr.clone());
        let mut req = Requester::new(1, 1, &QpCap::new(16, 1), false);
        req.connect(ReqAttrs {
            sq_psn: 0,
            timeout: None,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        });
        req.dest_qpn = 0x42;
        let fake = Arc::new(Fake {
            place: Mutex::new(true),
            asked: Mutex::new(Vec::new()),
        });
        req.set_direct(Some(fake.clone()));
        let long = [Sge::new(mr.addr(), 64, 7)];
        let short = [Sge::new(mr.addr(), 16, 7)];
        let post = |req: &mut Requester, wr: &SendWr<'_>| req.post(wr, &mrs).unwrap();
        post(&mut req, &SendWr::write(1, &long, (0x9000, 5)));
        post(&mut req, &SendWr::write(2, &short, (0x9000, 5)));
        post(&mut req, &SendWr::write(3, &long, (0x9100, 5)));
        let f = sent(&mut req, &mrs);
        // The short one goes with its payload; the one after it waits for it to complete.
        assert_eq!(kinds(&f), [("placed", 0), ("write", 16), ("write", 64)]);
        assert_eq!(*fake.asked.lock().unwrap(), [(0x42, 5, 0x9000, 64)]);
        let mut out = Vec::new();
        let last = f.last().unwrap().0.psn().unwrap();
        req.on_response(&Frame::Ack { psn: last }, Instant::now(), &mut out)
            .unwrap();
        // All complete: the next long WRITE is asked; refused, it carries its payload.
        *fake.place.lock().unwrap() = false;
        post(&mut req, &SendWr::write(4, &long, (0x9200, 5)));
        assert_eq!(kinds(&sent(&mut req, &mrs)), [("write", 64)]);
        *fake.place.lock().unwrap() = true;
        let acked = req.psn.wrapping_sub(1) & verbs_api::PSN_MASK;
        req.on_response(&Frame::Ack { psn: acked }, Instant::now(), &mut out)
            .unwrap();
        post(&mut req, &SendWr::write(5, &long, (0x9300, 5)));
        post(&mut req, &SendWr::write_with_imm(6, &long, (0x9400, 5), 77));
        assert_eq!(kinds(&sent(&mut req, &mrs)), [("placed", 0), ("placed", 0)]);
        // The connection is lost: both are resent with their payloads, the fast path
        // not asked again, and a WRITE posted behind them is not asked either.
        req.on_connection_lost();
        post(&mut req, &SendWr::write(7, &long, (0x9500, 5)));
        let asked = fake.asked.lock().unwrap().len();
        assert_eq!(
            kinds(&sent(&mut req, &mrs)),
            [("write", 64), ("write", 64), ("write", 64)]
        );
        assert_eq!(fake.asked.lock().unwrap().len(), asked);
    }
}
