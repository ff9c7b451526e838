//! `ibv_modify_qp` (IBA 11.2.5 "Modify Queue Pair", `man ibv_modify_qp`): the transition
//! and its attribute mask checked against the state machine
//! ([`verbs_api::transitions::check_modify`], shared with the libibverbs backend), each
//! attribute value checked against the device as `ib_modify_qp` does (each failure an
//! EINVAL that names it), the attributes applied, and what the transition sets in
//! motion: RTR connects the responder (a UD QP has no peer: it receives from RTR on,
//! from anyone with its Q_Key), RTS arms the requester, RTS -> SQD stops starting WQEs
//! (and with `en_sqd_async_notify` owes `IBV_EVENT_SQ_DRAINED` once those in flight are
//! complete), SQD -> RTS and SQE -> RTS let the send queue go again, RESET empties both
//! queues without completions. No modify leads to SQE: only a send error does
//! ([`Qp::enter_sqe`]). A refused modify changes nothing.

use verbs_api::timers::local_ack_timeout;
use verbs_api::transitions::check_modify;
use verbs_api::{AhAttr, Error, QpAttr, QpAttrMask as M, QpState, QpType, Result, PSN_MASK};

use super::Qp;
use crate::requester::ReqAttrs;
use crate::responder::RespAttrs;

/// The device limits a modify's attribute values are checked against.
#[derive(Debug, Clone, Copy)]
pub struct QpLimits {
    /// `max_qp_init_rd_atom`: the most READs and atomics a QP may have outstanding as
    /// requester (`max_rd_atomic`).
    pub max_qp_init_rd_atom: u32,
    /// `max_qp_rd_atom`: the most a QP serves as responder (`max_dest_rd_atomic`).
    pub max_qp_rd_atom: u32,
}

/// The device's check of an address vector (its GID table and link layer), which the
/// driver owns: an error names the attribute and says why.
pub trait AvCheck {
    /// Checks `ah` (`IBV_QP_AV`).
    fn check_av(&self, ah: &AhAttr) -> std::result::Result<(), (&'static str, String)>;
}

/// What a transition asks of the driver, once the QP's state and halves have moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Nothing beyond the state and the attributes.
    None,
    /// To RESET: both queues were emptied without completions and the attributes are
    /// back to their defaults; the driver forgets the connection (closes it, drops what
    /// its CQs hold of the QP where the device cleans them).
    Reset,
    /// To ERR: the driver takes the QP there with [`Qp::enter_error`] (the one path to
    /// ERR) after it has sent the ACKs the connection owes.
    Error,
    /// INIT -> RTR of a connected QP: the responder expects `rq_psn`; the driver sets up
    /// the connection to the peer named by the address vector and `dest_qp_num`.
    Connect,
    /// To RTS from RTS, SQD or SQE: the send queue may go; `start`: WQEs posted in SQD
    /// wait and the device resumes them at once (`Switches::sqd_rts_resumes`).
    Resume {
        /// Start the send queue now.
        start: bool,
    },
}

/// A modify that was applied: the state it left, the state it reached, and what it asks
/// of the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The state before.
    pub from: QpState,
    /// The state requested (ERR is reached through [`Qp::enter_error`]).
    pub to: QpState,
    /// What the driver does about it.
    pub effect: Effect,
}

