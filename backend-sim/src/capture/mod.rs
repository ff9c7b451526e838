//! A capture of the traffic a device sends, as the RoCE v2 packets an HCA would put on
//! the wire, with the verbs context around them, in a pcapng file that Wireshark and
//! tshark read and that `rdma-sim trace` draws as ladders. Three ways on:
//! `RDMA_SIM_PCAP=FILE` for every device of the process (`%p` in it becomes the process
//! id; the launcher's `--pcap`), [`SimConfig::capture`](crate::SimConfig) for the devices
//! of a backend, and [`SimContext::capture_to`](crate::SimContext::capture_to) for one
//! device into any writer. Off, it costs one check of an empty slot per frame queued,
//! WR posted or event.
//!
//! Every packet a device sends goes through [`Capture::frame`]: on its RC and UC
//! connections ([`ConnTap`], told by the connection's transmit queue) and as UD
//! datagrams, unicast or multicast ([`datagram`]; a multicast datagram is its one
//! packet to the group, as a fabric carries it). A message of more than the path MTU is
//! its First/Middle/Last packets with their PSNs; ACKs and NAKs carry their syndromes
//! and the responder's MSN; atomics their operands and original values.
//!
//! The snap length ([`Snaplen`], `RDMA_SIM_PCAP_SNAPLEN`) says how much of each packet is
//! kept: by default its headers only (the length on the wire is the whole packet's), or
//! up to N bytes, or all of it, payload and the ICRC rxe computes included.
//!
//! The verbs context ([`Capture::note`]) is written as events between the packets: QP
//! state changes, WRs posted, completions, connections set up and lost, and the faults
//! the sim injected. A datagram lost by an injected fault is in the capture, with a
//! comment saying so.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use backend_sim_proto::capture::opcode::Transport;
use backend_sim_proto::capture::packet;
use backend_sim_proto::capture::pcapng;
use backend_sim_proto::capture::segment::{segments, Context};
use backend_sim_proto::wire::Frame;
use parking_lot::Mutex;

mod flow;
pub mod notes;

pub(crate) use flow::gid_of;
pub use flow::{datagram, datagram_frame, datagram_to, ConnTap, Flow};

/// The setting that turns the capture on for the process.
pub const SETTING: &str = "RDMA_SIM_PCAP";

/// The setting of the snap length ([`Snaplen`]'s forms).
pub const SNAPLEN_SETTING: &str = "RDMA_SIM_PCAP_SNAPLEN";

/// Buffered bytes written out at once.
const FLUSH_AT: usize = 64 << 10;

/// How much of each packet a capture keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Snaplen {
    /// Its headers, up to the end of the transport headers (`headers`).
    #[default]
    Headers,
    /// Its first N bytes, as `tcpdump -s N` (a number).
    Bytes(u32),
    /// All of it: payload, pad and ICRC (`0` or `all`).
    Whole,
}

impl FromStr for Snaplen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "headers" => Ok(Snaplen::Headers),
            "all" | "0" => Ok(Snaplen::Whole),
            n => n
                .parse()
                .map(Snaplen::Bytes)
                .map_err(|_| format!("{s:?} is not a snap length: a number of bytes, `all` or `headers`")),
        }
    }
}

impl Snaplen {
    /// The snap length from `RDMA_SIM_PCAP_SNAPLEN` (unset: headers; a bad value is
    /// warned about and headers kept).
    pub fn from_env() -> Snaplen {
        match std::env::var(SNAPLEN_SETTING) {
            Ok(v) if !v.trim().is_empty() => v.parse().unwrap_or_else(|e| {
                tracing::warn!("{SNAPLEN_SETTING}: {e}; keeping the headers");
                Snaplen::Headers
            }),
            _ => Snaplen::Headers,
        }
    }

    /// The interface's snap length field (0: no limit).
    fn field(self) -> u32 {
        match self {
            Snaplen::Bytes(n) => n,
            Snaplen::Headers | Snaplen::Whole => 0,
        }
    }
}

/// Where a capture's bytes go, and the blocks not yet written there.
struct Out {
    w: Box<dyn Write + Send>,
    buf: Vec<u8>,
    /// A write failed (reported once); nothing more is written.
    failed: bool,
}

/// A capture being written.
pub struct Capture {
    path: Option<PathBuf>,
    snaplen: Snaplen,
    out: Mutex<Out>,
}

static GLOBAL: OnceLock<Option<Arc<Capture>>> = OnceLock::new();

