//! One end of the fabric's connection: a QP brought to RTS through `ibv_modify_qp`'s
//! state machine (both directions from [`Attrs::psn`]), on the network through a
//! [`Port`], with its registered memory and the completions it produced.

use verbs_api::{AccessFlags, AhAttr, Mtu, QpAttr, QpAttrMask as M, QpCap, QpState, QpType, WorkCompletion};

use super::{Attrs, Port, PD};
use crate::memory::MrTable;
use crate::qp::{AvCheck, Qp, QpLimits};
use crate::requester::Requester;
use crate::responder::Responder;
use crate::switches::Switches;

/// One end of the connection: a QP on the network, its memory, its completions.
pub struct End {
    /// The QP and its connection.
    pub port: Port,
    /// Its registered memory.
    pub mrs: MrTable,
    /// Its send completions, in the order they were produced (all of the run's, taken
    /// from the QP after each step).
    pub send_wc: Vec<WorkCompletion>,
    /// Its receive completions, with the solicited bit (the same).
    pub recv_wc: Vec<(WorkCompletion, bool)>,
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
        End {
            port: Port::new(qp),
            mrs: MrTable::default(),
            send_wc: Vec::new(),
            recv_wc: Vec::new(),
        }
    }

    /// `ibv_post_send` on this end's QP (in ERR the WR completes flushed).
    pub fn post(&mut self, wr: &verbs_api::SendWr<'_>) -> Result<(), crate::requester::PostCheck> {
        self.port.qp.handle_post_send(wr, &self.mrs, None)?;
        self.port.qp.flush_posted_sends();
        self.take_completions();
        Ok(())
    }

    /// `ibv_post_recv` on this end's QP (in ERR the WR completes flushed where the
    /// device does so).
    pub fn post_recv(&mut self, wr: &verbs_api::RecvWr<'_>) -> Result<(), crate::recv_queue::PostRecvError> {
        self.port.qp.handle_post_recv(wr)?;
        self.port.qp.flush_posted_recvs();
        self.take_completions();
        Ok(())
    }

    /// The QP.
    pub fn qp(&self) -> &Qp {
        &self.port.qp
    }

    /// Whether the QP went to ERR.
    pub fn in_error(&self) -> bool {
        self.port.in_error()
    }

    /// Appends the completions the QP produced to this end's record of them.
    pub(super) fn take_completions(&mut self) {
        let c = self.port.qp.poll_completions();
        self.send_wc.append(c.send);
        self.recv_wc.append(c.recv);
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
