//! Where a responder takes its receives from: the QP's own receive queue
//! (`man ibv_post_recv`) or a shared receive queue that several QPs take from
//! (`man ibv_create_srq`, `man ibv_post_srq_recv`, `man ibv_modify_srq`,
//! `man ibv_query_srq`; IBA 10.2.9 "Shared receive queues", 11.5.2.4).
//!
//! Both are a FIFO of receive WQEs of bounded size: posting past the capacity is ENOMEM,
//! more SGEs than the queue allows is EINVAL. An SRQ hands out its WQEs first in first out
//! whatever QP a message arrived on, under its own lock (taken with the QP's held, never
//! the other way round).
//!
//! An SRQ's limit (low watermark, `srq_limit`) is armed when non-zero. After a WQE is
//! taken, if the number left is strictly below the limit, the limit is disarmed (reads 0)
//! and the taker raises `IBV_EVENT_SRQ_LIMIT_REACHED`, once; arming it while the SRQ is
//! already below raises nothing until the next WQE is taken. This is what rxe does
//! (`rxe_resp.c: get_srq_wqe()`), and rxe also arms the limit given to `ibv_create_srq`
//! (`rxe_srq_from_init()`), where the man page and IBA call it ignored at create time:
//! the sim does as rxe.
//!
//! A WQE moves out of a queue by swapping its SGE buffer with the taker's, so taking,
//! posting and giving back allocate nothing once the queue has been filled once.

use std::collections::VecDeque;

use parking_lot::Mutex;
use verbs_api::{Error, PostError, RecvWr, Sge, SrqAttr, SrqAttrMask};

use crate::queue_sizing::QueueSizing;

/// One receive WQE: its `wr_id` and scatter list.
#[derive(Debug, Default)]
pub struct RecvWqe {
    /// The WR's `wr_id`.
    pub wr_id: u64,
    /// Its scatter list.
    pub sges: Vec<Sge>,
}

/// Why a receive was not posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostRecvError {
    /// The queue holds as many receives as it may (ENOMEM).
    Full,
    /// More SGEs than the queue's `max_sge` (EINVAL).
    TooManySge,
    /// The QP takes its receives from an SRQ and has no queue of its own (EINVAL).
    HasSrq,
}

/// A FIFO of receive WQEs with a capacity.
#[derive(Debug)]
pub struct RecvQueue {
    cap: usize,
    max_sge: u32,
    q: VecDeque<RecvWqe>,
    spare: Vec<RecvWqe>,
}

impl RecvQueue {
    /// An empty queue of `cap` receives of at most `max_sge` SGEs each.
    pub fn new(cap: u32, max_sge: u32) -> Self {
        RecvQueue {
            cap: cap as usize,
            max_sge,
            q: VecDeque::with_capacity(cap.min(4096) as usize),
            spare: Vec::new(),
        }
    }

    /// Receives queued.
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Whether none is queued.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Queues a receive.
    pub fn post(&mut self, wr: &RecvWr<'_>) -> Result<(), PostRecvError> {
        if self.q.len() >= self.cap {
            return Err(PostRecvError::Full);
        }
        if wr.sg_list.len() > self.max_sge as usize {
            return Err(PostRecvError::TooManySge);
        }
        let mut w = self.spare.pop().unwrap_or_default();
        w.wr_id = wr.wr_id;
        w.sges.clear();
        w.sges.extend_from_slice(wr.sg_list);
        self.q.push_back(w);
        Ok(())
    }

    /// Moves the oldest receive into `dst` (its SGE buffer is swapped, not copied);
    /// false if the queue is empty.
    pub fn take_into(&mut self, dst: &mut RecvWqe) -> bool {
        let Some(mut w) = self.q.pop_front() else {
            return false;
        };
        dst.wr_id = w.wr_id;
        std::mem::swap(&mut dst.sges, &mut w.sges);
        self.spare.push(w);
        true
    }

    /// Puts `src` back at the head: a receive taken for a message that never arrived
    /// whole. (It may take the queue one past its capacity, if receives were posted into
    /// the room it left meanwhile.)
    pub fn put_back(&mut self, src: &mut RecvWqe) {
        let mut w = self.spare.pop().unwrap_or_default();
        w.wr_id = src.wr_id;
        std::mem::swap(&mut w.sges, &mut src.sges);
        self.q.push_front(w);
    }

