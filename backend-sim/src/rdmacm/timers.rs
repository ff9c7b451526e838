//! The connection manager's timers (a message's resend and the time to give up on its
//! answer, the time wait after a disconnect: [`super::cm`]): for each device, one task
//! on the device's setup runtime and the deadlines it waits for, in order.
//!
//! A timer is armed by every request, reply and disconnect, most of them in the
//! program's own threads (`rdma_connect`, `rdma_accept`, `rdma_disconnect`). Arming
//! only records the deadline; the task is woken only when the new deadline comes before
//! every other it waits for, which in a burst of calls (all armed with the same
//! interval) is the first alone. (A task spawned per timer woke the runtime's thread
//! from the program's thread for each, and kept a sleeping task per superseded timer.)
//! A timer that fires after its id moved on is ignored by the id (its generation).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::device::DeviceShared;

/// What a timer that fires calls: the id's handle and the generation it was armed at.
pub trait Fire: Send + Sync + 'static {
    /// Timer `(handle, gen)` fired.
    fn fire(&self, handle: u32, gen: u64);
}

/// A deadline: `(when, order armed, handle, generation)`.
type Deadline = (Instant, u64, u32, u64);

/// One device's deadlines, in order.
struct Wheel {
    /// Earliest first.
    due: Mutex<BinaryHeap<Reverse<Deadline>>>,
    /// Wakes the task: a deadline earlier than every other was armed.
    wake: Notify,
}

/// The timers of a connection manager's devices.
#[derive(Default)]
pub struct Timers {
    wheels: Mutex<Vec<(Weak<DeviceShared>, Arc<Wheel>)>>,
    armed: std::sync::atomic::AtomicU64,
    /// Times a task was woken by an arm.
    #[cfg(test)]
    woken: std::sync::atomic::AtomicU64,
}

impl Timers {
    /// Arms timer `(handle, gen)` to fire `after` from now, on `dev`'s runtime, calling
    /// `to`.
    pub fn arm(&self, dev: &Arc<DeviceShared>, handle: u32, gen: u64, after: Duration, to: Weak<dyn Fire>) {
        let wheel = self.wheel(dev, to);
        let at = Instant::now() + after;
        let order = self.armed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let first = {
            let mut due = wheel.due.lock();
            let first = due.peek().is_none_or(|Reverse((t, ..))| at < *t);
            due.push(Reverse((at, order, handle, gen)));
            first
        };
        if first {
            #[cfg(test)]
            self.woken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            wheel.wake.notify_one();
        }
    }

    /// `dev`'s wheel, its task started if it has none (or its device was replaced).
    fn wheel(&self, dev: &Arc<DeviceShared>, to: Weak<dyn Fire>) -> Arc<Wheel> {
        let mut wheels = self.wheels.lock();
        wheels.retain(|(d, _)| d.strong_count() > 0);
        if let Some((_, w)) = wheels
            .iter()
            .find(|(d, _)| std::ptr::eq(d.as_ptr(), Arc::as_ptr(dev)))
        {
            return w.clone();
        }
        let w = Arc::new(Wheel {
            due: Mutex::new(BinaryHeap::new()),
            wake: Notify::new(),
        });
        wheels.push((Arc::downgrade(dev), w.clone()));
        dev.setup.rt.spawn(run(w.clone(), to));
        w
    }
}

/// A device's timer task: fires each deadline once it has passed, until the runtime
/// ends or the connection manager is gone.
async fn run(wheel: Arc<Wheel>, to: Weak<dyn Fire>) {
    loop {
        let next = wheel.due.lock().peek().map(|Reverse((t, ..))| *t);
        match next {
            Some(t) if t <= Instant::now() => {}
            Some(t) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(t) => {}
                    _ = wheel.wake.notified() => continue,
                }
            }
            None => {
                wheel.wake.notified().await;
                continue;
            }
        }
        let now = Instant::now();
        let fired: Vec<(u32, u64)> = {
            let mut due = wheel.due.lock();
            let mut v = Vec::new();
            while let Some(Reverse((t, _, handle, gen))) = due.peek().copied() {
                if t > now {
                    break;
                }
                due.pop();
                v.push((handle, gen));
            }
            v
        };
        let Some(to) = to.upgrade() else {
            return;
        };
        for (handle, gen) in fired {
            to.fire(handle, gen);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs_api::Backend;

    #[derive(Default)]
    struct Fired(Mutex<Vec<(u32, u64)>>);

    impl Fire for Fired {
        fn fire(&self, handle: u32, gen: u64) {
            self.0.lock().push((handle, gen));
        }
    }

    /// Timers fire in the order of their deadlines, an earlier one armed after later
    /// ones included, and each once.
    #[test]
    fn timers_fire_once_in_the_order_of_their_deadlines() {
        let sim = crate::SimBackend::default();
        let ctx = sim.open("sim0").unwrap();
        let dev = ctx.dev.clone();
        let fired = Arc::new(Fired::default());
        let to: Weak<dyn Fire> = Arc::downgrade(&(fired.clone() as Arc<dyn Fire>));
        let timers = Timers::default();
        timers.arm(&dev, 1, 10, Duration::from_millis(60), to.clone());
        timers.arm(&dev, 2, 20, Duration::from_millis(90), to.clone());
        timers.arm(&dev, 3, 30, Duration::from_millis(5), to.clone());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while fired.0.lock().len() < 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(*fired.0.lock(), vec![(3, 30), (1, 10), (2, 20)]);
    }

    /// A burst of timers armed with one interval (a thousand `rdma_connect` calls) wakes
    /// the device's task once, for the first.
    #[test]
    fn a_burst_of_timers_wakes_the_task_once() {
        let sim = crate::SimBackend::default();
        let ctx = sim.open("sim0").unwrap();
        let fired = Arc::new(Fired::default());
        let to: Weak<dyn Fire> = Arc::downgrade(&(fired.clone() as Arc<dyn Fire>));
        let timers = Timers::default();
        for h in 0..1000 {
            timers.arm(&ctx.dev, h, 1, Duration::from_secs(60), to.clone());
        }
        assert_eq!(timers.woken.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert!(fired.0.lock().is_empty());
    }
}
