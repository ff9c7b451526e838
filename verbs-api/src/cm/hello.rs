//! The hello, the one message of the setup exchange, and the [`Offer`] it carries:
//! its wire format (see [`crate::cm`]), built and parsed without I/O.

use std::io::Read;
use std::time::Duration;

use crate::endpoint::{Endpoint, RemoteMr};
use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"VAPI";
const VERSION: u16 = 1;
/// Most MR descriptors a hello may carry.
pub const MAX_MRS: usize = 1024;
/// Most private data a hello may carry.
pub const MAX_PRIVATE: usize = 64 * 1024;
/// Default bound on the whole exchange.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// What this side tells the peer besides its endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Offer {
    /// Memory the peer may access one-sidedly.
    pub mrs: Vec<RemoteMr>,
    /// Application bytes (at most [`MAX_PRIVATE`]).
    pub private_data: Vec<u8>,
    /// Bound on the exchange (default [`DEFAULT_TIMEOUT`]).
    pub timeout: Option<Duration>,
}

impl Offer {
    /// Nothing but the endpoint.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a remote-memory descriptor.
    pub fn mr(mut self, mr: RemoteMr) -> Self {
        self.mrs.push(mr);
        self
    }

    /// Sets the private data.
    pub fn private_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.private_data = data.into();
        self
    }

    /// Sets the bound on the exchange.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }
}

pub(super) fn check_offer(offer: &Offer) -> Result<()> {
    if offer.mrs.len() > MAX_MRS || offer.private_data.len() > MAX_PRIVATE {
        return Err(Error::invalid(
            "cm",
            format!("at most {MAX_MRS} MRs and {MAX_PRIVATE} bytes of private data"),
        ));
    }
    Ok(())
}

/// Encodes a hello.
pub fn encode_hello(me: &Endpoint, offer: &Offer) -> Vec<u8> {
    let mut b = Vec::with_capacity(38 + offer.mrs.len() * RemoteMr::WIRE_LEN + offer.private_data.len());
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_be_bytes());
    b.extend_from_slice(&me.to_bytes());
    b.extend_from_slice(&(offer.mrs.len() as u16).to_be_bytes());
    for m in &offer.mrs {
        b.extend_from_slice(&m.to_bytes());
    }
    b.extend_from_slice(&(offer.private_data.len() as u32).to_be_bytes());
    b.extend_from_slice(&offer.private_data);
    b
}

/// A hello's endpoint, MR descriptors and private data.
pub(super) type Hello = (Endpoint, Vec<RemoteMr>, Vec<u8>);

/// Result of [`parse_hello`] on the bytes received so far.
#[derive(Debug, PartialEq, Eq)]
pub enum HelloParse {
    /// At least this many bytes are needed in all (not more: the hello may be followed by
    /// the ready byte).
    Need(usize),
    /// A complete hello: endpoint, MR descriptors, private data.
    Done(Endpoint, Vec<RemoteMr>, Vec<u8>),
}

/// Parses a hello from the front of `b` without I/O, refusing anything malformed or
/// oversized (the error says what is wrong).
pub fn parse_hello(b: &[u8]) -> std::result::Result<HelloParse, String> {
    const HEAD: usize = 6 + Endpoint::WIRE_LEN + 2;
    if b.len() < 4 {
        return Ok(HelloParse::Need(4));
    }
    if &b[..4] != MAGIC {
        return Err(format!(
            "not a verbs-api connection setup (got {:02x?}); is the peer a server of this kind?",
            &b[..4]
        ));
    }
    if b.len() < HEAD {
        return Ok(HelloParse::Need(HEAD));
    }
    let v = u16::from_be_bytes([b[4], b[5]]);
    if v != VERSION {
        return Err(format!("protocol version {v}, this side speaks {VERSION}"));
    }
    let endpoint = Endpoint::from_bytes(&b[6..6 + Endpoint::WIRE_LEN]).map_err(|e| e.to_string())?;
    let n = u16::from_be_bytes([b[HEAD - 2], b[HEAD - 1]]) as usize;
    if n > MAX_MRS {
        return Err(format!("{n} MR descriptors exceed the limit of {MAX_MRS}"));
    }
    let mrs_end = HEAD + n * RemoteMr::WIRE_LEN;
    if b.len() < mrs_end + 4 {
        return Ok(HelloParse::Need(mrs_end + 4));
    }
    let l = u32::from_be_bytes([b[mrs_end], b[mrs_end + 1], b[mrs_end + 2], b[mrs_end + 3]]) as usize;
    if l > MAX_PRIVATE {
        return Err(format!(
            "{l} bytes of private data exceed the limit of {MAX_PRIVATE}"
        ));
    }
    let end = mrs_end + 4 + l;
    if b.len() < end {
        return Ok(HelloParse::Need(end));
    }
    let mrs = b[HEAD..mrs_end]
        .chunks(RemoteMr::WIRE_LEN)
        .map(|c| RemoteMr::from_bytes(c).expect("fixed length"))
        .collect();
    Ok(HelloParse::Done(endpoint, mrs, b[mrs_end + 4..end].to_vec()))
}

/// Reads a hello from a blocking reader (exactly its bytes, nothing after it).
pub fn decode_hello(r: &mut impl Read) -> std::io::Result<std::result::Result<Hello, String>> {
    let mut buf = Vec::new();
    loop {
        match parse_hello(&buf) {
            Err(e) => return Ok(Err(e)),
            Ok(HelloParse::Done(e, m, p)) => return Ok(Ok((e, m, p))),
            Ok(HelloParse::Need(n)) => {
                let at = buf.len();
                buf.resize(n, 0);
                r.read_exact(&mut buf[at..])?;
            }
        }
    }
}

/// A hello that does not parse.
pub(super) fn bad_hello(msg: String) -> Error {
    Error::Transport(format!("bad connection setup from the peer: {msg}"))
}

/// The last byte of the exchange must be the peer's ready byte.
pub(super) fn check_ready(r: u8) -> Result<()> {
    if r != b'R' {
        return Err(Error::Transport(format!(
            "peer sent {r:#04x} instead of the ready byte"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Gid;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn hello_roundtrip(qpn in 0u32..1 << 24, psn in 0u32..1 << 24, n in 0usize..5, private in proptest::collection::vec(any::<u8>(), 0..100)) {
            let me = Endpoint { gid: Gid([7; 16]), lid: 3, qpn, psn };
            let offer = Offer { mrs: (0..n as u64).map(|i| RemoteMr { addr: i, rkey: i as u32, len: 8 }).collect(), private_data: private.clone(), timeout: None };
            let b = encode_hello(&me, &offer);
            let (e, m, p) = decode_hello(&mut &b[..]).unwrap().unwrap();
            prop_assert_eq!(e, me);
            prop_assert_eq!(m, offer.mrs);
            prop_assert_eq!(p, private);
        }

        /// Garbage never panics the decoder and never makes it allocate past the limits.
        #[test]
        fn garbage(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_hello(&mut &b[..]);
        }
    }

    #[test]
    fn refuses_oversized_private_data() {
        let mut b = encode_hello(&Endpoint::default(), &Offer::new());
        let n = b.len();
        b[n - 4..].copy_from_slice(&(MAX_PRIVATE as u32 + 1).to_be_bytes());
        assert!(decode_hello(&mut &b[..]).unwrap().is_err());
    }
}
