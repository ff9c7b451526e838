//! The verbs handles: what an application holds (`SimBackend`, `SimContext`, `SimPd`,
//! `SimMr`, `SimCq`, `SimChannel`, `SimQp`), each implementing its verbs-api trait over
//! the device's shared objects.

pub mod backend;
pub mod context;
pub mod cq;
pub mod pd;
pub mod qp;
