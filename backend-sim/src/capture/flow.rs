//! The packets' side of a capture: what the packets of one sender share ([`Flow`]), a
//! connection's tap that its transmit queue tells of every frame and payload
//! ([`ConnTap`]), and UD datagrams, unicast, multicast and lost ([`datagram`]), all
//! written through [`Capture::frame`].

use std::net::IpAddr;
use std::sync::Arc;

use backend_sim_proto::capture::opcode::Transport;
use backend_sim_proto::capture::packet::{udp_source_port, udp_source_port_of_qp, Route};
use backend_sim_proto::capture::segment::Context;
use backend_sim_proto::memory::Seg;
use backend_sim_proto::tx::FrameTap;
use backend_sim_proto::wire::Frame;
use verbs_api::QpType;

use super::Capture;
use crate::qp::QpShared;

/// The GID an IP address stands for (IPv4-mapped for IPv4, as a RoCE v2 GID).
pub(crate) fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// What the packets of one sender share: their route, transport, destination QP and
/// path MTU.
#[derive(Clone, Copy, Debug)]
pub struct Flow {
    pub(super) route: Route,
    pub(super) cx: Context,
}

impl Flow {
    /// A flow from `src_gid` to `dst_gid` on `transport` to QP `dst_qpn`, its packets of
    /// `mtu` bytes, from UDP port `src_port`.
    pub fn new(
        src_gid: [u8; 16],
        dst_gid: [u8; 16],
        src_port: u16,
        flow_label: u32,
        transport: Transport,
        dst_qpn: u32,
        mtu: u32,
    ) -> Flow {
        Flow {
            route: Route {
                src_gid,
                dst_gid,
                src_port,
                traffic_class: 0,
                hop_limit: 64,
                flow_label,
            },
            cx: Context {
                transport,
                dst_qpn,
                mtu,
                msn: 0,
            },
        }
    }
}

/// One connection's tap: its frames, with their payload when the snap length keeps it,
/// go to [`Capture::frame`].
pub struct ConnTap {
    cap: Arc<Capture>,
    flow: Flow,
    /// A frame whose payload is still being queued, and its MSN.
    held: Option<(Frame, u32)>,
    /// The comment of the next frame (a fault injected into it).
    mark: Option<&'static str>,
    payload: Vec<u8>,
    want: usize,
}

impl ConnTap {
    /// The tap of `qp`'s connection over `sock` (its attributes read now: the QP is
    /// past RTR when a connection is set up).
    pub(crate) fn new(cap: Arc<Capture>, qp: &QpShared, sock: &crate::stream::DataSock) -> Option<ConnTap> {
        let (dest_qpn, mtu, flow_label) = {
            let g = qp.inner.lock();
            let a = g.qp.attr();
            (
                a.dest_qp_num,
                a.path_mtu.bytes(),
                a.ah_attr.grh.flow_label & 0xf_ffff,
            )
        };
        let (local, peer) = (sock.local_addr()?, sock.peer_addr()?);
        let transport = if qp.qp_type == QpType::Uc {
            Transport::Uc
        } else {
            Transport::Rc
        };
        let flow = Flow::new(
            gid_of(local.ip()),
            gid_of(peer.ip()),
            udp_source_port(flow_label, qp.qpn, dest_qpn),
            flow_label,
            transport,
            dest_qpn,
            mtu,
        );
        Some(ConnTap {
            cap,
            flow,
            held: None,
            mark: None,
            payload: Vec::new(),
            want: 0,
        })
    }

    /// Writes the frame held for its payload, with what arrived of it.
    fn release(&mut self) {
        if let Some((f, msn)) = self.held.take() {
            let cut = (self.payload.len() < self.want).then_some("payload cut: its region was deregistered");
            let comment = self.mark.take().or(cut);
            self.cap.frame(&self.flow, &f, msn, &self.payload, comment);
            self.payload.clear();
        }
    }

    fn took(&mut self) {
        if self.payload.len() >= self.want {
            self.release();
        }
    }
}

impl FrameTap for ConnTap {
    fn sent(&mut self, f: &Frame, msn: u32) {
        self.release();
        let len = f.payload_len() as usize;
        if len > 0 && self.cap.wants_payload() {
            self.held = Some((*f, msn));
            self.want = len;
        } else {
            self.cap.frame(&self.flow, f, msn, &[], self.mark.take());
        }
    }

    fn mark_next(&mut self, why: &'static str) {
        self.mark = Some(why);
    }

    fn payload(&mut self, bytes: &[u8]) {
        if self.held.is_some() {
            self.payload.extend_from_slice(bytes);
            self.took();
        }
    }

    fn payload_seg(&mut self, seg: &Seg) {
        if self.held.is_some() {
            let at = self.payload.len();
            self.payload.resize(at + seg.len, 0);
            if !seg.copy_out(0, &mut self.payload[at..]) {
                self.payload.truncate(at);
                return self.release();
            }
            self.took();
        }
    }
}

impl Drop for ConnTap {
    fn drop(&mut self) {
        self.release();
    }
}

/// Writes the UD datagram encoded at the start of `bytes` (header and payload, as a UD
/// requester emits it), sent by the device whose IP GID is `src_gid` to `dst_gid` (a
/// device's, or a multicast group's), as its one packet (UD SEND Only, with its DETH).
pub fn datagram(cap: &Capture, bytes: &[u8], src_gid: [u8; 16], dst_gid: [u8; 16]) {
    let Ok(Some((f @ Frame::Datagram { len, .. }, at))) = Frame::decode(bytes) else {
        return;
    };
    let payload = bytes.get(at..at + len as usize).unwrap_or(&[]);
    datagram_frame(cap, &f, payload, src_gid, dst_gid, None);
}

/// [`datagram`] for a datagram sent to the device at `dst`.
pub fn datagram_to(cap: &Capture, bytes: &[u8], src_gid: [u8; 16], dst: IpAddr) {
    datagram(cap, bytes, src_gid, gid_of(dst))
}

/// Writes datagram `f` (a [`Frame::Datagram`]) with the `payload` it has, from
/// `src_gid` to `dst_gid`, `comment` on it (a datagram lost: what became of it).
pub fn datagram_frame(
    cap: &Capture,
    f: &Frame,
    payload: &[u8],
    src_gid: [u8; 16],
    dst_gid: [u8; 16],
    comment: Option<&str>,
) {
    let Frame::Datagram { src_qpn, dst_qpn, .. } = *f else {
        return;
    };
    let flow = Flow::new(
        src_gid,
        dst_gid,
        udp_source_port_of_qp(src_qpn),
        0,
        Transport::Ud,
        dst_qpn,
        u32::MAX,
    );
    cap.frame(&flow, f, 0, payload, comment);
}
