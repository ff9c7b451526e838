//! Incoming bytes of one connection: frame headers are decoded from a staging buffer,
//! payloads go into the registered memory chosen for them.
//!
//! Whatever part of a payload already sits in the staging buffer is copied into place;
//! the rest of a large payload is read by the kernel straight into the target region
//! (`read` on the pinned range), so big transfers are not copied twice. After a large
//! payload the next read asks for one header's worth of bytes only: a staging-sized read
//! would bring 32 KiB of the next large payload along, to be copied a second time (half
//! of every 64 KiB message). A payload whose request was refused is read and dropped,
//! keeping the stream's framing intact. A payload whose region is deregistered while it
//! arrives is dropped from that point on and reported as [`Event::PayloadLost`]: nothing
//! is written after `ibv_dereg_mr` returned, and the operation must not complete
//! successfully.

use std::io;

use crate::io::Recv;
use crate::memory::Seg;
use crate::wire::{Frame, WireError, MAX_DATA_HDR_LEN};

const BUF: usize = 32 * 1024;
/// Payload remainders at least this large are read directly into place.
const DIRECT_MIN: usize = 8 * 1024;

/// What the reader produced.
#[derive(Debug)]
pub enum Event {
    /// A frame header; if it carries a payload, call [`Reader::expect_payload`] next.
    Frame(Frame),
    /// The payload announced by the last frame has been stored; here are its segments back.
    PayloadDone(Vec<Seg>),
    /// The payload announced by the last frame has been consumed, but not all of it could
    /// be stored: a region of its segments was deregistered meanwhile.
    PayloadLost(Vec<Seg>),
}

struct Payload {
    segs: Vec<Seg>,
    seg: usize,
    off: usize,
    left: usize,
    discard: bool,
    /// Bytes were dropped because the target region was deregistered.
    lost: bool,
}

impl Payload {
    /// Stores `data` at the current position, advancing it.
    fn store(&mut self, mut data: &[u8]) {
        self.left -= data.len();
        if self.discard {
            return;
        }
        while !data.is_empty() {
            let Some(s) = self.segs.get(self.seg) else { return };
            let n = (s.len - self.off).min(data.len());
            if !s.copy_in(self.off, &data[..n]) {
                // Deregistered: drop the rest.
                self.lost = true;
                self.discard = true;
                return;
            }
            data = &data[n..];
            self.off += n;
            if self.off == s.len {
                self.seg += 1;
                self.off = 0;
            }
        }
    }
}

/// Frame reader for one stream.
pub struct Reader {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    payload: Option<Payload>,
    drained: bool,
    /// The last payload was large: the next frame is likely large too, so a read at a
    /// frame boundary takes one header's worth (see the module docs).
    after_large: bool,
}

impl Default for Reader {
    fn default() -> Self {
        Self::new()
    }
}

impl Reader {
    /// An empty reader.
    pub fn new() -> Self {
        Reader {
            buf: vec![0u8; BUF].into_boxed_slice(),
            start: 0,
            end: 0,
            payload: None,
            drained: false,
            after_large: false,
        }
    }

    /// Whether the last [`Reader::fill`] got less than it asked for: the socket had no
    /// more bytes at that moment (level-triggered readiness reports new ones).
    pub fn drained(&self) -> bool {
        self.drained
    }

    /// Whether bytes read from the socket wait to be decoded.
    pub fn has_buffered(&self) -> bool {
        self.start < self.end
    }

    /// Whether a payload is being received.
    pub fn in_payload(&self) -> bool {
        self.payload.is_some()
    }

    /// How many bytes of the payload being received are still to come, if one is.
    pub fn payload_left(&self) -> Option<usize> {
        self.payload.as_ref().map(|p| p.left)
    }

    /// The next event from buffered bytes, or `None` when more bytes are needed.
    #[inline]
    pub fn next_event(&mut self) -> Result<Option<Event>, WireError> {
        if let Some(p) = &mut self.payload {
            let n = p.left.min(self.end - self.start);
            if n > 0 {
                p.store(&self.buf[self.start..self.start + n]);
                self.start += n;
            }
            if p.left > 0 {
                return Ok(None);
            }
            let p = self.payload.take().expect("checked above");
            return Ok(Some(if p.lost {
                Event::PayloadLost(p.segs)
            } else {
                Event::PayloadDone(p.segs)
            }));
        }
        match Frame::decode(&self.buf[self.start..self.end])? {
            None => Ok(None),
            Some((f, n)) => {
                self.start += n;
                Ok(Some(Event::Frame(f)))
            }
        }
    }

    /// The last frame announced `len` payload bytes: store them in `sink` (or drop them
    /// with `None`). `sink` must cover at least `len` bytes unless dropping.
    pub fn expect_payload(&mut self, len: usize, sink: Option<Vec<Seg>>) {
        let discard = sink.is_none();
        self.after_large = len >= DIRECT_MIN;
        self.payload = Some(Payload {
            segs: sink.unwrap_or_default(),
            seg: 0,
            off: 0,
            left: len,
            discard,
            lost: false,
        });
    }

