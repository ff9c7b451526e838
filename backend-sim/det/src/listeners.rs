//! What the in-memory rendezvous keeps in its world and passes between its two sides:
//! the listening ports, by host name and port, and the messages of one connection setup
//! (the client's request with its hello, the server's answer with its hello, the
//! client's word that its QP is up). The exchange itself is [`crate::rendezvous`]'s.

use std::collections::BTreeMap;

use tokio::sync::{mpsc, oneshot};
use verbs_api::{Endpoint, RemoteMr};

/// One side's hello: its QP's endpoint and its offer.
pub(crate) struct Hello {
    pub(crate) endpoint: Endpoint,
    pub(crate) mrs: Vec<RemoteMr>,
    pub(crate) private_data: Vec<u8>,
}

/// A client's request, with where the answer goes.
pub(crate) struct Request {
    pub(crate) hello: Hello,
    pub(crate) answer: oneshot::Sender<Answer>,
}

/// The server's answer, and where the client says its QP is in RTS (or why not).
pub(crate) struct Answer {
    pub(crate) hello: Hello,
    pub(crate) ready: oneshot::Sender<std::result::Result<(), String>>,
}

/// The listeners of a world, by host name and port.
#[derive(Default)]
pub(crate) struct Listeners {
    pub(crate) by_addr: BTreeMap<(String, u16), mpsc::UnboundedSender<Request>>,
}