    /// Empties the queue, oldest first, handing each `wr_id` to `f`.
    pub fn drain(&mut self, mut f: impl FnMut(u64)) {
        while let Some(w) = self.q.pop_front() {
            f(w.wr_id);
            self.spare.push(w);
        }
    }
}

/// A shared receive queue: a [`RecvQueue`] that several responders take from, and its
/// limit.
#[derive(Debug)]
pub struct SharedRecvQueue {
    handle: u32,
    state: Mutex<SrqState>,
}

#[derive(Debug)]
struct SrqState {
    q: RecvQueue,
    max_sge: u32,
    limit: u32,
}

impl SharedRecvQueue {
    /// An SRQ named `handle` (as asynchronous events name it) of `max_wr` receives of
    /// `max_sge` SGEs, its limit armed at `srq_limit` (0: not armed).
    pub fn new(handle: u32, max_wr: u32, max_sge: u32, srq_limit: u32) -> Self {
        SharedRecvQueue {
            handle,
            state: Mutex::new(SrqState {
                q: RecvQueue::new(max_wr, max_sge),
                max_sge,
                limit: srq_limit,
            }),
        }
    }

    /// Its handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Receives queued.
    pub fn len(&self) -> usize {
        self.state.lock().q.len()
    }

    /// Whether none is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `ibv_post_srq_recv`: queues `wrs` in order, under one lock; on failure, the index
    /// of the first WR not posted and why (those before it were posted).
    pub fn post_all(&self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostRecvError)> {
        let mut st = self.state.lock();
        for (i, wr) in wrs.iter().enumerate() {
            st.q.post(wr).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// `ibv_post_srq_recv` as the verbs answer it: [`post_all`](Self::post_all), its
    /// refusal in the verbs' words (ENOMEM past `max_wr`, EINVAL past `max_sge`).
    pub fn post_srq_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        self.post_all(wrs).map_err(|(index, e)| {
            let error = match e {
                PostRecvError::Full => Error::NoMemory {
                    call: "ibv_post_srq_recv",
                    reason: format!(
                        "SRQ {} holds {} receives, its max_wr",
                        self.handle,
                        self.query().max_wr
                    ),
                },
                PostRecvError::TooManySge => Error::invalid(
                    "ibv_post_srq_recv",
                    format!(
                        "{} SGEs exceed the SRQ's max_sge {}",
                        wrs[index].sg_list.len(),
                        self.query().max_sge
                    ),
                ),
                // Only a QP's own receive queue refuses with this.
                PostRecvError::HasSrq => Error::invalid("ibv_post_srq_recv", "a post to an SRQ's own QP"),
            };
            PostError {
                index,
                wr_id: wrs[index].wr_id,
                error,
            }
        })
    }

    /// Moves the oldest receive into `dst`: `None` if the SRQ is empty, else whether this
    /// took the SRQ below its armed limit (which is then disarmed: the caller raises
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`).
    pub fn take_into(&self, dst: &mut RecvWqe) -> Option<bool> {
        let mut st = self.state.lock();
        if !st.q.take_into(dst) {
            return None;
        }
        let reached = st.limit > 0 && (st.q.len() as u64) < st.limit as u64;
        if reached {
            st.limit = 0;
        }
        Some(reached)
    }

    /// Puts `src` back at the head (see [`RecvQueue::put_back`]).
    pub fn put_back(&self, src: &mut RecvWqe) {
        self.state.lock().q.put_back(src);
    }

    /// Disarms the limit (the SRQ's handle is gone: nobody would read the event).
    pub fn disarm(&self) {
        self.state.lock().limit = 0;
    }

    /// `ibv_query_srq`.
    pub fn query(&self) -> SrqAttr {
        let st = self.state.lock();
        SrqAttr {
            max_wr: st.q.cap as u32,
            max_sge: st.max_sge,
            srq_limit: st.limit,
        }
    }

    /// `ibv_modify_srq`: `MAX_WR` resizes to `attr.max_wr` (at most `max_srq_wr`, then
    /// rounded as `sizing` says), `LIMIT` arms (non-zero) or disarms the limit. Each
    /// value is checked against what the call leaves: a size below the receives queued or
    /// below the armed limit, and a limit above the size, are EINVAL, and then nothing
    /// changes (`man ibv_modify_srq`). The device limit and the armed limit are checked
    /// against the size asked, the receives queued and a new limit against the size the
    /// SRQ will have, as rxe does (rxe_srq.c `rxe_srq_chk_attr()`, then
    /// `rxe_queue_resize()`).
    pub fn modify(
        &self,
        attr: &SrqAttr,
        mask: SrqAttrMask,
        max_srq_wr: u32,
        sizing: QueueSizing,
    ) -> Result<(), Error> {
        let bad = |name: &'static str, reason: String| Err(Error::InvalidAttr { name, reason });
        let mut st = self.state.lock();
        let cap = if mask.contains(SrqAttrMask::MAX_WR) {
            attr.max_wr
        } else {
            st.q.cap as u32
        };
        let limit = if mask.contains(SrqAttrMask::LIMIT) {
            attr.srq_limit
        } else {
            st.limit
        };
        let mut cap = cap;
        if mask.contains(SrqAttrMask::MAX_WR) {
            if cap == 0 || cap > max_srq_wr {
                return bad(
                    "max_wr",
                    format!("{cap} is outside 1..={max_srq_wr} (the device's max_srq_wr)"),
                );
            }
            if limit > 0 && cap < limit {
                return bad("max_wr", format!("{cap} is below the armed srq_limit {limit}"));
            }
            cap = sizing.srq_entries(cap);
            if (cap as usize) < st.q.len() {
                return bad(
                    "max_wr",
                    format!("{cap} is below the {} receives the SRQ holds", st.q.len()),
                );
            }
        }
        if mask.contains(SrqAttrMask::LIMIT) && limit > cap {
            return bad(
                "srq_limit",
                format!("{limit} exceeds the SRQ's size max_wr {cap}"),
            );
        }
        st.q.cap = cap as usize;
        st.limit = limit;
        Ok(())
    }
}

/// Where a responder takes its receives from.
#[derive(Debug)]
pub enum RecvSource {
    /// The QP's own receive queue.
    Own(RecvQueue),
    /// A shared receive queue.
    Shared(std::sync::Arc<SharedRecvQueue>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(id: u64, sges: &[Sge]) -> RecvWr<'_> {
        RecvWr::new(id, sges)
    }

    #[test]
    fn fifo_capacity_and_sges() {
        let sge = [Sge::new(0x1000, 8, 1), Sge::new(0x2000, 8, 1)];
        let mut q = RecvQueue::new(2, 1);
        assert_eq!(q.post(&wr(1, &sge)), Err(PostRecvError::TooManySge));
        q.post(&wr(1, &sge[..1])).unwrap();
        q.post(&wr(2, &sge[1..])).unwrap();
        assert_eq!(q.post(&wr(3, &sge[..1])), Err(PostRecvError::Full));
        let mut w = RecvWqe::default();
        assert!(q.take_into(&mut w));
        assert_eq!((w.wr_id, w.sges.as_slice()), (1, &sge[..1]));
        q.put_back(&mut w);
        let mut ids = Vec::new();
        q.drain(|id| ids.push(id));
        assert_eq!(ids, [1, 2]);
        assert!(!q.take_into(&mut w));
    }

    /// rxe's rule: the event is due when, after a WQE is taken, fewer than the limit are
    /// left; it fires once and disarms; arming below the limit raises nothing by itself.
    #[test]
    fn the_limit_fires_once_below_it_and_disarms() {
        let sge = [Sge::new(0x1000, 8, 1)];
        let srq = SharedRecvQueue::new(9, 16, 1, 0);
        srq.post_all(&(0..10).map(|i| wr(i, &sge)).collect::<Vec<_>>())
            .unwrap();
        srq.modify(
            &SrqAttr::default().with_limit(7),
            SrqAttrMask::LIMIT,
            100,
            QueueSizing::AsAsked,
        )
        .unwrap();
        assert_eq!(srq.query().srq_limit, 7);
        let mut w = RecvWqe::default();
        // 9, 8, 7 left: not below 7; 6 left: below.
        let fired: Vec<bool> = (0..5).map(|_| srq.take_into(&mut w).unwrap()).collect();
        assert_eq!(fired, [false, false, false, true, false]);
        assert_eq!(srq.query().srq_limit, 0, "disarmed");
        // Armed while below: nothing until a WQE is taken.
        srq.modify(
            &SrqAttr::default().with_limit(8),
            SrqAttrMask::LIMIT,
            100,
            QueueSizing::AsAsked,
        )
        .unwrap();
        assert_eq!(srq.take_into(&mut w), Some(true));
        while srq.take_into(&mut w).is_some() {}
        assert_eq!(srq.take_into(&mut w), None, "an empty SRQ raises nothing");
    }

    #[test]
    fn modify_checks_everything_before_changing_anything() {
        let sge = [Sge::new(0x1000, 8, 1)];
        let srq = SharedRecvQueue::new(1, 8, 1, 4);
        srq.post_all(&(0..6).map(|i| wr(i, &sge)).collect::<Vec<_>>())
            .unwrap();
        let both = SrqAttrMask::MAX_WR | SrqAttrMask::LIMIT;
        let before = srq.query();
        for (a, m) in [
            (SrqAttr::new(5, 1), SrqAttrMask::MAX_WR),   // below the 6 posted
            (SrqAttr::new(0, 1), SrqAttrMask::MAX_WR),   // zero
            (SrqAttr::new(200, 1), SrqAttrMask::MAX_WR), // above the device's
            (SrqAttr::default().with_limit(9), SrqAttrMask::LIMIT), // above the size
            (SrqAttr::new(6, 1).with_limit(7), both),    // limit above the new size
        ] {
            assert!(
                srq.modify(&a, m, 100, QueueSizing::AsAsked).is_err(),
                "{a:?} {m:?}"
            );
            assert_eq!(srq.query(), before);
        }
        // 6 posted, limit 4: shrinking to 6 is allowed; below the limit is not.
        srq.modify(
            &SrqAttr::new(6, 1),
            SrqAttrMask::MAX_WR,
            100,
            QueueSizing::AsAsked,
        )
        .unwrap();
        let e = srq.modify(
            &SrqAttr::new(3, 1),
            SrqAttrMask::MAX_WR,
            100,
            QueueSizing::AsAsked,
        );
        assert!(e.is_err());
        // Growing lets more be posted.
        srq.modify(
            &SrqAttr::new(7, 1),
            SrqAttrMask::MAX_WR,
            100,
            QueueSizing::AsAsked,
        )
        .unwrap();
        srq.post_all(&[wr(6, &sge)]).unwrap();
        assert_eq!(srq.post_all(&[wr(7, &sge)]), Err((0, PostRecvError::Full)));
        assert_eq!(srq.query(), SrqAttr::new(7, 1).with_limit(4));
    }

    #[test]
    fn a_rounding_device_resizes_to_its_ring_and_checks_what_it_holds() {
        let sge = [Sge::new(0x1000, 8, 1)];
        let srq = SharedRecvQueue::new(1, 8, 1, 0);
        srq.post_all(&(0..6).map(|i| wr(i, &sge)).collect::<Vec<_>>())
            .unwrap();
        // 5 asked holds 7 on rxe: the 6 posted fit, where a device that gives 5 refuses.
        let five = SrqAttr::new(5, 1);
        assert!(srq
            .modify(&five, SrqAttrMask::MAX_WR, 100, QueueSizing::AsAsked)
            .is_err());
        srq.modify(&five, SrqAttrMask::MAX_WR, 100, QueueSizing::All)
            .unwrap();
        assert_eq!(srq.query().max_wr, 7);
        srq.post_all(&[wr(6, &sge)]).unwrap();
        assert_eq!(srq.post_all(&[wr(7, &sge)]), Err((0, PostRecvError::Full)));
        // A limit is checked against the rounded size: 7 fits in 7, 8 does not.
        let both = SrqAttrMask::MAX_WR | SrqAttrMask::LIMIT;
        srq.modify(&SrqAttr::new(4, 1).with_limit(7), both, 100, QueueSizing::All)
            .unwrap_err();
        srq.modify(
            &SrqAttr::default().with_limit(7),
            SrqAttrMask::LIMIT,
            100,
            QueueSizing::All,
        )
        .unwrap();
        srq.modify(
            &SrqAttr::default().with_limit(8),
            SrqAttrMask::LIMIT,
            100,
            QueueSizing::All,
        )
        .unwrap_err();
    }
}
