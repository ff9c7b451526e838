//! What the deterministic backend does not have: address handles (UD) and memory
//! windows. Their types have no values (the verbs that would make one refuse with
//! EOPNOTSUPP), so the traits' methods on them cannot be called; and the one error
//! every refusal of the backend is made with.

use verbs_api::{AddressHandle, AhAttr, Error, MemoryWindow, MwType};

/// The refusal of `what` by the deterministic backend (EOPNOTSUPP), saying why and what
/// to change.
pub(crate) fn refused(what: impl Into<String>) -> Error {
    Error::Unsupported {
        backend: "det",
        what: what.into(),
    }
}

/// An address handle of the deterministic backend: none can be made (UD is refused).
pub enum DetAh {}

/// A memory window of the deterministic backend: none can be made (`ibv_alloc_mw` is
/// refused).
pub enum DetMw {}

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
