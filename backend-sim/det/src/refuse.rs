//! What the deterministic backend does not have: SRQs, address handles (UD) and memory
//! windows. Their types have no values (the verbs that would make one refuse with
//! EOPNOTSUPP), so the traits' methods on them cannot be called; and the one error
//! every refusal of the backend is made with.

use verbs_api::{
    AddressHandle, AhAttr, Error, MemoryWindow, MwType, PostError, RecvWr, SharedReceiveQueue, SrqAttr,
    SrqAttrMask,
};

/// The refusal of `what` by the deterministic backend (EOPNOTSUPP), saying why and what
/// to change.
pub(crate) fn refused(what: impl Into<String>) -> Error {
    Error::Unsupported {
        backend: "det",
        what: what.into(),
    }
}

/// A shared receive queue of the deterministic backend: none can be made
/// (`ibv_create_srq` is refused).
pub enum DetSrq {}

/// An address handle of the deterministic backend: none can be made (UD is refused).
pub enum DetAh {}

/// A memory window of the deterministic backend: none can be made (`ibv_alloc_mw` is
/// refused).
pub enum DetMw {}

impl SharedReceiveQueue for DetSrq {
    fn post_recv(&self, _: &[RecvWr<'_>]) -> Result<(), PostError> {
        match *self {}
    }
    fn modify(&self, _: &SrqAttr, _: SrqAttrMask) -> verbs_api::Result<()> {
        match *self {}
    }
    fn query(&self) -> verbs_api::Result<SrqAttr> {
        match *self {}
    }
    fn handle(&self) -> u32 {
        match *self {}
    }
}

impl AddressHandle for DetAh {
    fn attr(&self) -> AhAttr {
        match *self {}
    }
}

impl MemoryWindow for DetMw {
    fn rkey(&self) -> u32 {
        match *self {}
    }
    fn mw_type(&self) -> MwType {
        match *self {}
    }
}
