//! The UD QPs whose next datagram found a queue of bytes full (a link's, or the device's
//! own): their WQEs wait in the send queue, as an HCA's wait for the wire, and the thread
//! that makes room in the queue hands them back to [`Datagrams::transmit`](super::Datagrams::transmit).
//!
//! A sender registers under the queue's lock after finding it full, and the writer takes
//! the waiters under the same lock after finding room, so no wake-up is lost between the
//! two.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::qp::QpShared;

/// QPs waiting for room in one queue (each at most once).
#[derive(Default)]
pub struct Waiters(Mutex<Vec<Weak<QpShared>>>);

impl Waiters {
    /// `qp` waits for room (call under the queue's lock).
    pub fn add(&self, qp: &Arc<QpShared>) {
        let mut w = self.0.lock();
        if !w.iter().any(|x| std::ptr::eq(x.as_ptr(), Arc::as_ptr(qp))) {
            w.push(Arc::downgrade(qp));
        }
    }

    /// Moves every waiting QP to `out` (call under the queue's lock, once it has room).
    pub fn take_into(&self, out: &mut Vec<Weak<QpShared>>) {
        let mut w = self.0.lock();
        if !w.is_empty() {
            out.append(&mut w);
        }
    }
}
