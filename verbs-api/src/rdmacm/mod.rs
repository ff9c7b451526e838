//! The RDMA connection manager (`man rdma_cm`): connections set up by IP address and port,
//! with events, as librdmacm and the kernel's rdma_cm give them, for every backend that
//! has one ([`CmBackend`]).
//!
//! The model is rdma_cm's, at the level of the kernel interface librdmacm talks to
//! (`rdma_user_cm.h`), so that a backend over librdmacm and the simulated HCA implement
//! the same calls:
//!
//! - An **event channel** ([`CmEventChannel`], `rdma_create_event_channel`) is a queue of
//!   events with a file descriptor that polls readable while one is pending;
//!   [`CmEventChannel::get_event`] takes the next (`rdma_get_cm_event`; taking is
//!   acknowledging: the event is a value the caller owns).
//! - An **id** ([`CmId`], `rdma_create_id`) reports to its channel. A client resolves an
//!   address (`rdma_resolve_addr`: [`CmEventType::AddrResolved`], which binds the id to a
//!   device, [`CmId::verbs`]) and a route (`rdma_resolve_route`:
//!   [`CmEventType::RouteResolved`]), then connects (`rdma_connect`) naming its QP; a
//!   server binds (`rdma_bind_addr`), listens (`rdma_listen`) and gets
//!   [`CmEventType::ConnectRequest`] with a new id ([`CmEvent::new_id`]) that it accepts
//!   or rejects.
//! - The QP is the caller's: as for an id without `rdma_create_qp`, the connection
//!   manager never touches it. [`CmId::init_qp_attr`] says what each transition needs
//!   (`rdma_init_qp_attr`), and the active side gets [`CmEventType::ConnectResponse`],
//!   moves its QP to RTR and RTS and calls [`CmId::establish`] (`rdma_establish`). The
//!   functions of [`qp`] do what librdmacm does for an id that owns its QP: INIT at
//!   creation, RTR and RTS before accept and on the response, ERR on disconnect.
//! - Connections end with [`CmId::disconnect`] (either side: both get
//!   [`CmEventType::Disconnected`]), or by dropping the id (`rdma_destroy_id`), which
//!   rejects or disconnects whatever the id was doing and discards its pending events.
//!
//! RC uses [`PortSpace::Tcp`]; UD uses [`PortSpace::Udp`], whose "connection" resolves
//! the service's QP number and Q_Key ([`CmEventType::Established`] with [`UdParam`]).
//! Private data travels with the request, the reply and the reject; the receiver sees
//! the whole private data area of the message, zero-padded, as rdma_cm reports it
//! ([`private_data_len`]). [`aio::AsyncCmEvents`] is the event channel on tokio.

#[cfg(feature = "tokio")]
pub mod aio;
pub mod qp;
pub mod sa;
mod traits;

mod types;

pub use traits::{CmBackend, CmEventChannel, CmId, CmIdOf, EventChannelOf};
pub use types::*;