    /// Reads from `src` (the connection's socket) without blocking: into the staging
    /// buffer, or for the rest of a large payload straight into its target region. `Ok(0)`
    /// means the peer closed the stream.
    pub fn fill(&mut self, src: &mut impl Recv) -> io::Result<usize> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if let Some(p) = &mut self.payload {
            if self.start == self.end && p.left >= DIRECT_MIN && !p.discard {
                if let Some(s) = p.segs.get(p.seg) {
                    let want = (s.len - p.off).min(p.left);
                    let off = p.off;
                    let r = s.with_ptr(|ptr| {
                        // SAFETY: the range `off..off + want` lies inside the pinned segment
                        // (`off < s.len`, `want <= s.len - off`); the source writes into it
                        // like a DMA engine; no Rust reference to it exists.
                        unsafe { src.recv(ptr.add(off), want) }
                    });
                    match r {
                        Some(Err(e)) => return Err(e),
                        Some(Ok(n)) => {
                            self.drained = n < want;
                            p.left -= n;
                            p.off += n;
                            if p.off == s.len {
                                p.seg += 1;
                                p.off = 0;
                            }
                            return Ok(n);
                        }
                        None => {
                            // Deregistered: drop the rest.
                            p.discard = true;
                            p.lost = true;
                        }
                    }
                }
            }
        }
        if self.end == self.buf.len() {
            // Keep the unparsed tail at the front.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let space = &mut self.buf[self.end..];
        let want = if self.after_large && self.payload.is_none() && self.end == 0 {
            MAX_DATA_HDR_LEN
        } else {
            space.len()
        };
        // SAFETY: reads at most `want <= space.len()` bytes into our own buffer, which
        // nothing borrows during the call.
        let n = unsafe { src.recv(space.as_mut_ptr(), want) }.inspect_err(|_| {
            self.drained = true;
        })?;
        self.drained = n < want;
        self.end += n;
        Ok(n)
    }

    /// Appends bytes as if read from the stream (for the in-memory harness and tests).
    pub fn feed(&mut self, data: &[u8]) -> usize {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let n = data.len().min(self.buf.len() - self.end);
        self.buf[self.end..self.end + n].copy_from_slice(&data[..n]);
        self.end += n;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MrShared;
    use crate::wire::MAX_HDR_LEN;
    use std::sync::Arc;
    use verbs_api::AccessFlags;

    #[test]
    fn frames_and_payload_across_feeds() {
        let mr = Arc::new(MrShared::new_owned(1, 9, 100, AccessFlags::LOCAL_WRITE).unwrap());
        let mut bytes = Vec::new();
        let mut h = [0u8; MAX_HDR_LEN];
        let f = Frame::Send {
            psn: 3,
            len: 10,
            imm: None,
            solicited: false,
            ack_req: false,
            inv: None,
        };
        let n = f.encode(&mut h);
        bytes.extend_from_slice(&h[..n]);
        bytes.extend_from_slice(b"0123456789");
        let n = Frame::Ack { psn: 4 }.encode(&mut h);
        bytes.extend_from_slice(&h[..n]);
        let mut r = Reader::new();
        let mut events = Vec::new();
        for chunk in bytes.chunks(3) {
            r.feed(chunk);
            while let Some(e) = r.next_event().unwrap() {
                if let Event::Frame(Frame::Send { len, .. }) = &e {
                    r.expect_payload(
                        *len as usize,
                        Some(vec![
                            Seg {
                                mr: mr.clone(),
                                offset: 0,
                                len: 4,
                            },
                            Seg {
                                mr: mr.clone(),
                                offset: 50,
                                len: 6,
                            },
                        ]),
                    );
                }
                events.push(format!("{e:?}").chars().take(12).collect::<String>());
            }
        }
        assert_eq!(events.len(), 3);
        let mut out = [0u8; 6];
        Seg {
            mr: mr.clone(),
            offset: 50,
            len: 6,
        }
        .copy_out(0, &mut out);
        assert_eq!(&out, b"456789");
    }

    /// Two SENDs of 40 KiB from a socket: the first read (a staging buffer's worth)
    /// brings part of the first payload along; the rest of it is read into place; the
    /// read at the next frame boundary asks for one header only, so the second payload
    /// is not staged and copied; both arrive intact.
    #[test]
    fn after_a_large_payload_the_next_read_takes_one_header() {
        use std::io::Write;
        const LEN: usize = 40 * 1024;
        let mr = Arc::new(MrShared::new_owned(1, 9, 2 * LEN, AccessFlags::LOCAL_WRITE).unwrap());
        let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut rx = crate::io::FromRead(rx);
        let mut bytes = Vec::new();
        for k in 0..2u8 {
            let mut h = [0u8; MAX_HDR_LEN];
            let f = Frame::Send {
                psn: k as u32,
                len: LEN as u32,
                imm: None,
                solicited: false,
                ack_req: false,
                inv: None,
            };
            let n = f.encode(&mut h);
            bytes.extend_from_slice(&h[..n]);
            bytes.extend((0..LEN).map(|i| (i % 251) as u8 ^ k));
        }
        tx.write_all(&bytes).unwrap();
        drop(tx);
        let mut r = Reader::new();
        let (mut done, mut reads) = (0, Vec::new());
        while done < 2 {
            let n = r.fill(&mut rx).unwrap();
            assert!(n > 0, "the stream ended early");
            reads.push((done, n));
            while let Some(e) = r.next_event().unwrap() {
                match e {
                    Event::Frame(Frame::Send { len, .. }) => {
                        let seg = Seg {
                            mr: mr.clone(),
                            offset: done * LEN,
                            len: len as usize,
                        };
                        r.expect_payload(len as usize, Some(vec![seg]));
                    }
                    Event::PayloadDone(_) => done += 1,
                    e => panic!("unexpected {e:?}"),
                }
            }
        }
        // The first read after the first payload completed: one header's worth.
        let first_after = reads.iter().find(|&&(d, _)| d == 1).unwrap().1;
        assert!(first_after <= MAX_DATA_HDR_LEN, "{reads:?}");
        for k in 0..2usize {
            let mut out = vec![0u8; LEN];
            Seg {
                mr: mr.clone(),
                offset: k * LEN,
                len: LEN,
            }
            .copy_out(0, &mut out);
            assert!(out
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i % 251) as u8 ^ k as u8));
        }
    }
}
