//! Completion queues and completion channels (`man ibv_create_cq`, `man ibv_poll_cq`,
//! `man ibv_req_notify_cq`, `man ibv_get_cq_event`, `man ibv_create_comp_channel`).
//!
//! - A CQ holds at most `cqe` completions. One more is an overflow: the completion is
//!   lost, the CQ enters an error state that every later `poll` reports as
//!   [`Error::CqOverflow`], the device raises `IBV_EVENT_CQ_ERR` for it once (as rxe's
//!   `rxe_cq_post()` does; the QP raising it asks [`CqShared::overflow_event_due`]), and
//!   the QP that produced it goes to ERR. Overflow is never silent.
//! - `req_notify` arms the CQ once: the next completion (or, solicited-only, the next
//!   solicited or unsuccessful one, IBA 11.4.2.2) puts one event on the channel and
//!   disarms it.
//! - An armed CQ's event goes to its completion channel ([`ChannelShared`], defined in
//!   `comp_channel`, below this module and below `channel_signal`, which decides when a
//!   channel is written).

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use verbs_api::{Error, Result, WcStatus, WorkCompletion};

use backend_sim_proto::qp::SqSlots;
use backend_sim_proto::queue_sizing::QueueSizing;

pub use crate::comp_channel::ChannelShared;

/// Arming state of a CQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arm {
    Off,
    Next,
    Solicited,
}

/// A send completion's claim on its QP's send queue slots: polling it frees every slot
/// up to `upto` (under `SlotRelease::AtPoll`, see [`SqSlots`]).
pub struct SlotMark {
    /// The QP's slots.
    pub slots: Arc<SqSlots>,
    /// The number of the last WQE the completion covers.
    pub upto: u64,
}

struct Entry {
    wc: WorkCompletion,
    mark: Option<SlotMark>,
}

struct CqState {
    entries: VecDeque<Entry>,
    lost: u64,
    arm: Arm,
}

/// One completion queue.
pub struct CqShared {
    /// Handle, unique per device.
    pub handle: u32,
    /// Capacity (`cqe`): written under the `state` lock (`resize`), read under it by
    /// `push_all`.
    cap: AtomicU32,
    state: Mutex<CqState>,
    /// Whether the CQ may hold completions or a loss (written under the `state` lock,
    /// read without it): a poll of an empty CQ, which a spinning poller makes several
    /// times per turn, returns without taking the lock.
    news: AtomicBool,
    /// Whether the CQ is armed (a copy of the arming state written under the `state`
    /// lock, read without it: [`CqShared::armed`]).
    armed: AtomicBool,
    channel: Option<Arc<ChannelShared>>,
    events_delivered: AtomicU64,
    events_acked: AtomicU64,
    /// The CQ overflowed and `IBV_EVENT_CQ_ERR` was not raised yet.
    overflow_unreported: AtomicBool,
    /// The CQ's handle is gone: nobody could take an event naming it.
    closed: AtomicBool,
}

