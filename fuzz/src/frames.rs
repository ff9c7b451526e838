//! What the peer sends: the frames of an input's steps built from their specs (PSNs near
//! the expected ones, keys and addresses of the harness's regions, lengths small or
//! anything; answers to the requests the QP really sent) and encoded, once, many times,
//! cut short or corrupted ([`Harness::peer_sends`]).

use backend_sim_proto::psn;
use backend_sim_proto::wire::{Frame, Grh, HelloReject, NakCode, NakReason, MAX_HDR_LEN};
use verbs_api::PSN_MASK;

use crate::harness::Harness;
use crate::input::{AddrSel, FrameSpec, KeySel, LenSel, PsnSel, Step};
use crate::limits::MAX_REPEAT_BYTES;
use crate::regions::{GUARD, KEYS, MR_MAX, NREG, REGION_LEN};

/// A NAK syndrome chosen by `code`.
fn nak_code(code: u8) -> NakCode {
    match code % 6 {
        0 => NakCode::Rnr { timer: code / 6 % 32 },
        1 => NakCode::PsnSeq,
        2 => NakCode::InvalidRequest,
        3 => NakCode::RemoteAccess,
        _ => NakCode::RemoteOperational,
    }
}

/// A NAK's syndrome and, now and then, a reason of its kind (`vendor_err` at the
/// requester).
fn nak_of(code: u8) -> (NakCode, Option<NakReason>) {
    let c = nak_code(code);
    let reason = NakReason::ALL
        .get(code as usize / 6 % 16)
        .copied()
        .filter(|r| r.code() == c);
    (c, reason)
}

impl Harness {
    /// The peer sends a frame: once, many times, cut short or corrupted (the frame
    /// steps).
    pub(crate) fn peer_sends(&mut self, s: &Step) {
        match s {
            Step::Frame(f) => {
                let (f, fill) = self.frame(f);
                let mut b = Vec::new();
                Self::encode(&f, fill, None, &mut b);
                self.deliver(&b);
            }
            Step::Repeat {
                frame,
                count,
                next_psn,
            } => {
                let (f, fill) = self.frame(frame);
                let mut b = Vec::new();
                Self::encode(&f, fill, None, &mut b);
                let one = b.len();
                let n = (*count as usize).clamp(1, MAX_REPEAT_BYTES / one);
                b.clear();
                let first = f.psn().unwrap_or(0);
                for k in 0..n {
                    let f = if *next_psn {
                        Self::with_psn(f, psn::add(first, k as u32))
                    } else {
                        f
                    };
                    Self::encode(&f, fill, None, &mut b);
                }
                self.deliver(&b);
            }
            Step::Partial { frame, keep } => {
                let (f, fill) = self.frame(frame);
                let mut b = Vec::new();
                Self::encode(&f, fill, None, &mut b);
                let hdr = b.len() - (f.payload_len() as usize).min(MR_MAX);
                b.truncate(hdr + *keep as usize);
                self.deliver(&b);
            }
            Step::Corrupt { frame, at, xor } => {
                let (f, fill) = self.frame(frame);
                let mut b = Vec::new();
                Self::encode(&f, fill, Some((*at, *xor)), &mut b);
                self.deliver(&b);
            }
            _ => unreachable!("not a frame step: {s:?}"),
        }
    }

    pub(crate) fn key(&self, k: KeySel) -> u32 {
        match k {
            KeySel::Region(r) => KEYS[r as usize % NREG],
            KeySel::Raw(k) => k,
        }
    }

    pub(crate) fn at(&self, a: AddrSel) -> u64 {
        match a {
            AddrSel::Region { region, off } => {
                let r = region as usize % NREG;
                let span = REGION_LEN[r] + 2 * GUARD;
                let off = (off as usize % span) as i64 - GUARD as i64;
                self.regions[r].addr().wrapping_add(off as u64)
            }
            AddrSel::Raw(a) => a,
        }
    }

    pub(crate) fn len(l: LenSel) -> u32 {
        match l {
            LenSel::Small(n) => n as u32 % 5000,
            LenSel::Raw(n) => n,
        }
    }

    pub(crate) fn req_psn(&self, p: PsnSel) -> u32 {
        match p {
            PsnSel::Near(d) => psn::add(self.resp.expected_psn(), d as i32 as u32),
            PsnSel::Raw(p) => p & PSN_MASK,
        }
    }

    pub(crate) fn resp_psn(&self, p: PsnSel) -> u32 {
        match p {
            PsnSel::Near(d) => psn::add(self.sq_psn, d as i32 as u32),
            PsnSel::Raw(p) => p & PSN_MASK,
        }
    }

