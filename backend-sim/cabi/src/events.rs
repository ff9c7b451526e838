//! Asynchronous events (`man ibv_get_async_event`, `man ibv_ack_async_event`): the sim's
//! events of a context, naming the program's objects.
//!
//! Destroying a QP, CQ or SRQ waits until the events taken for it are acknowledged, and
//! a program may acknowledge from another thread while the destroy waits. So the
//! acknowledgement cannot look the object up (it is already on its way out); instead each
//! event handed out is remembered by its element's address with what acknowledging it
//! needs: the sim's device and its name for the element.
//! Port and device events name no object and nothing waits for them: they are
//! acknowledged to the sim as they are handed out.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;
use verbs_api::{AsyncElement, AsyncEvent, AsyncEventType, Context as _};

use crate::abi::{ibv_async_element, ibv_async_event, ibv_context};
use crate::context::{self, Context};
use crate::ffi::{errno_of, minus_one_verb, void_verb};
use crate::runtime::SimContext;

/// An event handed out for an element: the device, the element as the sim names it, and
/// how many such events are not yet acknowledged.
type Taken = (Arc<SimContext>, AsyncElement, u32);

/// Events handed out and not yet acknowledged, by element address.
static TAKEN: LazyLock<Mutex<HashMap<usize, Taken>>> = LazyLock::new(Default::default);

/// The program's object an element names, if it still exists.
fn element_ptr(ctx: &Context, e: AsyncElement) -> Option<usize> {
    let el = ctx.elements.lock();
    match e {
        AsyncElement::Qp(n) => el.qps.get(&n).copied(),
        AsyncElement::Cq(h) => el.cqs.get(&h).copied(),
        AsyncElement::Srq(h) => el.srqs.get(&h).copied(),
        AsyncElement::Wq(_) | AsyncElement::Port(_) | AsyncElement::Device => None,
    }
}

/// `ibv_get_async_event`: reads the context's `async_fd` as libibverbs does, so it waits
/// for the next event (or, on a descriptor the program made non-blocking, fails at once
/// with EAGAIN when there is none) and a signal interrupts the wait (EINTR, unless the
/// handler was installed with `SA_RESTART`). 0, or -1 with errno.
pub(crate) unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    minus_one_verb("ibv_get_async_event", || {
        // SAFETY: the program does not close the device while waiting on it.
        let c = unsafe { context::get(ctx) }?;
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        loop {
            let ev = c
                .sim
                .read_async_event()
                .map_err(|e| errno_of("ibv_get_async_event", &e))?;
            let event_type = ev.event_type as u32;
            let element = match ev.element {
                AsyncElement::Port(p) => {
                    c.sim.ack_async_event(ev);
                    ibv_async_element { port_num: p as c_int }
                }
                AsyncElement::Device | AsyncElement::Wq(_) => {
                    c.sim.ack_async_event(ev);
                    ibv_async_element { port_num: 0 }
                }
                e => match element_ptr(c, e) {
                    Some(p) => {
                        let mut taken = TAKEN.lock();
                        let entry = taken.entry(p).or_insert_with(|| (c.sim.clone(), e, 0));
                        entry.2 += 1;
                        ibv_async_element { qp: p as *mut _ }
                    }
                    None => {
                        // Its object is gone (an event raised as it was destroyed).
                        c.sim.ack_async_event(ev);
                        continue;
                    }
                },
            };
            // SAFETY: the program passes a `struct ibv_async_event *`.
            unsafe { event.write(ibv_async_event { element, event_type }) };
            return Ok(0);
        }
    })
}

/// `ibv_ack_async_event`.
pub(crate) unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    void_verb("ibv_ack_async_event", || {
        if event.is_null() {
            return;
        }
        // SAFETY: the program passes the event it took.
        let ev = unsafe { &*event };
        let Some(event_type) = AsyncEventType::from_raw(ev.event_type) else {
            return;
        };
        // SAFETY: every member of the element union is plain data.
        let p = unsafe { ev.element.qp } as usize;
        let mut taken = TAKEN.lock();
        let Some(entry) = taken.get_mut(&p) else {
            // A port or device event (acknowledged already), or one never handed out.
            return;
        };
        let (dev, element) = (entry.0.clone(), entry.1);
        entry.2 -= 1;
        if entry.2 == 0 {
            taken.remove(&p);
        }
        drop(taken);
        dev.ack_async_event(AsyncEvent { event_type, element });
    })
}