/// The process's capture, opened at the first call if `RDMA_SIM_PCAP` names a file
/// (a file that cannot be created is reported once, as a warning, and nothing is
/// captured).
pub fn global() -> Option<&'static Arc<Capture>> {
    GLOBAL
        .get_or_init(|| {
            let v = std::env::var_os(SETTING).filter(|v| !v.is_empty())?;
            let path = expand(Path::new(&v));
            match Capture::create(&path, Snaplen::from_env()) {
                Ok(c) => {
                    // SAFETY: `flush_at_exit` is an `extern "C" fn` of no arguments that
                    // only takes a lock with `try_lock` and writes a file.
                    unsafe { libc::atexit(flush_at_exit) };
                    Some(c)
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), "{SETTING}: cannot create the capture file: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// `%p` in the setting becomes the process id (a capture per process of a job).
pub fn expand(p: &Path) -> PathBuf {
    PathBuf::from(p.to_string_lossy().replace("%p", &std::process::id().to_string()))
}

extern "C" fn flush_at_exit() {
    if let Some(Some(c)) = GLOBAL.get() {
        // A thread that holds the lock at exit is writing: what it writes is lost.
        if let Some(mut o) = c.out.try_lock() {
            o.flush();
        }
    }
}

impl Out {
    fn flush(&mut self) {
        if self.failed || self.buf.is_empty() {
            self.buf.clear();
            return;
        }
        if let Err(e) = self.w.write_all(&self.buf).and_then(|_| self.w.flush()) {
            tracing::warn!("capture: {e}; nothing more is captured");
            self.failed = true;
        }
        self.buf.clear();
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Capture {
    /// Creates `path` and writes the section and interface headers.
    pub fn create(path: &Path, snaplen: Snaplen) -> std::io::Result<Arc<Capture>> {
        let file = std::fs::File::create(path)?;
        Self::open(Box::new(file), Some(path.to_owned()), snaplen)
    }

    /// A capture into `w` (its headers written at once).
    pub fn to_writer(w: impl Write + Send + 'static, snaplen: Snaplen) -> std::io::Result<Arc<Capture>> {
        Self::open(Box::new(w), None, snaplen)
    }

    fn open(
        mut w: Box<dyn Write + Send>,
        path: Option<PathBuf>,
        snaplen: Snaplen,
    ) -> std::io::Result<Arc<Capture>> {
        let mut head = Vec::new();
        pcapng::header(&mut head, "backend-sim", "sim", snaplen.field());
        w.write_all(&head)?;
        w.flush()?;
        Ok(Arc::new(Capture {
            path,
            snaplen,
            out: Mutex::new(Out {
                w,
                buf: Vec::with_capacity(2 * FLUSH_AT),
                failed: false,
            }),
        }))
    }

    /// The file it writes, if it writes one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// How much of each packet it keeps.
    pub fn snaplen(&self) -> Snaplen {
        self.snaplen
    }

    /// Writes what is buffered.
    pub fn flush(&self) {
        self.out.lock().flush();
    }

    /// Whether packets keep payload bytes (their senders must hand them over).
    pub(crate) fn wants_payload(&self) -> bool {
        self.snaplen != Snaplen::Headers
    }

    /// Appends blocks under the lock, written out once enough are buffered.
    fn append(&self, f: impl FnOnce(&mut Vec<u8>)) {
        let mut o = self.out.lock();
        if o.failed {
            return;
        }
        f(&mut o.buf);
        if o.buf.len() >= FLUSH_AT {
            o.flush();
        }
    }

    /// Writes an event of the verbs context (the text Wireshark shows as the packet's
    /// comment and in its packet list).
    pub fn note(&self, text: &str) {
        let ts = now_ns();
        self.append(|b| pcapng::event(b, ts, text));
    }

    /// Writes frame `f` sent on `flow` as its packets: `msn` the responder's MSN for a
    /// response, `payload` the frame's payload bytes as far as the sender had them (only
    /// asked for when [`Capture::wants_payload`]), `comment` on its first packet.
    pub fn frame(&self, flow: &Flow, f: &Frame, msn: u32, payload: &[u8], comment: Option<&str>) {
        let cx = Context { msn, ..flow.cx };
        let mut segs = segments(f, &cx);
        if segs.is_empty() {
            return;
        }
        if cx.transport == Transport::Uc {
            // Nothing acknowledges a UC request, and rxe never sets AckReq on one: the
            // bit a UC frame carries asks the sim's own peer for a receipt, which is
            // the sim's transport, not a RoCE packet.
            for s in &mut segs {
                s.headers.bth.ack_req = false;
            }
        }
        let ts = now_ns();
        let route = &flow.route;
        self.append(|b| {
            for (i, s) in segs.iter().enumerate() {
                let range = s.payload.start as usize..s.payload.end as usize;
                let wire = packet::wire_len(route, &s.headers, range.len());
                let comment = if i == 0 { comment } else { None };
                let mark = b.len();
                let mut ok = true;
                match (self.snaplen, payload.get(range.clone())) {
                    (Snaplen::Headers, _) | (_, None) => {
                        pcapng::packet_with(b, ts, wire, None, comment, |o| {
                            ok = packet::write_headers(route, &s.headers, range.len(), o).is_ok();
                        })
                    }
                    (snap, Some(bytes)) => {
                        let cut = match snap {
                            Snaplen::Bytes(n) => Some(n as usize),
                            _ => None,
                        };
                        pcapng::packet_with(b, ts, wire, cut, comment, |o| {
                            ok = packet::write(route, &s.headers, bytes, o).is_ok();
                        })
                    }
                }
                if !ok {
                    // Headers that do not fit their opcode: a bug, never a packet.
                    b.truncate(mark);
                }
            }
        });
    }
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("path", &self.path)
            .field("snaplen", &self.snaplen)
            .finish_non_exhaustive()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.out.get_mut().flush();
    }
}

/// A writer into memory that stays readable while a capture writes to it: give a clone
/// to [`SimContext::capture_to`](crate::SimContext::capture_to) and read the file with
/// [`Buffer::contents`] after [`Capture::flush`].
#[derive(Clone, Debug, Default)]
pub struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Buffer {
    /// A new, empty buffer.
    pub fn new() -> Buffer {
        Buffer::default()
    }

    /// The bytes written so far.
    pub fn contents(&self) -> Vec<u8> {
        self.0.lock().clone()
    }
}

impl Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A device's capture, set at most once (at open from the settings, or by
/// [`SimContext::capture_to`](crate::SimContext::capture_to)).
pub type Slot = Arc<OnceLock<Arc<Capture>>>;
