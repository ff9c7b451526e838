//! The world: every device, QP, CQ and completion channel of a deterministic run,
//! the network between them, and the one loop that moves it: `pump` (each QP builds
//! what it may send now, the frames go on the network, completions go to their CQs)
//! and `advance` (the clock moves to the next frame's arrival or the next requester
//! timer, and what is due then runs).
//!
//! The world belongs to the thread that built it (its handle, `shared.rs`, refuses any
//! other), so nothing in a run depends on a scheduler: only on the seed and on the
//! program.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use backend_sim_proto::fabric::net::InFlight;
use backend_sim_proto::fabric::{FaultMix, Net, Port, Sent};
use backend_sim_proto::memory::MrTable;
use backend_sim_proto::qp::SqSlots;
use backend_sim_proto::switches::Switches;
use verbs_api::{AsyncEvent, Error, QpState, Result, WcStatus, WorkCompletion};

use crate::refuse::refused;

/// Empty CQ polls in a row, with nothing left to happen in the world, after which a
/// poll fails instead of returning 0 again: the program waits for a completion that
/// nothing will produce (a hang on hardware).
pub const IDLE_POLLS: u32 = 10_000;

/// The kinds of the seed's choices ([`backend_sim_proto::faults::network::Decider::choice`]):
/// QPNs, and each device's keys (`KEYS + device`).
const QPNS: u64 = 1 << 40;
const KEYS: u64 = 1 << 41;

/// One device: its name, its registered memory.
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) mrs: MrTable,
    keys: u64,
}

/// A QP of the world: its device, its protocol core on the network, its CQs.
pub(crate) struct QpSlot {
    pub(crate) dev: usize,
    /// The context that made it, which its asynchronous events go to.
    pub(crate) ctx: usize,
    pub(crate) port: Port,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
}

/// A completion in a CQ, and for a send completion under `SlotRelease::AtPoll` the
/// send queue slots polling it frees (every WQE of its QP up to the mark, see
/// [`SqSlots`]).
pub(crate) struct Entry {
    pub(crate) wc: WorkCompletion,
    pub(crate) mark: Option<(Arc<SqSlots>, u64)>,
}

/// A CQ's entries, capacity and notification.
pub(crate) struct CqState {
    pub(crate) entries: VecDeque<Entry>,
    pub(crate) cap: u32,
    /// Completions that found it full.
    pub(crate) lost: u64,
    /// `ibv_req_notify_cq` armed it (`Some(solicited_only)`).
    pub(crate) armed: Option<bool>,
    pub(crate) channel: Option<u32>,
}

/// The world.
pub(crate) struct World {
    pub(crate) net: Net,
    /// How every QP of the world behaves where devices differ.
    pub(crate) sw: Switches,
    /// How far a wait may run the world past the program's last step.
    pub(crate) budget: Duration,
    /// The virtual time of the program's last step (a post, a modify, a completion or an
    /// event taken).
    pub(crate) last_step: Duration,
    /// The local ACK timeouts counted at that step.
    pub(crate) timeouts_at_step: u64,
    pub(crate) devices: Vec<Device>,
    /// By QPN (unique in the world), iterated in order: every pass is deterministic.
    pub(crate) qps: BTreeMap<u32, QpSlot>,
    pub(crate) cqs: Vec<CqState>,
    /// Each open context's asynchronous events (`ibv_get_async_event` reads its own).
    pub(crate) contexts: Vec<VecDeque<AsyncEvent>>,
    /// Each channel's events: the handles of the CQs that raised them.
    pub(crate) channels: Vec<VecDeque<u32>>,
    qpns: u64,
    pds: u32,
    srqs: u32,
    idle_polls: u32,
}

impl World {
    /// A world of devices `hosts` under `seed`, its network's faults `mix`, its QPs
    /// behaving as `sw` says, its waits bounded by `budget` (see [`crate::budget`]).
    pub(crate) fn new(seed: u64, mix: FaultMix, hosts: Vec<String>, sw: Switches, budget: Duration) -> World {
        World {
            net: Net::new(seed, mix),
            sw,
            budget,
            last_step: Duration::ZERO,
            timeouts_at_step: 0,
            devices: hosts
                .into_iter()
                .map(|name| Device {
                    name,
                    mrs: MrTable::default(),
                    keys: 0,
                })
                .collect(),
            qps: BTreeMap::new(),
            cqs: Vec::new(),
            contexts: Vec::new(),
            channels: Vec::new(),
            qpns: 0,
            pds: 0,
            srqs: 0,
            idle_polls: 0,
        }
    }

