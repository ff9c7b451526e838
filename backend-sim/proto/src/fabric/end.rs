//! One end of the fabric's connection: a QP brought to RTS through `ibv_modify_qp`'s
//! state machine, its registered memory, its byte streams, and the steps the fabric
//! drives it through (posting, transmitting, receiving a frame, timers, a lost
//! connection).

use std::time::Instant;

use verbs_api::{AccessFlags, AhAttr, Mtu, QpAttr, QpAttrMask as M, QpCap, QpState, QpType, WorkCompletion};

use super::{Attrs, PD};
use crate::engine::{drive, DriveState, Stop};
use crate::memory::MrTable;
use crate::qp::{AvCheck, Qp, QpLimits};
use crate::requester::Requester;
use crate::responder::Responder;
use crate::rx::Reader;
use crate::switches::Switches;
use crate::tx::TxQueue;

/// One end of the connection: a QP, its memory, its byte streams.
pub struct End {
    /// The QP: state machine, both halves, their completions.
    pub qp: Qp,
    /// Its registered memory.
    pub mrs: MrTable,
    pub(super) reader: Reader,
    pub(super) tx: TxQueue,
    pub(super) st: DriveState,
    /// Its send completions, in the order they were produced (all of the run's, taken
    /// from the QP after each step).
    pub send_wc: Vec<WorkCompletion>,
    /// Its receive completions, with the solicited bit (the same).
    pub recv_wc: Vec<(WorkCompletion, bool)>,
    pub(super) force_rnr: u32,
    pub(super) last_tx: Option<Instant>,
    pub(super) last_rx: Option<Instant>,
}

impl End {
    pub(super) fn new(qpn: u32, dest_qpn: u32, attrs: &Attrs) -> End {
        let cap = QpCap {
            max_send_wr: 256,
            max_recv_wr: 1024,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        };
        let req = Requester::new(qpn, PD, &cap, false);
        let resp = Responder::new(qpn, PD, cap.max_recv_wr, 4);
        let mut qp = Qp::new(QpType::Rc, cap, Switches::default(), req, resp);
        // RESET -> INIT -> RTR -> RTS through `ibv_modify_qp`'s state machine, as an
        // application brings an RC QP up.
        let steps = [
            (
                QpAttr {
                    qp_state: QpState::Init,
                    port_num: 1,
                    qp_access_flags: AccessFlags::REMOTE,
                    ..Default::default()
                },
                M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rtr,
                    path_mtu: Mtu::from_raw(attrs.path_mtu.trailing_zeros().saturating_sub(7))
                        .unwrap_or(Mtu::Mtu1024),
                    dest_qp_num: dest_qpn,
                    rq_psn: attrs.psn,
                    max_dest_rd_atomic: 16,
                    min_rnr_timer: attrs.min_rnr_timer,
                    ..Default::default()
                },
                M::STATE
                    | M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rts,
                    sq_psn: attrs.psn,
                    timeout: attrs.timeout,
                    retry_cnt: attrs.retry_cnt,
                    rnr_retry: attrs.rnr_retry,
                    max_rd_atomic: 4,
                    ..Default::default()
                },
                M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
            ),
        ];
        for (attr, mask) in steps {
            qp.handle_modify(&attr, mask, &LIMITS, &Wired)
                .expect("the fabric's attributes are legal");
        }
        // The fabric's connection is up from the start.
        qp.handle_connection_up();
        End {
            qp,
            mrs: MrTable::default(),
            reader: Reader::new(),
            tx: TxQueue::new(),
            st: DriveState::default(),
            send_wc: Vec::new(),
            recv_wc: Vec::new(),
            force_rnr: 0,
            last_tx: None,
            last_rx: None,
        }
    }

    /// `ibv_post_send` on this end's QP (in ERR the WR completes flushed).
    pub fn post(&mut self, wr: &verbs_api::SendWr<'_>) -> Result<(), crate::requester::PostCheck> {
        self.qp.handle_post_send(wr, &self.mrs, None)?;
        self.qp.flush_posted_sends();
        self.take_completions();
        Ok(())
    }

    /// `ibv_post_recv` on this end's QP (in ERR the WR completes flushed where the
    /// device does so).
    pub fn post_recv(&mut self, wr: &verbs_api::RecvWr<'_>) -> Result<(), crate::recv_queue::PostRecvError> {
        self.qp.handle_post_recv(wr)?;
        self.qp.flush_posted_recvs();
        self.take_completions();
        Ok(())
    }

    /// Whether the QP went to ERR.
    pub fn in_error(&self) -> bool {
        self.qp.state() == QpState::Err
    }

    /// Appends the completions the QP produced to this end's record of them.
    pub(super) fn take_completions(&mut self) {
        let c = self.qp.poll_completions();
        self.send_wc.append(c.send);
        self.recv_wc.append(c.recv);
    }

    /// A fatal completion: the QP goes to ERR and both halves flush.
    pub(super) fn fail(&mut self) {
        self.qp.enter_error();
    }

    /// Builds what the requester may send now.
    pub(super) fn transmit(&mut self, now: Instant) {
        if !self.in_error() && self.qp.transmit_into(&self.mrs, now, &mut self.tx, 64).is_err() {
            self.fail();
        }
        self.take_completions();
    }

    /// Runs the engine over `bytes` (one whole frame) with both halves.
    pub(super) fn receive(&mut self, bytes: &[u8], now: Instant) -> Result<(), String> {
        self.last_rx = Some(now);
        let mut off = 0;
        loop {
            off += self.reader.feed(&bytes[off..]);
            let mut sides = self.qp.sides(&mut self.force_rnr);
            let r = drive(
                &mut sides,
                &mut self.reader,
                &self.mrs,
                &mut self.tx,
                now,
                &mut self.st,
                usize::MAX,
                0,
            );
            match r {
                Ok(()) => {}
                Err(Stop::Fatal(_)) => self.fail(),
                Err(Stop::Protocol(m)) => {
                    self.take_completions();
                    return Err(m);
                }
            }
            self.take_completions();
            if off >= bytes.len() {
                return Ok(());
            }
        }
    }

    /// The connection broke: new byte streams, each half recovering.
    pub(super) fn lose_connection(&mut self) {
        self.reader = Reader::new();
        self.st = DriveState::default();
        let mut gone = Vec::new();
        self.tx.drain_into(&mut gone);
        self.qp.handle_connection_lost();
        // The new byte streams are there at once.
        self.qp.handle_connection_up();
        self.take_completions();
    }

    /// The requester's timers, if due.
    pub(super) fn on_timer(&mut self, now: Instant) -> u64 {
        if self.in_error() {
            return 0;
        }
        let r = self.qp.handle_timeout(now, self.last_tx, self.last_rx);
        let timeouts = self.qp.take_ack_timeouts();
        if r.is_err() {
            self.fail();
        }
        self.take_completions();
        timeouts
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        if self.in_error() {
            None
        } else {
            self.qp.poll_timeout()
        }
    }
}

/// The device limits of the fabric's QPs.
const LIMITS: QpLimits = QpLimits {
    max_qp_init_rd_atom: 16,
    max_qp_rd_atom: 16,
};

/// The fabric's addressing: the two ends are wired to each other, any address vector
/// names the peer.
struct Wired;

impl AvCheck for Wired {
    fn check_av(&self, _: &AhAttr) -> Result<(), (&'static str, String)> {
        Ok(())
    }
}
