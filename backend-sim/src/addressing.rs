//! Where a device is reached, and how a QP's address vector names its peer: the port's
//! LID is the device's TCP port (a unicast LID, below 0xC000, unless a port is configured:
//! [`lid_port`](crate::lid_port)), its GID table holds at index 0 the port's default GID
//! (`fe80::/64` and an EUI-64 interface id, as every HCA's: an InfiniBand port's GUID, a
//! RoCE port's MAC; the sim's is made from the device's IPv4 address, so that GID names
//! the device too: [`gid_addr`]; a device at an IPv6 address has that address there
//! instead), at index 1 the IP it advertises (`::ffff:a.b.c.d`, as RoCE v2 lists it), and
//! a wildcard listen lists the host's other addresses after those
//! ([`host_addrs`](crate::host_addrs)), as a RoCE port lists its netdev's (`man
//! ibv_query_gid`, `man ibv_query_port`).
//!
//! A device whose profile has an Ethernet port (rxe's: RoCE v2) has LID 0, as rxe0 does,
//! and is reached by its GID alone: every such device listens on [`ROCE_PORT`] (RoCE
//! v2's UDP port, here TCP) at an IP of its own, so the GID's IP names it. On loopback
//! each device draws its own address in 127.0.0.0/8 (every address there reaches the
//! host), so devices in one process and in many are told apart by IP; on another
//! address, one device per IP. An address vector on such a port needs the GRH. Its GID
//! table has rxe's length, [`ROCE_GID_TBL_LEN`] entries, the ones after the populated
//! ones empty (all zeros, as `ibv_query_gid` reads an empty entry).

/// The port every device of an Ethernet (RoCE) port listens on: RoCE v2's UDP port.
pub const ROCE_PORT: u16 = 4791;

/// The GID table length of an Ethernet (RoCE) port: rxe's `RXE_PORT_GID_TBL_LEN`
/// (drivers/infiniband/sw/rxe/rxe_param.h).
pub const ROCE_GID_TBL_LEN: u32 = 1024;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU16, Ordering};

use parking_lot::RwLock;
use verbs_api::{AhAttr, Gid, QpAttr};

/// A QP's identity on the fabric: (GID, LID, QPN), the GID as [`fabric_gid`] spells it.
/// The side of a pair with the smaller one sets the connection up.
pub type FabricId = ([u8; 16], u16, u32);

/// A device's GID in one spelling: its default GID (index 0) as the GID of its IP
/// (`::ffff:a.b.c.d`), which names the same device; so a pair agrees on which side is
/// the smaller, and a hello names its sender alike, whichever of the two each side's
/// address vector uses.
pub fn fabric_gid(gid: &[u8; 16]) -> [u8; 16] {
    match backend_sim_proto::gid::default_ipv4(gid) {
        Some(v4) => v4.to_ipv6_mapped().octets(),
        None => *gid,
    }
}