    /// A QPN from the seed (24 bits, not 0 or 1, unused).
    pub(crate) fn fresh_qpn(&mut self) -> u32 {
        loop {
            self.qpns += 1;
            let n = self.net.decider().choice(QPNS, self.qpns) & 0xff_ffff;
            if n > 1 && !self.qps.contains_key(&n) {
                return n;
            }
        }
    }

    /// An MR key of device `dev` from the seed.
    pub(crate) fn fresh_key(&mut self, dev: usize) -> u32 {
        let d = self.net.decider();
        let device = &mut self.devices[dev];
        let keys = &mut device.keys;
        device.mrs.fresh_key(|| {
            *keys += 1;
            d.choice(KEYS + dev as u64, *keys)
        })
    }

    /// A PD handle.
    pub(crate) fn fresh_pd(&mut self) -> u32 {
        self.pds += 1;
        self.pds
    }

    /// An SRQ handle (what its limit event names).
    pub(crate) fn fresh_srq(&mut self) -> u32 {
        self.srqs += 1;
        self.srqs
    }

    /// Each QP builds what it may send now and its frames go on the network; every
    /// completion and event produced goes where it belongs.
    pub(crate) fn pump(&mut self) {
        let now = self.net.instant();
        let qpns: Vec<u32> = self.qps.keys().copied().collect();
        for qpn in qpns {
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            slot.port.transmit(&self.devices[slot.dev].mrs, now);
            let mut bytes = Vec::new();
            if slot.port.take_frames(now, &mut bytes) {
                let link = (u64::from(qpn) << 32) | u64::from(slot.port.qp.attr().dest_qp_num);
                match self.net.send(link, slot.port.path_mtu(), &bytes) {
                    Ok(Sent::Scheduled) => {}
                    Ok(Sent::Reset) => self.reset(link),
                    Err(m) => tracing::error!(qpn, "det: {m}"),
                }
            }
        }
        self.route();
    }

    /// Completions to their CQs (and the trace), events to their contexts.
    fn route(&mut self) {
        let mut marks = Vec::new();
        for (&qpn, slot) in &mut self.qps {
            let mut c = slot.port.qp.poll_completions();
            marks.clear();
            c.take_marks(&mut marks);
            let (send, slots) = c.send_with_slots();
            let slots = slots.clone();
            let mut marks = marks.drain(..);
            let send: Vec<_> = send
                .drain(..)
                .map(|w| (w, marks.next().map(|upto| (slots.clone(), upto))))
                .collect();
            for (w, mark) in send {
                self.net.trace_completion(u64::from(qpn), false, &w);
                let e = Entry { wc: w, mark };
                push_completion(&mut self.cqs, &mut self.channels, slot.send_cq, e, false);
            }
            for (w, solicited) in c.recv.drain(..) {
                self.net.trace_completion(u64::from(qpn), true, &w);
                let e = Entry { wc: w, mark: None };
                push_completion(&mut self.cqs, &mut self.channels, slot.recv_cq, e, solicited);
            }
            slot.port.qp.check_drained();
            self.contexts[slot.ctx].extend(slot.port.qp.poll_events());
        }
    }

    /// QP `qpn` was reset or destroyed: on a device that cleans CQs
    /// (`Switches::cq_clean_on_reset`, mlx5) its completions leave its CQs.
    pub(crate) fn clean_cqs(&mut self, qpn: u32, cqs: [u32; 2]) {
        if !self.sw.cq_clean_on_reset {
            return;
        }
        for h in cqs {
            if let Some(cq) = self.cqs.get_mut(h as usize) {
                cq.entries.retain(|e| e.wc.qp_num != qpn);
            }
        }
    }

    /// When the next thing happens (a frame arrives, a requester's timer is due).
    pub(crate) fn next_event(&self) -> Option<Duration> {
        let timers = self
            .qps
            .values()
            .filter_map(|s| s.port.next_deadline())
            .map(|d| self.net.since_start(d));
        self.net.next_at().into_iter().chain(timers).min()
    }

    /// Whether nothing is left to happen: no frame in flight, no timer armed.
    pub(crate) fn idle(&self) -> bool {
        self.next_event().is_none()
    }