fn check_values(attr: &QpAttr, mask: M, limits: &QpLimits, av: &dyn AvCheck) -> Result<()> {
    let bad = |name: &'static str, reason: String| Err(Error::InvalidAttr { name, reason });
    if mask.contains(M::PORT) && attr.port_num != 1 {
        return bad(
            "port_num",
            format!("port {} does not exist (the device has port 1)", attr.port_num),
        );
    }
    if mask.contains(M::PKEY_INDEX) && attr.pkey_index != 0 {
        return bad(
            "pkey_index",
            format!("index {} is outside the P_Key table of 1 entry", attr.pkey_index),
        );
    }
    if mask.contains(M::AV) {
        let ah = &attr.ah_attr;
        if ah.port_num > 1 {
            return bad("ah_attr.port_num", format!("port {} does not exist", ah.port_num));
        }
        if let Err((name, reason)) = av.check_av(ah) {
            return bad(name, reason);
        }
    }
    if mask.contains(M::TIMEOUT) && attr.timeout > 31 {
        return bad("timeout", format!("{} exceeds 31", attr.timeout));
    }
    if mask.contains(M::RETRY_CNT) && attr.retry_cnt > 7 {
        return bad("retry_cnt", format!("{} exceeds 7", attr.retry_cnt));
    }
    if mask.contains(M::RNR_RETRY) && attr.rnr_retry > 7 {
        return bad("rnr_retry", format!("{} exceeds 7", attr.rnr_retry));
    }
    if mask.contains(M::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return bad("min_rnr_timer", format!("{} exceeds 31", attr.min_rnr_timer));
    }
    if mask.contains(M::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic as u32 > limits.max_qp_init_rd_atom {
        return bad(
            "max_rd_atomic",
            format!(
                "{} exceeds the device's max_qp_init_rd_atom {}",
                attr.max_rd_atomic, limits.max_qp_init_rd_atom
            ),
        );
    }
    if mask.contains(M::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic as u32 > limits.max_qp_rd_atom {
        return bad(
            "max_dest_rd_atomic",
            format!(
                "{} exceeds the device's max_qp_rd_atom {}",
                attr.max_dest_rd_atomic, limits.max_qp_rd_atom
            ),
        );
    }
    if mask.contains(M::DEST_QPN) && attr.dest_qp_num > PSN_MASK {
        return bad("dest_qp_num", format!("{:#x} exceeds 24 bits", attr.dest_qp_num));
    }
    if mask.contains(M::CAP) {
        return bad(
            "cap",
            "resizing queues with ibv_modify_qp is not supported".into(),
        );
    }
    Ok(())
}

/// The attributes of the requester's budget, which SQD -> SQD may change.
const BUDGET: M = M::TIMEOUT
    .union(M::RETRY_CNT)
    .union(M::RNR_RETRY)
    .union(M::MAX_QP_RD_ATOMIC);

impl Qp {
    /// Checks a modify call (transition, mask, values) without applying it: the state it
    /// would reach.
    pub fn check_modify(
        &self,
        attr: &QpAttr,
        mask: M,
        limits: &QpLimits,
        av: &dyn AvCheck,
    ) -> Result<QpState> {
        let next = check_modify(self.state, self.qp_type, attr, mask)?;
        check_values(attr, mask, limits, av)?;
        Ok(next)
    }

    /// `ibv_modify_qp`: checks the call, and if it is legal applies the attributes, moves
    /// the state (ERR excepted: [`Effect::Error`]) and the two halves, and says what is
    /// left to the driver. A refused call changes nothing.
    pub fn handle_modify(
        &mut self,
        attr: &QpAttr,
        mask: M,
        limits: &QpLimits,
        av: &dyn AvCheck,
    ) -> Result<Transition> {
        let cur = self.state;
        let next = self.check_modify(attr, mask, limits, av)?;
        self.apply(attr, mask);
        let a = self.attr;
        let (req, resp) = (&mut self.req, &mut self.resp);
        resp.access = a.qp_access_flags;
        resp.max_dest_rd_atomic = a.max_dest_rd_atomic;
        resp.min_rnr_timer = a.min_rnr_timer;
        resp.qkey = a.qkey;
        req.qkey = a.qkey;
        let mut effect = Effect::None;
        match next {
            QpState::Reset => {
                req.reset();
                resp.reset();
                self.attr = QpAttr {
                    cap: self.cap,
                    ..Default::default()
                };
                effect = Effect::Reset;
            }
            QpState::Err => effect = Effect::Error,
            // A UD QP has no peer: RTR only lets it receive.
            QpState::Rtr if cur == QpState::Init && self.qp_type != QpType::Ud => {
                req.dest_qpn = a.dest_qp_num;
                // Not connected yet (see `Requester::link_error`).
                req.link_error = libc::ENOTCONN as u32;
                resp.connect(RespAttrs {
                    rq_psn: a.rq_psn,
                    min_rnr_timer: a.min_rnr_timer,
                });
                // A message takes a PSN per packet of the path MTU, on both ends.
                resp.set_path_mtu(a.path_mtu.bytes());
                req.set_path_mtu(a.path_mtu.bytes());
                effect = Effect::Connect;
            }
            QpState::Rts if cur == QpState::Rtr => {
                req.connect(Self::req_attrs(&a));
                req.draining = false;
            }
            QpState::Rts => {
                req.draining = false;
                // (`Switches::sqd_rts_resumes` off, as on rxe: they wait for the next post.)
                let start = cur == QpState::Sqd && req.has_unsent() && self.sw.sqd_rts_resumes;
                effect = Effect::Resume { start };
            }
            QpState::Sqd => {
                req.draining = true;
                // SQD -> SQD is where the requester's budget may change (IBA 11.2.5.2;
                // rxe's `rxe_qp_from_attr` takes it at once): the WQEs sent after
                // the return to RTS count against the new one.
                if cur == QpState::Sqd && mask.intersects(BUDGET) {
                    req.set_budget(Self::req_attrs(&a));
                }
                if cur == QpState::Rts {
                    // IBA 11.6.3.1 and `man ibv_modify_qp`: the event only when asked
                    // for with this transition; rxe raises it whatever the flag says
                    // (`Switches::sq_drained_unasked`).
                    self.sqd_event_due = (mask.contains(M::EN_SQD_ASYNC_NOTIFY) && attr.en_sqd_async_notify)
                        || self.sw.sq_drained_unasked;
                }
            }
            _ => {}
        }
        if next != QpState::Sqd {
            self.sqd_event_due = false;
        }
        if next != QpState::Err {
            self.state = next;
        }
        Ok(Transition {
            from: cur,
            to: next,
            effect,
        })
    }

    /// The requester's attributes among the QP's `a`.
    fn req_attrs(a: &QpAttr) -> ReqAttrs {
        ReqAttrs {
            sq_psn: a.sq_psn,
            timeout: local_ack_timeout(a.timeout),
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            max_rd_atomic: a.max_rd_atomic,
        }
    }

    /// Sets the attributes `mask` names from `attr`.
    fn apply(&mut self, attr: &QpAttr, mask: M) {
        let a = &mut self.attr;
        macro_rules! copy {
            ($($bit:ident => $field:ident),* $(,)?) => {
                $(if mask.contains(M::$bit) {
                    a.$field = attr.$field;
                })*
            };
        }
        copy!(
            ACCESS_FLAGS => qp_access_flags,
            PKEY_INDEX => pkey_index,
            PORT => port_num,
            AV => ah_attr,
            PATH_MTU => path_mtu,
            DEST_QPN => dest_qp_num,
            TIMEOUT => timeout,
            RETRY_CNT => retry_cnt,
            RNR_RETRY => rnr_retry,
            MIN_RNR_TIMER => min_rnr_timer,
            EN_SQD_ASYNC_NOTIFY => en_sqd_async_notify,
            QKEY => qkey,
        );
        if mask.contains(M::RQ_PSN) {
            a.rq_psn = attr.rq_psn & PSN_MASK;
        }
        if mask.contains(M::SQ_PSN) {
            a.sq_psn = attr.sq_psn & PSN_MASK;
        }
        // rxe and mlx5 grant the next power of two (`Switches::rd_atomic_pow2`); 0 stays
        // 0 (no resources).
        let pow2 = self.sw.rd_atomic_pow2;
        let rd_atomic = |n: u8| {
            if n > 0 && pow2 {
                n.checked_next_power_of_two().unwrap_or(n)
            } else {
                n
            }
        };
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = rd_atomic(attr.max_rd_atomic);
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = rd_atomic(attr.max_dest_rd_atomic);
        }
    }
}
