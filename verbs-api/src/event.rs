//! Asynchronous events: `enum ibv_event_type` and `struct ibv_async_event`
//! (`man ibv_get_async_event`).
//!
//! Errors and conditions that no work request reports arrive on the device context, not
//! on a CQ: a QP that hit a fatal error outside a WR, a CQ that overflowed, an SRQ that
//! drained below its limit, a port that went down, ... Each event names its element: a QP
//! by number, a CQ or SRQ by [`handle`](crate::CompletionQueue::handle), a port by number.
//! [`Context::get_async_event`](crate::Context::get_async_event) waits for the next one
//! (or poll [`Context::async_fd`](crate::Context::async_fd); `aio::AsyncEvents` is the
//! tokio stream), and every event taken must be acknowledged with
//! [`Context::ack_async_event`](crate::Context::ack_async_event), as `ibv_ack_async_event`
//! requires: destroying a QP, CQ or SRQ waits until the events taken for it are
//! acknowledged. Events nobody took are dropped with the object.

/// `enum ibv_event_type`, with libibverbs' numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AsyncEventType {
    /// `IBV_EVENT_CQ_ERR`: the CQ overflowed (a completion was lost); it is in error.
    CqErr = 0,
    /// `IBV_EVENT_QP_FATAL`: the QP hit an error it cannot report in a completion.
    QpFatal = 1,
    /// `IBV_EVENT_QP_REQ_ERR`: a responder found an invalid request (transport error).
    QpReqErr = 2,
    /// `IBV_EVENT_QP_ACCESS_ERR`: a responder refused a remote access.
    QpAccessErr = 3,
    /// `IBV_EVENT_COMM_EST`: the first message arrived on a QP in RTR.
    CommEst = 4,
    /// `IBV_EVENT_SQ_DRAINED`: the send queue of a QP moved to SQD has drained.
    SqDrained = 5,
    /// `IBV_EVENT_PATH_MIG`: the QP migrated to its alternate path.
    PathMig = 6,
    /// `IBV_EVENT_PATH_MIG_ERR`: path migration failed.
    PathMigErr = 7,
    /// `IBV_EVENT_DEVICE_FATAL`: the device is unusable; close it.
    DeviceFatal = 8,
    /// `IBV_EVENT_PORT_ACTIVE`: the port became active.
    PortActive = 9,
    /// `IBV_EVENT_PORT_ERR`: the port went down.
    PortErr = 10,
    /// `IBV_EVENT_LID_CHANGE`: the port's LID changed.
    LidChange = 11,
    /// `IBV_EVENT_PKEY_CHANGE`: the port's P_Key table changed.
    PkeyChange = 12,
    /// `IBV_EVENT_SM_CHANGE`: the subnet manager changed.
    SmChange = 13,
    /// `IBV_EVENT_SRQ_ERR`: the SRQ hit an error; its QPs go to ERR.
    SrqErr = 14,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: the SRQ holds fewer receives than its armed limit;
    /// the limit is disarmed.
    SrqLimitReached = 15,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP on an SRQ went to ERR and will take no more
    /// receives from it (it may now be destroyed without losing any).
    QpLastWqeReached = 16,
    /// `IBV_EVENT_CLIENT_REREGISTER`: the SM asks clients to register again.
    ClientReregister = 17,
    /// `IBV_EVENT_GID_CHANGE`: the port's GID table changed.
    GidChange = 18,
    /// `IBV_EVENT_WQ_FATAL`: a work queue hit a fatal error.
    WqFatal = 19,
}

impl AsyncEventType {
    /// Every type, by number.
    pub const ALL: [AsyncEventType; 20] = {
        use AsyncEventType::*;
        [
            CqErr,
            QpFatal,
            QpReqErr,
            QpAccessErr,
            CommEst,
            SqDrained,
            PathMig,
            PathMigErr,
            DeviceFatal,
            PortActive,
            PortErr,
            LidChange,
            PkeyChange,
            SmChange,
            SrqErr,
            SrqLimitReached,
            QpLastWqeReached,
            ClientReregister,
            GidChange,
            WqFatal,
        ]
    };