impl CqShared {
    /// A CQ of `cap` entries reporting to `channel`.
    pub fn new(handle: u32, cap: u32, channel: Option<Arc<ChannelShared>>) -> Self {
        CqShared {
            handle,
            cap: AtomicU32::new(cap),
            state: Mutex::new(CqState {
                entries: VecDeque::with_capacity(cap.min(4096) as usize),
                lost: 0,
                arm: Arm::Off,
            }),
            news: AtomicBool::new(false),
            armed: AtomicBool::new(false),
            channel,
            events_delivered: AtomicU64::new(0),
            events_acked: AtomicU64::new(0),
            overflow_unreported: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// The number of completions it holds at most (`ibv_cq::cqe`).
    pub fn capacity(&self) -> u32 {
        self.cap.load(Ordering::Relaxed)
    }

    /// `ibv_resize_cq` (`man ibv_resize_cq`): the CQ holds `cqe` completions from now on
    /// (or more, as `sizing` rounds it), and those it holds stay, in order. Asking for
    /// fewer than it holds is EINVAL, as rxe's `rxe_cq_chk_attr()` refuses (`cqe <
    /// count`, on the value asked) and mlx5 does.
    pub fn resize(&self, cqe: u32, sizing: QueueSizing) -> Result<()> {
        let st = self.state.lock();
        if (cqe as usize) < st.entries.len() {
            return Err(Error::invalid(
                "ibv_resize_cq",
                format!(
                    "cqe {cqe} is fewer than the {} completions the CQ holds",
                    st.entries.len()
                ),
            ));
        }
        self.cap.store(sizing.cq_entries(cqe), Ordering::Relaxed);
        Ok(())
    }

    /// Whether the caller should raise `IBV_EVENT_CQ_ERR` for this CQ now: true once,
    /// after its first overflow, unless its handle is gone.
    pub fn overflow_event_due(&self) -> bool {
        self.overflow_unreported.swap(false, Ordering::AcqRel) && !self.closed.load(Ordering::Acquire)
    }

    /// The CQ's handle was dropped (`ibv_destroy_cq`): no event names it any more.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Queues completions in order, each with its solicited bit and, for a send
    /// completion that frees slots when polled, its [`SlotMark`]. Returns false if any
    /// was lost to overflow.
    pub fn push_all(&self, wcs: impl IntoIterator<Item = (WorkCompletion, bool, Option<SlotMark>)>) -> bool {
        let mut notify = false;
        let mut ok = true;
        {
            let mut st = self.state.lock();
            let cap = self.cap.load(Ordering::Relaxed) as usize;
            for (wc, solicited, mark) in wcs {
                if st.lost > 0 || st.entries.len() >= cap {
                    if st.lost == 0 {
                        self.overflow_unreported.store(true, Ordering::Release);
                    }
                    st.lost += 1;
                    ok = false;
                    continue;
                }
                st.entries.push_back(Entry { wc, mark });
                let fire = match st.arm {
                    Arm::Off => false,
                    Arm::Next => true,
                    Arm::Solicited => solicited || wc.status != WcStatus::Success,
                };
                if fire {
                    st.arm = Arm::Off;
                    notify = true;
                }
            }
            if notify {
                self.armed.store(false, Ordering::Relaxed);
            }
            if !st.entries.is_empty() || st.lost > 0 {
                // Release: a poll that sees it also sees what was pushed.
                self.news.store(true, Ordering::Release);
            }
            if !ok && st.arm != Arm::Off {
                // An overflowed CQ raises its error through the channel as well.
                st.arm = Arm::Off;
                self.armed.store(false, Ordering::Relaxed);
                notify = true;
            }
        }
        if notify {
            if let Some(ch) = &self.channel {
                self.events_delivered.fetch_add(1, Ordering::Relaxed);
                crate::channel_signal::signal(ch, self.handle);
            }
        }
        ok
    }

    /// Queues one completion; false if it was lost to overflow.
    #[cfg(test)]
    pub fn push(&self, wc: WorkCompletion, solicited: bool) -> bool {
        self.push_all([(wc, solicited, None)])
    }

    /// Removes the completions of QP `qpn` (its RESET or destroy, on a device that cleans
    /// CQs: `Switches::cq_clean_on_reset`). Returns how many there were.
    pub fn clean(&self, qpn: u32) -> usize {
        let mut st = self.state.lock();
        let before = st.entries.len();
        st.entries.retain(|e| e.wc.qp_num != qpn);
        if st.entries.is_empty() && st.lost == 0 {
            self.news.store(false, Ordering::Relaxed);
        }
        before - st.entries.len()
    }

    /// [`CqShared::poll_each`] into a slice, for the tests.
    #[cfg(test)]
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let mut slots = out.iter_mut();
        self.poll_each(slots.len(), |wc| {
            if let Some(slot) = slots.next() {
                *slot = *wc;
            }
        })
    }

    /// `ibv_poll_cq` for a caller that takes the completions one by one: hands up to
    /// `max` of them to `take`, oldest first, and returns how many.
    pub fn poll_each(&self, max: usize, mut take: impl FnMut(&WorkCompletion)) -> Result<usize> {
        if !self.news.load(Ordering::Acquire) {
            return Ok(0);
        }
        let mut st = self.state.lock();
        if st.lost > 0 {
            return Err(Error::CqOverflow {
                cq: self.handle,
                lost: st.lost,
            });
        }
        let n = max.min(st.entries.len());
        // One at a time off the front: a drain's set-up and its drop (which moves the
        // rest of the queue back into place) cost more than the one or two entries a
        // poll usually takes.
        for _ in 0..n {
            let Some(e) = st.entries.pop_front() else { break };
            take(&e.wc);
            if let Some(m) = e.mark {
                m.slots.release_through(m.upto);
            }
        }
        if st.entries.is_empty() {
            self.news.store(false, Ordering::Relaxed);
        }
        Ok(n)
    }

    /// `ibv_req_notify_cq`.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.channel.is_none() {
            return Err(Error::invalid(
                "ibv_req_notify_cq",
                "the CQ was created without a completion channel",
            ));
        }
        let mut st = self.state.lock();
        // Arming for "next" overrides a solicited-only arm, never the other way round.
        st.arm = match (st.arm, solicited_only) {
            (Arm::Next, _) | (_, false) => Arm::Next,
            _ => Arm::Solicited,
        };
        self.armed.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the CQ is armed: a completion (a solicited one, if so armed) will signal
    /// its channel and wake whoever waits there. A hint, read without the lock.
    pub fn armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed)
    }

    /// `ibv_ack_cq_events`.
    pub fn ack_events(&self, n: u32) {
        self.events_acked.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The eventfd of the channel the CQ reports to, if it has one.
    pub fn channel_fd(&self) -> Option<RawFd> {
        self.channel.as_ref().map(|c| c.fd())
    }

    /// Events delivered but not yet acknowledged (`ibv_ack_cq_events`).
    #[cfg(test)]
    pub fn unacked_events(&self) -> u64 {
        self.events_delivered
            .load(Ordering::Relaxed)
            .saturating_sub(self.events_acked.load(Ordering::Relaxed))
    }

    /// Number of queued completions.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.state.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn wc(id: u64, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            status,
            ..Default::default()
        }
    }

    #[test]
    fn order_and_overflow() {
        let cq = CqShared::new(1, 2, None);
        assert!(cq.push(wc(1, WcStatus::Success), false));
        assert!(cq.push(wc(2, WcStatus::Success), false));
        assert!(!cq.push(wc(3, WcStatus::Success), false));
        let mut out = [WorkCompletion::default(); 4];
        // Every poll reports it, also one after the first.
        for _ in 0..2 {
            match cq.poll(&mut out) {
                Err(Error::CqOverflow { lost: 1, .. }) => {}
                other => panic!("{other:?}"),
            }
        }
        // The event is due once, whatever is lost after.
        assert!(cq.overflow_event_due());
        assert!(!cq.push(wc(4, WcStatus::Success), false));
        assert!(!cq.overflow_event_due());
        let closed = CqShared::new(2, 1, None);
        closed.close();
        closed.push(wc(1, WcStatus::Success), false);
        closed.push(wc(2, WcStatus::Success), false);
        assert!(!closed.overflow_event_due(), "no event names a destroyed CQ");
    }

    #[test]
    fn a_poll_without_the_lock_misses_nothing() {
        // One thread pushes while another polls, often finding the CQ empty (and so not
        // taking its lock): every completion arrives, once and in order.
        let cq = Arc::new(CqShared::new(1, 64, None));
        let n = 100_000u64;
        let pusher = {
            let cq = cq.clone();
            std::thread::spawn(move || {
                let mut i = 0;
                while i < n {
                    if cq.push(wc(i, WcStatus::Success), false) {
                        i += 1;
                    } else {
                        panic!("overflow: the poller fell 64 behind");
                    }
                    // Yield rather than spin: on a machine with fewer free CPUs than
                    // runnable threads a spinner holds the CPU the poller needs.
                    while cq.len() > 32 {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let mut next = 0;
        let mut out = [WorkCompletion::default(); 8];
        let deadline = Instant::now() + Duration::from_secs(60);
        while next < n {
            assert!(Instant::now() < deadline, "stuck at {next} of {n}");
            let k = cq.poll(&mut out).unwrap();
            if k == 0 {
                std::thread::yield_now();
            }
            for w in &out[..k] {
                assert_eq!(w.wr_id, next);
                next += 1;
            }
        }
        pusher.join().unwrap();
        assert_eq!(cq.poll(&mut out).unwrap(), 0);
    }

    #[test]
    fn poll_in_order() {
        let cq = CqShared::new(1, 8, None);
        for i in 0..5 {
            cq.push(wc(i, WcStatus::Success), false);
        }
        let mut out = [WorkCompletion::default(); 3];
        assert_eq!(cq.poll(&mut out).unwrap(), 3);
        assert_eq!(out.map(|w| w.wr_id), [0, 1, 2]);
        assert_eq!(cq.poll(&mut out).unwrap(), 2);
        assert_eq!(out[..2].iter().map(|w| w.wr_id).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(cq.poll(&mut out).unwrap(), 0);
        // Emptied, then pushed to again: seen.
        cq.push(wc(5, WcStatus::Success), false);
        assert_eq!(cq.poll(&mut out).unwrap(), 1);
        assert_eq!(out[0].wr_id, 5);
    }

    #[test]
    fn notify_once_and_solicited_only() {
        let ch = Arc::new(ChannelShared::new().unwrap());
        let cq = CqShared::new(7, 16, Some(ch.clone()));
        cq.push(wc(1, WcStatus::Success), false);
        assert_eq!(
            ch.get_event(Some(Duration::from_millis(1))).unwrap(),
            None,
            "not armed"
        );
        cq.req_notify(false).unwrap();
        cq.push(wc(2, WcStatus::Success), false);
        cq.push(wc(3, WcStatus::Success), false);
        assert_eq!(ch.get_event(Some(Duration::ZERO)).unwrap(), Some(7));
        assert_eq!(
            ch.get_event(Some(Duration::from_millis(1))).unwrap(),
            None,
            "one event per arm"
        );
        cq.req_notify(true).unwrap();
        cq.push(wc(4, WcStatus::Success), false);
        assert_eq!(ch.get_event(Some(Duration::from_millis(1))).unwrap(), None);
        cq.push(wc(5, WcStatus::Success), true);
        assert_eq!(ch.get_event(Some(Duration::ZERO)).unwrap(), Some(7));
        cq.req_notify(true).unwrap();
        cq.push(wc(6, WcStatus::RemAccessErr), false);
        assert_eq!(
            ch.get_event(Some(Duration::ZERO)).unwrap(),
            Some(7),
            "errors wake solicited-only"
        );
        cq.ack_events(3);
        assert_eq!(cq.unacked_events(), 0);
    }
}