    /// The frame and the payload bytes the peer sends after it (at most 4 KiB).
    pub(crate) fn frame(&self, f: &FrameSpec) -> (Frame, u8) {
        match f {
            FrameSpec::Send { .. }
            | FrameSpec::Write { .. }
            | FrameSpec::Read { .. }
            | FrameSpec::CmpSwap { .. }
            | FrameSpec::FetchAdd { .. } => self.request_frame(f),
            FrameSpec::Ack { .. }
            | FrameSpec::Nak { .. }
            | FrameSpec::Reply { .. }
            | FrameSpec::ReadResp { .. }
            | FrameSpec::AtomicResp { .. } => self.response_frame(f),
            FrameSpec::Hello { .. }
            | FrameSpec::HelloAck
            | FrameSpec::HelloNak { .. }
            | FrameSpec::LinkHello { .. } => self.hello_frame(f),
            FrameSpec::Datagram { .. } => self.datagram_frame(f),
        }
    }

    /// A datagram, to the QP under attack (QPN 2) or another, claiming any source.
    fn datagram_frame(&self, f: &FrameSpec) -> (Frame, u8) {
        let FrameSpec::Datagram {
            psn,
            to_us,
            other_qpn,
            src_qpn,
            qkey,
            len,
            imm,
            solicited,
            grh,
            fill,
        } = *f
        else {
            unreachable!("{f:?} is not a datagram");
        };
        let frame = Frame::Datagram {
            psn: self.req_psn(psn),
            len: Self::len(len),
            dst_qpn: if to_us { 2 } else { other_qpn & PSN_MASK },
            src_qpn: src_qpn & PSN_MASK,
            qkey: qkey.unwrap_or(crate::QKEY),
            imm,
            solicited,
            grh: grh.map(|(flow_label, traffic_class, hop_limit)| Grh {
                dgid: [0xfe; 16],
                flow_label: flow_label & 0xf_ffff,
                traffic_class,
                hop_limit,
                // Either source: the receiver derives the default GID from its link's.
                src_default: flow_label & 1 == 1,
            }),
        };
        (frame, fill)
    }

    /// A request: PSN relative to what the responder expects.
    fn request_frame(&self, f: &FrameSpec) -> (Frame, u8) {
        match *f {
            FrameSpec::Send {
                psn,
                len,
                imm,
                solicited,
                ack_req,
                fill,
            } => (
                Frame::Send {
                    psn: self.req_psn(psn),
                    len: Self::len(len),
                    imm,
                    solicited,
                    ack_req,
                    inv: None,
                },
                fill,
            ),
            FrameSpec::Write {
                psn,
                len,
                at,
                key,
                imm,
                solicited,
                ack_req,
                fill,
            } => (
                Frame::Write {
                    psn: self.req_psn(psn),
                    len: Self::len(len),
                    addr: self.at(at),
                    rkey: self.key(key),
                    imm,
                    solicited,
                    ack_req,
                },
                fill,
            ),
            FrameSpec::Read { psn, len, at, key } => (
                Frame::Read {
                    inflight: 1,
                    psn: self.req_psn(psn),
                    len: Self::len(len),
                    addr: self.at(at),
                    rkey: self.key(key),
                },
                0,
            ),
            FrameSpec::CmpSwap {
                psn,
                at,
                key,
                compare,
                swap,
            } => (
                Frame::CmpSwap {
                    inflight: 1,
                    psn: self.req_psn(psn),
                    addr: self.at(at),
                    rkey: self.key(key),
                    compare,
                    swap,
                },
                0,
            ),
            FrameSpec::FetchAdd { psn, at, key, add } => (
                Frame::FetchAdd {
                    inflight: 1,
                    psn: self.req_psn(psn),
                    addr: self.at(at),
                    rkey: self.key(key),
                    add,
                },
                0,
            ),
            _ => unreachable!("{f:?} is not a request frame"),
        }
    }

    /// A response to our requester: PSN relative to its first; or an answer to a request it
    /// really sent.
    fn response_frame(&self, f: &FrameSpec) -> (Frame, u8) {
        match *f {
            FrameSpec::Ack { psn } => (
                Frame::Ack {
                    psn: self.resp_psn(psn),
                },
                0,
            ),
            FrameSpec::Nak { psn, code } => (
                {
                    let (code, reason) = nak_of(code);
                    Frame::Nak {
                        psn: self.resp_psn(psn),
                        code,
                        reason,
                    }
                },
                0,
            ),
            FrameSpec::Reply {
                which,
                how,
                orig,
                fill,
            } => {
                let Some(&req) = self.sent.get(which as usize % self.sent.len().max(1)) else {
                    return (Frame::Ack { psn: self.sq_psn }, 0);
                };
                let psn = req.psn().unwrap_or(0);
                let f = match (how % 4, req) {
                    (0, Frame::Read { len, .. }) => Frame::ReadResp { psn, len },
                    (0, Frame::CmpSwap { .. } | Frame::FetchAdd { .. }) | (3, _) => {
                        Frame::AtomicResp { psn, orig }
                    }
                    (0, _) => Frame::Ack { psn },
                    (1, _) => {
                        let (code, reason) = nak_of(orig as u8);
                        Frame::Nak { psn, code, reason }
                    }
                    (_, Frame::Read { len, .. }) => Frame::ReadResp {
                        psn,
                        len: len ^ (1 + orig as u32 % 64),
                    },
                    _ => Frame::ReadResp {
                        psn,
                        len: orig as u32 % 64,
                    },
                };
                (f, fill)
            }
            FrameSpec::ReadResp { psn, len, fill } => (
                Frame::ReadResp {
                    psn: self.resp_psn(psn),
                    len: Self::len(len),
                },
                fill,
            ),
            FrameSpec::AtomicResp { psn, orig } => (
                Frame::AtomicResp {
                    psn: self.resp_psn(psn),
                    orig,
                },
                0,
            ),
            _ => unreachable!("{f:?} is not a response frame"),
        }
    }

