//! Where a device is reached, and how a QP's address vector names its peer: the port's
//! LID is the device's TCP port (a unicast LID, below 0xC000, unless a port is configured:
//! [`lid_port`](crate::lid_port)), its GID table holds the IP it advertises (entries 0 and
//! 1, for programs written for InfiniBand and for RoCE v2), and a wildcard listen lists
//! the host's other addresses after those ([`host_addrs`](crate::host_addrs)), as a RoCE
//! port lists its netdev's (`man ibv_query_gid`, `man ibv_query_port`).
//!
//! A device whose profile has an Ethernet port (rxe's: RoCE v2) has LID 0, as rxe0 does,
//! and is reached by its GID alone: every such device listens on [`ROCE_PORT`] (RoCE
//! v2's UDP port, here TCP) at an IP of its own, so the GID's IP names it. On loopback
//! each device draws its own address in 127.0.0.0/8 (every address there reaches the
//! host), so devices in one process and in many are told apart by IP; on another
//! address, one device per IP. An address vector on such a port needs the GRH.

/// The port every device of an Ethernet (RoCE) port listens on: RoCE v2's UDP port.
pub const ROCE_PORT: u16 = 4791;

use std::net::{IpAddr, SocketAddr};

use verbs_api::{AhAttr, Gid, QpAttr};

/// A QP's identity on the fabric: (GID, LID, QPN). The side of a pair with the smaller
/// one sets the connection up.
pub type FabricId = ([u8; 16], u16, u32);

/// A device's addresses.
#[derive(Clone, Debug)]
pub struct Addressing {
    /// The address its listener is bound to.
    pub listen: SocketAddr,
    /// The address peers reach it at (the listen address, with a wildcard IP replaced).
    pub advertise: SocketAddr,
    /// Its GID table.
    pub gids: Vec<Gid>,
    /// An Ethernet (RoCE) port: LID 0, reached by GID alone.
    pub roce: bool,
}

impl Addressing {
    /// The addresses of a device bound to `bound`: a wildcard IP advertises `advertise`,
    /// or else the host's first non-loopback address of its family.
    pub fn new(bound: SocketAddr, advertise: Option<IpAddr>) -> Addressing {
        let gid = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => Gid::from(v4),
            IpAddr::V6(v6) => Gid::from(v6),
        };
        if !bound.ip().is_unspecified() {
            return Addressing {
                listen: bound,
                advertise: bound,
                gids: vec![gid(bound.ip()); 2],
                roce: false,
            };
        }
        let host = crate::host_addrs::host_addrs();
        let ip = advertise.unwrap_or_else(|| crate::host_addrs::advertised(bound.ip(), &host));
        let mut gids = vec![gid(ip); 2];
        // A socket bound to 0.0.0.0 accepts IPv4 only; one bound to `::` both families.
        let listed = host
            .into_iter()
            .filter(|a| *a != ip && !a.is_loopback() && (bound.is_ipv6() || a.is_ipv4()));
        gids.extend(listed.map(gid));
        Addressing {
            listen: bound,
            advertise: SocketAddr::new(ip, bound.port()),
            gids,
            roce: false,
        }
    }

    /// The same, for an Ethernet (RoCE) port (bound at [`ROCE_PORT`]).
    pub fn roce(self) -> Addressing {
        Addressing { roce: true, ..self }
    }

    /// The port's LID: the TCP port, or 0 on an Ethernet port.
    pub fn lid(&self) -> u16 {
        if self.roce {
            0
        } else {
            self.listen.port()
        }
    }

    /// Whether an address vector with (`is_global`, `dlid`) can name a peer: on
    /// InfiniBand a LID, 0 being none; on Ethernet (RoCE) the GRH, whose DGID alone
    /// names the peer. The error names the attribute and says why.
    pub fn check_av(&self, is_global: bool, dlid: u16) -> Result<(), (&'static str, String)> {
        if self.roce && !is_global {
            return Err((
                "ah_attr.is_global",
                "an Ethernet (RoCE) port reaches its peers by GID: the address vector needs the GRH".into(),
            ));
        }
        if !self.roce && dlid == 0 {
            return Err((
                "ah_attr.dlid",
                "LID 0 is not a valid destination (on the sim the LID is the peer device's TCP port)".into(),
            ));
        }
        Ok(())
    }

    /// The GID at table index 0.
    pub fn gid(&self) -> Gid {
        self.gids[0]
    }

    /// Whether `addr` is this device's own (an address vector that names it).
    pub fn is_self(&self, addr: SocketAddr) -> bool {
        addr == self.listen || addr == self.advertise
    }

    /// QP `qpn`'s identity as its hello names it, with address vector `a`: the GID at
    /// the AV's `sgid_index` (the source GID of a RoCE packet), or without a GRH the
    /// first entry.
    pub fn local_id(&self, qpn: u32, a: &QpAttr) -> FabricId {
        let gid = match a.ah_attr.is_global {
            true => self.gids.get(a.ah_attr.grh.sgid_index as usize),
            false => None,
        };
        (gid.unwrap_or(&self.gids[0]).0, self.lid(), qpn)
    }

    /// The peer's identity as the address vector and destination QPN name it.
    pub fn remote_id(&self, a: &QpAttr) -> FabricId {
        let gid = if a.ah_attr.is_global {
            a.ah_attr.grh.dgid.0
        } else {
            self.gid().0
        };
        (gid, a.ah_attr.dlid, a.dest_qp_num)
    }

    /// Where the peer device of `attr`'s address vector listens.
    pub fn remote_addr(&self, attr: &QpAttr) -> SocketAddr {
        self.av_addr(&attr.ah_attr)
    }

    /// Where the device an address vector (a QP's, or an address handle's) names
    /// listens: the IP its GRH's DGID holds, or without a GRH this device's own, and the
    /// port its DLID is.
    pub fn av_addr(&self, ah: &AhAttr) -> SocketAddr {
        if ah.is_global {
            gid_addr(&ah.grh.dgid.0, ah.dlid)
        } else {
            // Without a GRH the peer is on this "subnet": the same host address.
            SocketAddr::new(self.advertise.ip(), ah.dlid)
        }
    }

    /// Whether `addr` reaches this device's listener: its own address, or with a
    /// wildcard listen its port at a loopback address or one of the addresses its GID
    /// table lists.
    pub fn reaches_self(&self, addr: SocketAddr) -> bool {
        let addr = canonical(addr);
        if self.is_self(addr) {
            return true;
        }
        addr.port() == self.listen.port()
            && self.listen.ip().is_unspecified()
            && (addr.ip().is_loopback() || self.gids.iter().any(|g| gid_addr(&g.0, 0).ip() == addr.ip()))
    }
}

/// The listener a GID and a LID name: the GID's IP (an IPv4-mapped GID as IPv4) and the
/// LID as the port, or LID 0 (an Ethernet port's) [`ROCE_PORT`].
pub fn gid_addr(gid: &[u8; 16], lid: u16) -> SocketAddr {
    let v6 = std::net::Ipv6Addr::from(*gid);
    let ip = match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    };
    SocketAddr::new(ip, if lid == 0 { ROCE_PORT } else { lid })
}

/// An address in one spelling: an IPv4-mapped IPv6 address as IPv4 (what a dual-stack
/// socket reports for an IPv4 peer), so that the two ends of a link name it alike.
pub fn canonical(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => a,
        },
        IpAddr::V4(_) => a,
    }
}
