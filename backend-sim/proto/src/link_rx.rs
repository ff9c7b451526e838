//! A link's incoming bytes as whole datagrams (docs/wire.md "Links"): a link between two
//! devices carries nothing but [`Frame::Datagram`]s, each at most
//! [`DATAGRAM_HDR_LEN`] + [`MAX_DATAGRAM`] bytes, so they are staged in one fixed buffer
//! and handed out whole, header and payload together: the receiver needs the whole
//! datagram before it picks a receive (or drops it), and a datagram is small enough that
//! copying it once more costs less than tracking a payload half written into a region.
//!
//! Anything else on a link (a malformed frame, a frame of another kind, a datagram above
//! the MTU) is a [`LinkError`]: the driver closes the link.

use std::io;

use crate::io::Recv;
use crate::wire::{Frame, WireError, DATAGRAM_HDR_LEN, MAX_DATAGRAM};

/// Bytes of the staging buffer (many datagrams per `recv`).
pub const LINK_RX_BUF: usize = 64 << 10;

/// The largest frame on a link.
const MAX_FRAME: usize = DATAGRAM_HDR_LEN + MAX_DATAGRAM as usize;

/// Why a link's bytes cannot be read on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// The bytes are no frame.
    #[error("malformed frame on a link: {0}")]
    Malformed(#[from] WireError),
    /// A frame that has no business on a link.
    #[error("{0} on a link (links carry datagrams only)")]
    NotDatagram(Frame),
}

/// The incoming bytes of one link.
pub struct LinkReader {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Default for LinkReader {
    fn default() -> Self {
        Self::new()
    }
}

impl LinkReader {
    /// An empty reader (its buffer is allocated here, once).
    pub fn new() -> Self {
        LinkReader {
            buf: vec![0u8; LINK_RX_BUF].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Bytes buffered and not yet handed out.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Moves what is buffered to the front when the room behind it could not hold a
    /// whole frame (what is buffered is less than one: see [`LinkReader::next_datagram`]).
    fn make_room(&mut self) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.buf.len() - self.end < MAX_FRAME {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Reads what `src` has, without blocking, into the buffer's room. `Ok(0)`: the end
    /// of the stream (the buffer always has room after [`LinkReader::next_datagram`] returned
    /// `None`).
    pub fn fill(&mut self, src: &mut impl Recv) -> io::Result<usize> {
        self.make_room();
        let room = &mut self.buf[self.end..];
        // SAFETY: at most `room.len()` bytes go into our own buffer, which nothing
        // borrows during the call.
        let n = unsafe { src.recv(room.as_mut_ptr(), room.len()) }?;
        self.end += n;
        Ok(n)
    }

    /// Appends bytes as if read from the stream (for tests and the fuzz harness);
    /// returns how many fit.
    pub fn feed(&mut self, data: &[u8]) -> usize {
        self.make_room();
        let n = data.len().min(self.buf.len() - self.end);
        self.buf[self.end..self.end + n].copy_from_slice(&data[..n]);
        self.end += n;
        n
    }

    /// The next whole datagram (its header and its payload), `None` until all of it is
    /// buffered. What is left buffered after `None` is less than one frame.
    pub fn next_datagram(&mut self) -> Result<Option<(Frame, &[u8])>, LinkError> {
        let Some((frame, n)) = Frame::decode(&self.buf[self.start..self.end])? else {
            return Ok(None);
        };
        if !matches!(frame, Frame::Datagram { .. }) {
            return Err(LinkError::NotDatagram(frame));
        }
        let len = frame.payload_len() as usize;
        if self.buffered() < n + len {
            return Ok(None);
        }
        let at = self.start + n;
        self.start = at + len;
        Ok(Some((frame, &self.buf[at..at + len])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::MAX_HDR_LEN;

    fn datagram(len: u32, src_qpn: u32) -> Vec<u8> {
        let mut b = [0u8; MAX_HDR_LEN];
        let n = Frame::Datagram {
            psn: 0,
            len,
            dst_qpn: 2,
            src_qpn,
            qkey: 1,
            imm: None,
            solicited: false,
            grh: None,
        }
        .encode(&mut b);
        let mut v = b[..n].to_vec();
        v.extend((0..len).map(|i| i as u8));
        v
    }

    /// Datagrams fed in pieces of any size come out whole, in order, with their
    /// payloads; the buffer never runs out of room for the next one.
    #[test]
    fn datagrams_come_out_whole_whatever_the_pieces() {
        let mut stream = Vec::new();
        for i in 0..100u32 {
            stream.extend(datagram((i * 97) % (MAX_DATAGRAM + 1), i));
        }
        for piece in [1, 7, 52, 4148, 9000, 65536] {
            let mut r = LinkReader::new();
            let mut got = 0u32;
            for chunk in stream.chunks(piece) {
                let mut rest = chunk;
                while !rest.is_empty() {
                    let n = r.feed(rest);
                    assert!(n > 0, "no room with {} bytes buffered", r.buffered());
                    rest = &rest[n..];
                    while let Some((f, p)) = r.next_datagram().unwrap() {
                        let Frame::Datagram { src_qpn, len, .. } = f else {
                            panic!("{f}")
                        };
                        assert_eq!((src_qpn, len), (got, (got * 97) % (MAX_DATAGRAM + 1)));
                        assert!(p.iter().enumerate().all(|(i, &b)| b == i as u8));
                        got += 1;
                    }
                }
            }
            assert_eq!(got, 100, "pieces of {piece}");
            assert_eq!(r.buffered(), 0);
        }
    }

    /// Anything but a datagram, and bytes that are no frame, end the link.
    #[test]
    fn only_datagrams_travel_on_a_link() {
        let mut b = [0u8; MAX_HDR_LEN];
        let n = Frame::Ack { psn: 1 }.encode(&mut b);
        let mut r = LinkReader::new();
        r.feed(&b[..n]);
        assert_eq!(
            r.next_datagram().unwrap_err(),
            LinkError::NotDatagram(Frame::Ack { psn: 1 })
        );
        let mut r = LinkReader::new();
        r.feed(&[0xff; 64]);
        assert!(matches!(r.next_datagram(), Err(LinkError::Malformed(_))));
    }
}