    /// A connection setup frame (never valid once connected).
    fn hello_frame(&self, f: &FrameSpec) -> (Frame, u8) {
        match *f {
            FrameSpec::Hello {
                src_gid,
                src_lid,
                src_qpn,
                dst_qpn,
            } => (
                Frame::Hello {
                    src_gid,
                    src_lid,
                    qp_type: verbs_api::QpType::Rc,
                    src_qpn: src_qpn & PSN_MASK,
                    dst_qpn: dst_qpn & PSN_MASK,
                    token: [0; backend_sim_proto::wire::TOKEN_LEN],
                },
                0,
            ),
            FrameSpec::LinkHello {
                src_gid,
                src_lid,
                verify: false,
            } => (
                Frame::LinkHello {
                    src_gid,
                    src_lid,
                    token: [0; backend_sim_proto::wire::TOKEN_LEN],
                },
                0,
            ),
            FrameSpec::LinkHello {
                src_gid,
                src_lid,
                verify: true,
            } => (
                Frame::LinkVerify {
                    at_ip: src_gid,
                    at_port: src_lid,
                    token: [0; backend_sim_proto::wire::TOKEN_LEN],
                },
                0,
            ),
            FrameSpec::HelloAck => (Frame::HelloAck, 0),
            FrameSpec::HelloNak { reason } => (
                Frame::HelloNak {
                    reason: match reason % 2 {
                        0 => HelloReject::Refused,
                        _ => HelloReject::Version,
                    },
                },
                0,
            ),
            _ => unreachable!("{f:?} is not a hello frame"),
        }
    }

    /// Appends a frame's header (with byte `corrupt.0` XORed by `corrupt.1`) and up to
    /// 4 KiB of its payload to `out`.
    pub(crate) fn encode(f: &Frame, fill: u8, corrupt: Option<(u8, u8)>, out: &mut Vec<u8>) {
        let mut h = [0u8; MAX_HDR_LEN];
        let n = f.encode(&mut h);
        if let Some((at, xor)) = corrupt {
            h[at as usize % n] ^= xor;
        }
        out.extend_from_slice(&h[..n]);
        let len = (f.payload_len() as usize).min(MR_MAX);
        out.extend((0..len).map(|i| fill.wrapping_add(i as u8)));
    }

    pub(crate) fn with_psn(f: Frame, psn: u32) -> Frame {
        match f {
            Frame::Send {
                len,
                imm,
                solicited,
                ack_req,
                ..
            } => Frame::Send {
                psn,
                len,
                imm,
                solicited,
                ack_req,
                inv: None,
            },
            Frame::Write {
                len,
                addr,
                rkey,
                imm,
                solicited,
                ack_req,
                ..
            } => Frame::Write {
                psn,
                len,
                addr,
                rkey,
                imm,
                solicited,
                ack_req,
            },
            Frame::Read {
                len,
                addr,
                rkey,
                inflight,
                ..
            } => Frame::Read {
                psn,
                len,
                addr,
                rkey,
                inflight,
            },
            Frame::CmpSwap {
                addr,
                rkey,
                compare,
                swap,
                inflight,
                ..
            } => Frame::CmpSwap {
                inflight,
                psn,
                addr,
                rkey,
                compare,
                swap,
            },
            Frame::FetchAdd {
                addr,
                rkey,
                add,
                inflight,
                ..
            } => Frame::FetchAdd {
                psn,
                addr,
                rkey,
                add,
                inflight,
            },
            Frame::Ack { .. } => Frame::Ack { psn },
            Frame::Nak { code, reason, .. } => Frame::Nak { psn, code, reason },
            Frame::ReadResp { len, .. } => Frame::ReadResp { psn, len },
            Frame::AtomicResp { orig, .. } => Frame::AtomicResp { psn, orig },
            Frame::Datagram {
                len,
                dst_qpn,
                src_qpn,
                qkey,
                imm,
                solicited,
                grh,
                ..
            } => Frame::Datagram {
                psn,
                len,
                dst_qpn,
                src_qpn,
                qkey,
                imm,
                solicited,
                grh,
            },
            other => other,
        }
    }
}
