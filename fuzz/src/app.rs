//! What the application does: post receives and send WRs (good ones, and ones with bad
//! keys or SGEs), with every posted receive remembered for the completion checks.

use backend_sim_proto::requester::UdRoute;
use backend_sim_proto::wire::Grh;
use verbs_api::{AddressHandle, AhAttr, RecvWr, SendWr, Sge};

use crate::harness::Harness;
use crate::input::{KeySel, WrSpec};
use crate::regions::{KEYS, LOCAL, REGION_LEN, TARGET};

/// The address handle of the harness's UD sends (the requester takes their route).
struct NoAh;

impl AddressHandle for NoAh {
    fn attr(&self) -> AhAttr {
        AhAttr::default()
    }
}

impl Harness {
    /// The application posts a receive (a `PostRecv` step), never into `TARGET`.
    pub(crate) fn post_recv_step(&mut self, key: KeySel, off: u16, len: u16, split: bool) {
        if self.err {
            return;
        }
        // Receives never name TARGET, so that only remote writes change it.
        let key = match self.key(key) {
            k if k == KEYS[TARGET] => KEYS[LOCAL],
            k => k,
        };
        let base = self.regions.iter().find(|m| m.key == key).map_or(0, |m| m.addr());
        let off = off as u64 % 4608;
        let len = len as u32 % 4608;
        if split {
            let a = len / 2;
            self.post_recv(&[
                Sge::new(base + off, a, key),
                Sge::new(base + off + a as u64 + 8, len - a, key),
            ]);
        } else {
            self.post_recv(&[Sge::new(base + off, len, key)]);
        }
    }

    /// Posts a receive of `sges`.
    pub(crate) fn post_recv(&mut self, sges: &[Sge]) {
        let id = self.next_id;
        if self.resp.post(&RecvWr::new(id, sges)).is_ok() {
            self.next_id += 1;
            let cap = sges.iter().map(|s| s.length as u64).sum();
            self.recvs.push_back((id, cap));
        }
    }

    /// Posts the send WR `w` (signaled).
    pub(crate) fn post_send(&mut self, w: &WrSpec) {
        let id = self.next_id;
        let local = |off: usize, len: usize| {
            let off = off % REGION_LEN[LOCAL];
            let len = len.min(REGION_LEN[LOCAL] - off);
            (off, len)
        };
        let sg: Vec<Sge>;
        let wr = match *w {
            WrSpec::Send { len, imm, inline } => {
                let (o, l) = local(0, len as usize % 4096);
                sg = vec![Sge::new(self.addr(LOCAL, o), l as u32, KEYS[LOCAL])];
                let wr = match imm {
                    Some(i) => SendWr::send_with_imm(id, &sg, i),
                    None => SendWr::send(id, &sg),
                };
                if inline && l <= 64 {
                    wr.inline()
                } else {
                    wr
                }
            }
            WrSpec::Write { len, addr, rkey } => {
                let (o, l) = local(0, len as usize % 4096);
                sg = vec![Sge::new(self.addr(TARGET, o), l as u32, KEYS[TARGET])];
                SendWr::write(id, &sg, (addr, rkey))
            }
            WrSpec::Read {
                len,
                off,
                split,
                addr,
            } => {
                let (o, l) = local(off as usize, len as usize % 4096);
                sg = if split && l >= 2 {
                    vec![
                        Sge::new(self.addr(LOCAL, o), (l / 2) as u32, KEYS[LOCAL]),
                        Sge::new(self.addr(LOCAL, o + l / 2), (l - l / 2) as u32, KEYS[LOCAL]),
                    ]
                } else {
                    vec![Sge::new(self.addr(LOCAL, o), l as u32, KEYS[LOCAL])]
                };
                SendWr::read(id, &sg, (addr, 0x1234))
            }
            WrSpec::CmpSwap { off, compare, swap } => {
                let o = (off as usize % (REGION_LEN[LOCAL] / 8)) * 8;
                sg = vec![Sge::new(self.addr(LOCAL, o), 8, KEYS[LOCAL])];
                SendWr::cmp_and_swp(id, &sg, (0x1000, 0x1234), compare, swap)
            }
            WrSpec::FetchAdd { off, add } => {
                let o = (off as usize % (REGION_LEN[LOCAL] / 8)) * 8;
                sg = vec![Sge::new(self.addr(LOCAL, o), 8, KEYS[LOCAL])];
                SendWr::fetch_and_add(id, &sg, (0x1000, 0x1234), add)
            }
            WrSpec::BadSge { key, off, len } => {
                let key = self.key(key);
                let base = self.regions.iter().find(|m| m.key == key).map_or(0, |m| m.addr());
                sg = vec![Sge::new(base + off as u64 % 4608, len as u32 % 4608, key)];
                SendWr::send(id, &sg)
            }
        };
        let posted = if self.ud {
            // Every WR through one address handle (whose route the harness makes up); the
            // opcodes UD lacks are refused.
            let ah = NoAh;
            let route = UdRoute {
                peer: std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
                grh: id.is_multiple_of(2).then_some(Grh::default()),
                remote_qpn: 0x42,
                remote_qkey: if id.is_multiple_of(3) {
                    0x8000_0000
                } else {
                    crate::QKEY
                },
            };
            let wr = wr.signaled().ud(&ah, route.remote_qpn, route.remote_qkey);
            self.req.post_ud(&wr, route, &self.mrs)
        } else {
            self.req.post(&wr.signaled(), &self.mrs)
        };
        if posted.is_ok() {
            self.next_id += 1;
        }
    }
}