    /// Moves the clock to the next point in time something happens (not past `until`)
    /// and runs what is due then. Whether anything ran; when nothing is left to happen
    /// and `until` is given, the clock moves to it (a wait that times out).
    pub(crate) fn advance(&mut self, until: Option<Duration>) -> bool {
        self.pump();
        let next = self.next_event();
        let t = match (next, until) {
            (Some(t), Some(u)) if t > u => None,
            (Some(t), _) => Some(t),
            (None, _) => None,
        };
        let Some(t) = t else {
            if let Some(u) = until {
                self.net.advance(u);
            }
            return false;
        };
        self.idle_polls = 0;
        self.net.advance(t);
        while self.net.next_at().is_some_and(|a| a <= self.net.now()) {
            let f = self.net.pop().expect("a frame is due");
            self.deliver(f);
        }
        let now = self.net.instant();
        for slot in self.qps.values_mut() {
            if slot.port.next_deadline().is_some_and(|d| d <= now) {
                self.net.stats.timeouts += slot.port.on_timer(now);
            }
        }
        self.pump();
        true
    }

    /// A poll of `what` found nothing and the world has nothing left to do: fine a few
    /// times, then an error saying why the program waits forever.
    pub(crate) fn idle_poll(&mut self, what: &str) -> Result<()> {
        self.idle_polls += 1;
        if self.idle_polls <= IDLE_POLLS {
            return Ok(());
        }
        self.idle_polls = 0;
        Err(refused(format!(
            "{what} was polled {IDLE_POLLS} times in a row with nothing left to happen in the \
             deterministic world (no frame in flight, no timer armed, at virtual time {:?}): \
             the completion waited for will never come. Post the work that produces it \
             (e.g. the peer's receive or send) before polling: in one thread, client and \
             server take turns",
            self.net.now()
        )))
    }

    /// The program did something (a post, a modify, a completion or an event taken): the
    /// idle count and the budget of the next wait restart.
    pub(crate) fn progressed(&mut self) {
        self.idle_polls = 0;
        self.last_step = self.net.now();
        self.timeouts_at_step = self.net.stats.timeouts;
    }

    /// Frame `f` arrives: its QP takes it if it is the sender's peer and past INIT; a
    /// frame for no QP, or from a QP that is not its peer, is dropped (as a real
    /// fabric drops a packet for a QP that does not exist).
    fn deliver(&mut self, f: InFlight) {
        let (src, dst) = ((f.link >> 32) as u32, f.link as u32);
        let now = self.net.instant();
        let Some(slot) = self.qps.get_mut(&dst) else {
            return;
        };
        let qp = &slot.port.qp;
        if qp.attr().dest_qp_num != src || matches!(qp.state(), QpState::Reset | QpState::Init) {
            return;
        }
        let mrs = &self.devices[slot.dev].mrs;
        self.net.delivered(&f, mrs);
        if let Err(m) = slot.port.receive(&f.bytes, mrs, now) {
            tracing::warn!(qpn = dst, "det: the peer broke the protocol: {m}");
            slot.port.qp.handle_protocol_error();
            slot.port.qp.enter_error();
        }
    }

    /// The connection of `link` breaks: both directions lose what is in flight, both
    /// ends start new byte streams and recover.
    fn reset(&mut self, link: u64) {
        let back = link.rotate_left(32);
        self.net.drop_links(|l| l == link || l == back);
        for qpn in [(link >> 32) as u32, link as u32] {
            if let Some(slot) = self.qps.get_mut(&qpn) {
                slot.port.lose_connection();
            }
        }
    }
}

/// Puts `e` in CQ `h` (counted lost when it is full), raising the event its arming asks.
fn push_completion(cqs: &mut [CqState], channels: &mut [VecDeque<u32>], h: u32, e: Entry, solicited: bool) {
    let Some(cq) = cqs.get_mut(h as usize) else { return };
    if cq.entries.len() >= cq.cap as usize {
        cq.lost += 1;
        return;
    }
    let fires = cq
        .armed
        .is_some_and(|only| !only || solicited || e.wc.status != WcStatus::Success);
    cq.entries.push_back(e);
    if fires {
        cq.armed = None;
        if let Some(ch) = cq.channel.and_then(|c| channels.get_mut(c as usize)) {
            ch.push_back(h);
        }
    }
}

/// The CQ overflow error of CQ `h`, which lost `lost` completions.
pub(crate) fn overflow(h: u32, lost: u64) -> Error {
    Error::CqOverflow { cq: h, lost }
}
