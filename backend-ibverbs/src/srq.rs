//! Shared receive queues (`ibv_create_srq`) and address handles (`ibv_create_ah`).
//!
//! Not wrapped yet: [`IbvPd`](crate::IbvPd) refuses both with EOPNOTSUPP, so these types
//! are never made.

use verbs_api::{AddressHandle, AhAttr, PostError, RecvWr, Result, SharedReceiveQueue, SrqAttr, SrqAttrMask};

/// A shared receive queue (not wrapped yet: never created).
pub struct IbvSrq {
    _never: std::convert::Infallible,
}

impl SharedReceiveQueue for IbvSrq {
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

/// An address handle (not wrapped yet: never created).
pub struct IbvAh {
    _never: std::convert::Infallible,
}

impl AddressHandle for IbvAh {
    fn attr(&self) -> AhAttr {
        match self._never {}
    }
}
