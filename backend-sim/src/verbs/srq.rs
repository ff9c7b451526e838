//! Shared receive queues (`ibv_create_srq`) and address handles (`ibv_create_ah`).
//!
//! The sim does not implement them yet: [`SimPd`](super::pd::SimPd) refuses both with
//! EOPNOTSUPP, so these types are never made.

use verbs_api::{AddressHandle, AhAttr, PostError, RecvWr, Result, SharedReceiveQueue, SrqAttr, SrqAttrMask};

/// A shared receive queue of the sim (not implemented: never created).
pub struct SimSrq {
    _never: std::convert::Infallible,
}

impl SharedReceiveQueue for SimSrq {
    fn post_recv(&self, _wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        match self._never {}
    }
    fn modify(&self, _attr: &SrqAttr, _mask: SrqAttrMask) -> Result<()> {
        match self._never {}
    }
    fn query(&self) -> Result<SrqAttr> {
        match self._never {}
    }
    fn handle(&self) -> u32 {
        match self._never {}
    }
}

/// An address handle of the sim (not implemented: never created).
pub struct SimAh {
    _never: std::convert::Infallible,
}

impl AddressHandle for SimAh {
    fn attr(&self) -> AhAttr {
        match self._never {}
    }
}
