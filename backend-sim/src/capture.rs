//! A capture of the traffic the process's devices send, as the RoCE v2 packets an HCA
//! would put on the wire, in a pcapng file that Wireshark and tshark read and that
//! `rdma-sim trace` draws as ladders: set `RDMA_SIM_PCAP=FILE` (`%p` in it becomes the
//! process id; the launcher's `--pcap`). Off, it costs one check of an empty slot per
//! frame queued.
//!
//! Each process writes the packets its own devices send on their RC and UC connections
//! (so a capture of two processes is two files, which `mergecap` joins): every SEND,
//! WRITE and READ response as its packets of the path MTU, with their PSNs, requests,
//! ACKs and NAKs with their syndromes, atomics with their operands and original values.
//! Headers only: each packet is kept up to the end of its transport headers (its length
//! on the wire is the whole packet's), so payload and ICRC are not in the file. The
//! addresses are the connection's IPs (IPv4-mapped GIDs give IPv4 packets), the MACs
//! derived from them, the UDP source port derived from the QP pair as rxe derives it.
//! UD datagrams are captured as their one packet each (SEND Only with its DETH). Not
//! captured yet: the AETH's MSN (0 in every ACK: the sim's responder does not count
//! messages).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::{IpAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use backend_sim_proto::capture::opcode::Transport;
use backend_sim_proto::capture::packet::{self, udp_source_port, udp_source_port_of_qp, Route};
use backend_sim_proto::capture::pcapng;
use backend_sim_proto::capture::segment::{segments, Context};
use backend_sim_proto::tx::FrameTap;
use backend_sim_proto::wire::Frame;
use parking_lot::Mutex;
use verbs_api::QpType;

use crate::qp::QpShared;

/// The setting that turns the capture on.
pub const SETTING: &str = "RDMA_SIM_PCAP";

/// Buffered bytes written out at once.
const FLUSH_AT: usize = 64 << 10;

/// A capture file being written.
pub struct Capture {
    path: PathBuf,
    out: Mutex<BufWriter<File>>,
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
            match Capture::create(&path) {
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
fn expand(p: &Path) -> PathBuf {
    PathBuf::from(p.to_string_lossy().replace("%p", &std::process::id().to_string()))
}

extern "C" fn flush_at_exit() {
    if let Some(Some(c)) = GLOBAL.get() {
        // A thread that holds the lock at exit is writing: what it writes is lost.
        if let Some(mut w) = c.out.try_lock() {
            let _ = w.flush();
        }
    }
}

impl Capture {
    /// Creates `path` and writes the section and interface headers.
    pub fn create(path: &Path) -> std::io::Result<Arc<Capture>> {
        let mut out = BufWriter::with_capacity(2 * FLUSH_AT, File::create(path)?);
        let mut head = Vec::new();
        pcapng::header(&mut head, "backend-sim", "sim", 0);
        out.write_all(&head)?;
        out.flush()?;
        Ok(Arc::new(Capture {
            path: path.to_owned(),
            out: Mutex::new(out),
        }))
    }

    /// Where it writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes what is buffered.
    pub fn flush(&self) {
        let _ = self.out.lock().flush();
    }

    fn write(&self, block: &[u8]) {
        let mut w = self.out.lock();
        if let Err(e) = w.write_all(block) {
            tracing::warn!(path = %self.path.display(), "capture: {e}");
        }
        if w.buffer().len() >= FLUSH_AT {
            let _ = w.flush();
        }
    }
}

/// The GID an IP address stands for (IPv4-mapped for IPv4, as a RoCE v2 GID).
fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// One connection's view for the capture: what every packet it sends shares.
pub struct ConnTap {
    cap: Arc<Capture>,
    route: Route,
    cx: Context,
}

impl ConnTap {
    /// The tap of `qp`'s connection over `sock` (its attributes read now: the QP is
    /// past RTR when a connection is set up).
    pub(crate) fn new(cap: Arc<Capture>, qp: &QpShared, sock: &TcpStream) -> Option<ConnTap> {
        let (dest_qpn, mtu, flow_label) = {
            let g = qp.inner.lock();
            let a = &g.attr;
            (
                a.dest_qp_num,
                a.path_mtu.bytes(),
                a.ah_attr.grh.flow_label & 0xf_ffff,
            )
        };
        let (local, peer) = (sock.local_addr().ok()?, sock.peer_addr().ok()?);
        let transport = if qp.qp_type == QpType::Uc {
            Transport::Uc
        } else {
            Transport::Rc
        };
        Some(ConnTap {
            cap,
            route: Route {
                src_gid: gid_of(local.ip()),
                dst_gid: gid_of(peer.ip()),
                src_port: udp_source_port(flow_label, qp.qpn, dest_qpn),
                traffic_class: 0,
                hop_limit: 64,
                flow_label,
            },
            cx: Context {
                transport,
                dst_qpn: dest_qpn,
                mtu,
                msn: 0,
            },
        })
    }
}

/// Writes the UD datagram encoded at the start of `bytes` (header and payload, as a
/// UD requester emits it), sent by the device whose IP GID is `src_gid` to the one at
/// `dst`, as its one packet (UD SEND Only, with its DETH).
pub fn datagram(cap: &Capture, bytes: &[u8], src_gid: [u8; 16], dst: IpAddr) {
    let Ok(Some((f @ Frame::Datagram { src_qpn, dst_qpn, .. }, _))) = Frame::decode(bytes) else {
        return;
    };
    let route = Route {
        src_gid,
        dst_gid: gid_of(dst),
        src_port: udp_source_port_of_qp(src_qpn),
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
    };
    let cx = Context {
        transport: Transport::Ud,
        dst_qpn,
        mtu: u32::MAX,
        msn: 0,
    };
    record(cap, &route, &cx, &f);
}

/// Writes `f` as its packets on `route`.
fn record(cap: &Capture, route: &Route, cx: &Context, f: &Frame) {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut block = Vec::new();
    let mut pkt = Vec::with_capacity(128);
    for s in segments(f, cx) {
        pkt.clear();
        let len = s.payload.len();
        if packet::write_headers(route, &s.headers, len, &mut pkt).is_err() {
            continue;
        }
        let wire = packet::wire_len(route, &s.headers, len);
        pcapng::packet(&mut block, ts, &pkt, wire, None);
    }
    if !block.is_empty() {
        cap.write(&block);
    }
}

impl FrameTap for ConnTap {
    fn sent(&self, f: &Frame) {
        record(&self.cap, &self.route, &self.cx, f);
    }
}
