//! What both sides do once the hellos are exchanged: bring the QP to RTS towards the
//! peer, then trade the ready bytes; the [`Peer`] they end with.

use std::net::TcpStream;
use std::time::Instant;

use super::hello::{check_ready, Hello};
use super::io::{read_exact, write_all};
use crate::connect::{modify_to_init, modify_to_rtr, modify_to_rts, RcParams};
use crate::endpoint::{Endpoint, RemoteMr};
use crate::error::Result;
use crate::qp::{QpState, PSN_MASK};
use crate::traits::QueuePair;

/// What the peer sent; the TCP side channel stays open in `stream` (drop it to close):
/// a std stream from [`connect`](super::connect)/[`CmListener::accept`], a tokio one
/// (`AsyncPeer`) from the async forms.
///
/// [`CmListener::accept`]: super::CmListener::accept
#[derive(Debug)]
pub struct Peer<S = TcpStream> {
    /// This side's endpoint as sent to the peer (its `psn` is the QP's first send PSN).
    pub local: Endpoint,
    /// The peer QP's endpoint.
    pub endpoint: Endpoint,
    /// The peer's remote-memory descriptors.
    pub mrs: Vec<RemoteMr>,
    /// The peer's private data.
    pub private_data: Vec<u8>,
    /// The side channel (for the application's own barriers or shutdown).
    pub stream: S,
}

#[cfg(feature = "tokio")]
/// What the peer sent, with the side channel as a tokio stream.
pub type AsyncPeer = Peer<tokio::net::TcpStream>;

/// Both sides, once the hellos are exchanged: RTS towards the peer, then the ready bytes.
pub(super) fn finish<Q: QueuePair>(
    mut stream: TcpStream,
    deadline: Instant,
    qp: &Q,
    params: &RcParams,
    me: Endpoint,
    peer: Hello,
) -> Result<Peer> {
    bring_up(qp, params, &peer.0, me.psn)?;
    write_all(&mut stream, b"R", deadline)?;
    let mut r = [0u8; 1];
    read_exact(&mut stream, &mut r, deadline)?;
    check_ready(r[0])?;
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(None);
    Ok(Peer {
        local: me,
        endpoint: peer.0,
        mrs: peer.1,
        private_data: peer.2,
        stream,
    })
}

/// INIT (if still in RESET) → RTR towards `peer` → RTS sending from `psn`.
pub(super) fn bring_up<Q: QueuePair>(qp: &Q, params: &RcParams, peer: &Endpoint, psn: u32) -> Result<()> {
    if qp.state()? == QpState::Reset {
        modify_to_init(qp, params)?;
    }
    modify_to_rtr(qp, params, peer)?;
    modify_to_rts(qp, params, psn)
}

/// A first send PSN for a new connection.
pub(super) fn rand_psn() -> u32 {
    // Any value works; vary it so that stale packets of an earlier connection do not
    // look like the next ones. std's RandomState is seeded from the OS.
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    (h.finish() as u32) & PSN_MASK
}