    /// From the raw `ibv_event_type` value.
    pub fn from_raw(v: u32) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }

    /// `ibv_event_type_str()`'s text.
    pub fn as_str(self) -> &'static str {
        use AsyncEventType::*;
        match self {
            CqErr => "CQ error",
            QpFatal => "local work queue catastrophic error",
            QpReqErr => "invalid request local work queue error",
            QpAccessErr => "local access violation work queue error",
            CommEst => "communication established",
            SqDrained => "send queue drained",
            PathMig => "path migrated",
            PathMigErr => "path migration request error",
            DeviceFatal => "local catastrophic error",
            PortActive => "port active",
            PortErr => "port error",
            LidChange => "LID change",
            PkeyChange => "P_Key change",
            SmChange => "SM change",
            SrqErr => "SRQ catastrophic error",
            SrqLimitReached => "SRQ limit reached",
            QpLastWqeReached => "last WQE reached",
            ClientReregister => "client reregistration",
            GidChange => "GID table change",
            WqFatal => "WQ fatal",
        }
    }

    /// What kind of element an event of this type names (the member of libibverbs'
    /// `element` union that `ibv_get_async_event` fills).
    pub fn element_kind(self) -> ElementKind {
        use AsyncEventType::*;
        match self {
            CqErr => ElementKind::Cq,
            QpFatal | QpReqErr | QpAccessErr | CommEst | SqDrained | PathMig | PathMigErr
            | QpLastWqeReached => ElementKind::Qp,
            SrqErr | SrqLimitReached => ElementKind::Srq,
            WqFatal => ElementKind::Wq,
            DeviceFatal => ElementKind::Device,
            PortActive | PortErr | LidChange | PkeyChange | SmChange | ClientReregister | GidChange => {
                ElementKind::Port
            }
        }
    }
}

impl std::fmt::Display for AsyncEventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which member of the element union an event type fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementKind {
    /// `element.cq`
    Cq,
    /// `element.qp`
    Qp,
    /// `element.srq`
    Srq,
    /// `element.wq`
    Wq,
    /// `element.port_num`
    Port,
    /// No element (the device itself).
    Device,
}

/// What an event is about: libibverbs' `element` union, with objects named by number
/// rather than pointer (the object may be gone by the time the event is read).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncElement {
    /// A CQ, by [`handle`](crate::CompletionQueue::handle).
    Cq(u32),
    /// A QP, by QP number.
    Qp(u32),
    /// An SRQ, by [`handle`](crate::SharedReceiveQueue::handle).
    Srq(u32),
    /// A work queue, by number.
    Wq(u32),
    /// A port, by number.
    Port(u8),
    /// The device.
    Device,
}

/// `struct ibv_async_event`: one event and what it names. Acknowledge it with
/// [`Context::ack_async_event`](crate::Context::ack_async_event) (it is not `Clone`, so
/// each event is acknowledged once).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// The event.
    pub event_type: AsyncEventType,
    /// What it is about.
    pub element: AsyncElement,
}

impl std::fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.element {
            AsyncElement::Cq(h) => write!(f, "{} on CQ {h}", self.event_type),
            AsyncElement::Qp(n) => write!(f, "{} on QP {n:#x}", self.event_type),
            AsyncElement::Srq(h) => write!(f, "{} on SRQ {h}", self.event_type),
            AsyncElement::Wq(n) => write!(f, "{} on WQ {n}", self.event_type),
            AsyncElement::Port(p) => write!(f, "{} on port {p}", self.event_type),
            AsyncElement::Device => write!(f, "{}", self.event_type),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbering_follows_verbs_h() {
        for (i, t) in AsyncEventType::ALL.iter().enumerate() {
            assert_eq!(*t as u32, i as u32);
            assert_eq!(AsyncEventType::from_raw(i as u32), Some(*t));
        }
        assert_eq!(AsyncEventType::from_raw(20), None);
        assert_eq!(AsyncEventType::SrqLimitReached as u32, 15);
        assert_eq!(AsyncEventType::QpLastWqeReached as u32, 16);
    }

    #[test]
    fn elements_by_type() {
        assert_eq!(AsyncEventType::CqErr.element_kind(), ElementKind::Cq);
        assert_eq!(AsyncEventType::QpLastWqeReached.element_kind(), ElementKind::Qp);
        assert_eq!(AsyncEventType::SrqLimitReached.element_kind(), ElementKind::Srq);
        assert_eq!(AsyncEventType::PortErr.element_kind(), ElementKind::Port);
        assert_eq!(AsyncEventType::DeviceFatal.element_kind(), ElementKind::Device);
        let e = AsyncEvent {
            event_type: AsyncEventType::SrqLimitReached,
            element: AsyncElement::Srq(3),
        };
        assert_eq!(e.to_string(), "SRQ limit reached on SRQ 3");
    }
}
