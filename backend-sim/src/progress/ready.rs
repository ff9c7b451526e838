//! QPs queued to transmit their send queues (by the next poll of a thread that drives
//! progress, else by the progress thread), each at most once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::qp::QpShared;

pub(super) struct ReadyQueue {
    queue: Mutex<VecDeque<Arc<QpShared>>>,
    /// Whether `queue` may be non-empty (set and cleared under its lock; read without it
    /// on every poll).
    pending: AtomicBool,
}

impl ReadyQueue {
    pub fn new() -> ReadyQueue {
        ReadyQueue {
            // Room for the QPs of a typical device: no allocation on the data path later.
            queue: Mutex::new(VecDeque::with_capacity(64)),
            pending: AtomicBool::new(false),
        }
    }

    /// Queues `qp` unless it is queued already; returns whether it was added.
    pub fn push(&self, qp: &Arc<QpShared>) -> bool {
        if qp.tx_queued.swap(true, Ordering::AcqRel) {
            return false;
        }
        let mut r = self.queue.lock();
        r.push_back(qp.clone());
        // SeqCst: paired with the progress thread's `sleeping` store and its look here
        // before it sleeps (see `Progress::schedule`).
        self.pending.store(true, Ordering::SeqCst);
        true
    }

    /// The next queued QP (no longer marked queued).
    pub fn pop(&self) -> Option<Arc<QpShared>> {
        let next = {
            let mut r = self.queue.lock();
            let next = r.pop_front();
            if next.is_none() {
                self.pending.store(false, Ordering::Release);
            }
            next
        };
        if let Some(qp) = &next {
            qp.tx_queued.store(false, Ordering::Release);
        }
        next
    }

    /// Whether anything may be queued.
    pub fn pending(&self) -> bool {
        self.pending.load(Ordering::SeqCst)
    }
}
