//! The handles an open device and a protection domain are: which world, which device of
//! it, which queue of asynchronous events, which PD. The verbs on them live above
//! (`objects.rs`: `ibv_query_*`, `ibv_alloc_pd`, `ibv_reg_mr`, `ibv_create_cq`; `qp.rs`:
//! `ibv_create_qp` from a PD), so a QP can be made from a PD without the PD's verbs
//! knowing the QP's module and the QP's module knowing theirs.

use std::sync::Arc;

use crate::shared::Shared;

/// An open device of the deterministic world.
#[derive(Clone)]
pub struct DetContext {
    pub(crate) shared: Arc<Shared>,
    pub(crate) dev: usize,
    /// Its queue of asynchronous events in the world.
    pub(crate) id: usize,
    pub(crate) name: String,
}

impl DetContext {
    pub(crate) fn new(shared: Arc<Shared>, dev: usize, id: usize, name: String) -> DetContext {
        DetContext {
            shared,
            dev,
            id,
            name,
        }
    }
}

/// A protection domain of the deterministic world.
pub struct DetPd {
    pub(crate) ctx: DetContext,
    pub(crate) handle: u32,
}