/// A device's addresses. Two change while it is open, as a real port's do
/// ([`port_addr`](crate::port_addr)): an InfiniBand port's LID (the TCP port its listener
/// moves to) and the entries an Ethernet (RoCE) port's GID table gains and loses after
/// `gids`, as addresses come and go on a netdev.
#[derive(Debug)]
pub struct Addressing {
    /// The address its listener was bound to when the device opened (the port of
    /// [`listen_addr`](Self::listen_addr) is the current one).
    pub listen: SocketAddr,
    /// The address peers reached it at when it opened (the listen address, with a
    /// wildcard IP replaced; [`advertise_addr`](Self::advertise_addr) is the current one).
    pub advertise: SocketAddr,
    /// Its GID table's entries from index 0, populated at open.
    pub gids: Vec<Gid>,
    /// Its GID table's length (`gid_tbl_len`): `gids`, then empty entries.
    pub gid_tbl_len: u32,
    /// An Ethernet (RoCE) port: LID 0, reached by GID alone.
    pub roce: bool,
    /// The TCP port its listener is at now: the LID of an InfiniBand port.
    port: AtomicU16,
    /// The entries after `gids` (index `gids.len()` on), added while the device is open;
    /// a removed one reads as the zero GID, an empty entry, the others keeping their index
    /// as the kernel's GID table keeps them.
    added: RwLock<Vec<Gid>>,
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
                gids: vec![default_gid(bound.ip()), gid(bound.ip())],
                gid_tbl_len: 2,
                roce: false,
                port: AtomicU16::new(bound.port()),
                added: RwLock::default(),
            };
        }
        let host = crate::host_addrs::host_addrs();
        let ip = advertise.unwrap_or_else(|| crate::host_addrs::advertised(bound.ip(), &host));
        let mut gids = vec![default_gid(ip), gid(ip)];
        // A socket bound to 0.0.0.0 accepts IPv4 only; one bound to `::` both families.
        let listed = host
            .into_iter()
            .filter(|a| *a != ip && !a.is_loopback() && (bound.is_ipv6() || a.is_ipv4()));
        gids.extend(listed.map(gid));
        Addressing {
            listen: bound,
            advertise: SocketAddr::new(ip, bound.port()),
            gid_tbl_len: gids.len() as u32,
            gids,
            roce: false,
            port: AtomicU16::new(bound.port()),
            added: RwLock::default(),
        }
    }

    /// The same, for an Ethernet (RoCE) port (bound at [`ROCE_PORT`]), with rxe's GID
    /// table length.
    pub fn roce(self) -> Addressing {
        Addressing {
            roce: true,
            gid_tbl_len: ROCE_GID_TBL_LEN.max(self.gids.len() as u32),
            ..self
        }
    }

    /// The GID at table `index`: a populated entry, the zero GID of an empty one, or
    /// `None` past the table's length.
    pub fn gid_at(&self, index: u32) -> Option<Gid> {
        match self.entry(index) {
            Some(g) => Some(g),
            None if index < self.gid_tbl_len => Some(Gid::default()),
            None => None,
        }
    }

    /// The populated entry at `index` (an entry added and removed again is empty).
    fn entry(&self, index: u32) -> Option<Gid> {
        let i = index as usize;
        match self.gids.get(i) {
            Some(g) => Some(*g),
            None => self
                .added
                .read()
                .get(i - self.gids.len())
                .copied()
                .filter(|g| *g != Gid::default()),
        }
    }

    /// The populated entries: those of the open, then the added ones still there.
    pub fn populated(&self) -> Vec<Gid> {
        let added = self.added.read();
        let live = added.iter().filter(|g| **g != Gid::default());
        self.gids.iter().chain(live).copied().collect()
    }

    /// Whether the GID table lists `gid` (in [`fabric_gid`]'s spelling or as given).
    pub fn holds_gid(&self, gid: &[u8; 16]) -> bool {
        let same = |g: &Gid| g.0 == *gid || fabric_gid(&g.0) == fabric_gid(gid);
        self.gids.iter().any(same) || self.added.read().iter().any(same)
    }

    /// Adds `gid` to the table at its first empty entry after those populated at open;
    /// its index, or `None` if the table is full.
    pub(crate) fn add_gid(&self, gid: Gid) -> Option<u32> {
        let mut added = self.added.write();
        let i = match added.iter().position(|g| *g == Gid::default()) {
            Some(i) => i,
            None if ((self.gids.len() + added.len()) as u32) < self.gid_tbl_len => {
                added.push(Gid::default());
                added.len() - 1
            }
            None => return None,
        };
        added[i] = gid;
        Some((self.gids.len() + i) as u32)
    }

    /// Empties the entry at `index`, one [`add_gid`](Self::add_gid) filled; the GID it
    /// held, or `None` if it is not such an entry.
    pub(crate) fn remove_gid(&self, index: u32) -> Option<Gid> {
        let i = (index as usize).checked_sub(self.gids.len())?;
        let mut added = self.added.write();
        let g = added.get_mut(i).filter(|g| **g != Gid::default())?;
        Some(std::mem::take(g))
    }

    /// The address its listener is at now: the listen IP and the current port.
    pub fn listen_addr(&self) -> SocketAddr {
        SocketAddr::new(self.listen.ip(), self.port.load(Ordering::Acquire))
    }

    /// The address peers reach it at now: the advertised IP and the current port.
    pub fn advertise_addr(&self) -> SocketAddr {
        SocketAddr::new(self.advertise.ip(), self.port.load(Ordering::Acquire))
    }

    /// Its listener moved to TCP port `port`: an InfiniBand port's new LID.
    pub(crate) fn set_port(&self, port: u16) {
        self.port.store(port, Ordering::Release);
    }

    /// The GID of the device's IP (`::ffff:a.b.c.d`, or the IPv6 address): what its UD
    /// links name it by; a datagram's source GID is this one or the default GID made of
    /// it (`backend_sim_proto::gid`), as the sender's address handle says.
    pub fn ip_gid(&self) -> Gid {
        self.gids[1]
    }

    /// The port's LID: the TCP port, or 0 on an Ethernet port.
    pub fn lid(&self) -> u16 {
        if self.roce {
            0
        } else {
            self.port.load(Ordering::Acquire)
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

    /// Whether `index` names a populated GID entry (an address vector's `sgid_index`);
    /// the error names the attribute and says why.
    pub fn check_sgid_index(&self, index: u8) -> Result<(), (&'static str, String)> {
        if self.entry(index.into()).is_some() {
            return Ok(());
        }
        let why = if u32::from(index) < self.gid_tbl_len {
            format!(
                "GID index {index} is an empty entry (entries 0..{} of the {}-entry table were populated \
                 at open, and later ones as addresses were added)",
                self.gids.len(),
                self.gid_tbl_len
            )
        } else {
            format!(
                "index {index} is outside the GID table of {} entries",
                self.gid_tbl_len
            )
        };
        Err(("ah_attr.grh.sgid_index", why))
    }

    /// The GID at table index 0.
    pub fn gid(&self) -> Gid {
        self.gids[0]
    }

    /// Whether `addr` is this device's own (an address vector that names it): where its
    /// listener is now, or on an Ethernet port an address added to its GID table.
    pub fn is_self(&self, addr: SocketAddr) -> bool {
        addr == self.listen_addr()
            || addr == self.advertise_addr()
            || (self.roce
                && addr.port() == ROCE_PORT
                && self.added.read().iter().any(|g| gid_addr(&g.0, 0) == addr))
    }

    /// QP `qpn`'s identity as its hello names it, with address vector `a`: the GID at
    /// the AV's `sgid_index` (the source GID of a RoCE packet), or without a GRH the
    /// first entry.
    pub fn local_id(&self, qpn: u32, a: &QpAttr) -> FabricId {
        let gid = match a.ah_attr.is_global {
            true => {
                let i = u32::from(a.ah_attr.grh.sgid_index);
                // An entry emptied since it was added names no one: the zero GID, which
                // no peer expects.
                let emptied =
                    i as usize >= self.gids.len() && (i as usize) < self.gids.len() + self.added.read().len();
                self.entry(i)
                    .unwrap_or(if emptied { Gid::default() } else { self.gids[0] })
            }
            false => self.gids[0],
        };
        (fabric_gid(&gid.0), self.lid(), qpn)
    }

    /// The LID an address vector names: its DLID on InfiniBand, none (0, an Ethernet
    /// port's LID) on an Ethernet (RoCE) port, where the GID alone names the peer and the
    /// DLID is ignored, as rxe and mlx5 ignore it.
    pub fn av_lid(&self, ah: &AhAttr) -> u16 {
        if self.roce {
            0
        } else {
            ah.dlid
        }
    }

    /// The peer's identity as the address vector and destination QPN name it.
    pub fn remote_id(&self, a: &QpAttr) -> FabricId {
        let gid = if a.ah_attr.is_global {
            a.ah_attr.grh.dgid.0
        } else {
            self.gid().0
        };
        (fabric_gid(&gid), self.av_lid(&a.ah_attr), a.dest_qp_num)
    }

    /// Where the peer device of `attr`'s address vector listens.
    pub fn remote_addr(&self, attr: &QpAttr) -> SocketAddr {
        self.av_addr(&attr.ah_attr)
    }

    /// Where the device an address vector (a QP's, or an address handle's) names
    /// listens: the IP its GRH's DGID holds, or without a GRH this device's own, and the
    /// port its DLID is ([`ROCE_PORT`] on an Ethernet port: [`av_lid`](Self::av_lid)).
    pub fn av_addr(&self, ah: &AhAttr) -> SocketAddr {
        if ah.is_global {
            gid_addr(&ah.grh.dgid.0, self.av_lid(ah))
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
        addr.port() == self.listen_addr().port()
            && self.listen.ip().is_unspecified()
            && (addr.ip().is_loopback() || self.gids.iter().any(|g| gid_addr(&g.0, 0).ip() == addr.ip()))
    }
}

/// The listener a GID and a LID name: the GID's IP (an IPv4-mapped GID as IPv4, a
/// sim device's default GID as the IPv4 address its MAC holds) and the LID as the port,
/// or LID 0 (an Ethernet port's) [`ROCE_PORT`].
pub fn gid_addr(gid: &[u8; 16], lid: u16) -> SocketAddr {
    let v6 = std::net::Ipv6Addr::from(fabric_gid(gid));
    let ip = match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    };
    SocketAddr::new(ip, if lid == 0 { ROCE_PORT } else { lid })
}

/// A port's default GID (index 0, see the module docs): made of the device's IPv4
/// address (`backend_sim_proto::gid::default_of`), or an IPv6 address's own GID.
pub fn default_gid(ip: IpAddr) -> Gid {
    let ip_gid = match ip {
        IpAddr::V4(v4) => Gid::from(v4),
        IpAddr::V6(v6) => Gid::from(v6),
    };
    Gid(backend_sim_proto::gid::default_of(&ip_gid.0))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roce_default_gid_is_link_local_and_names_its_device() {
        let ip: IpAddr = "127.3.4.5".parse().unwrap();
        let g = default_gid(ip);
        assert_eq!(
            std::net::Ipv6Addr::from(g.0),
            "fe80::7fff:fe03:405".parse::<std::net::Ipv6Addr>().unwrap()
        );
        assert_eq!(gid_addr(&g.0, 0), SocketAddr::new(ip, ROCE_PORT));
        // An ordinary link-local GID is an IPv6 address.
        let other: std::net::Ipv6Addr = "fe80::1:2ff:fe03:405".parse().unwrap();
        assert_eq!(gid_addr(&other.octets(), 0).ip(), IpAddr::V6(other));
    }

    #[test]
    fn a_roce_table_has_rxes_shape() {
        let bound: SocketAddr = "127.9.8.7:4791".parse().unwrap();
        let a = Addressing::new(bound, None).roce();
        assert_eq!(a.gid_tbl_len, ROCE_GID_TBL_LEN);
        assert_eq!(a.gid_at(0), Some(default_gid(bound.ip())));
        assert_eq!(
            a.gid_at(1),
            Some(Gid::from("127.9.8.7".parse::<std::net::Ipv4Addr>().unwrap()))
        );
        assert_eq!(a.gid_at(2), Some(Gid::default()));
        assert_eq!(a.gid_at(ROCE_GID_TBL_LEN), None);
        assert_eq!(gid_addr(&a.gid().0, a.lid()), a.advertise);
    }
}
