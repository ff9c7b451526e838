//! The files of the tree: for each sim device the entries of the kernel's sysfs layout
//! that programs read (drivers/infiniband/core/sysfs.c and device.c, as rdma-core's
//! libibverbs and providers, UCX and Open MPI find them), with the kernel's formats, and
//! its device node:
//!
//! - `sys/class/infiniband/<dev>/`: `node_type`, `node_guid`, `sys_image_guid`, `fw_ver`,
//!   `hca_type`, `board_id`, `node_desc`; and once the process opens the device (the sim
//!   gives a port its LID and GIDs when it opens it), `ports/1/`: `state`, `phys_state`,
//!   `link_layer`, `rate`, `lid`, `lid_mask_count`, `sm_lid`, `sm_sl`, `pkeys/0`,
//!   `gids/<i>`, `gid_attrs/types/<i>` and, on an Ethernet (RoCE) port,
//!   `gid_attrs/ndevs/<i>` (the netdev that holds the GID's address: `lo` for the
//!   loopback addresses the sim uses by default). Only the populated GID entries have
//!   files (a kernel lists the empty ones as zero GIDs whose type reads fail). There is no
//!   `device` link: the sim's devices are virtual, as rxe's are
//!   (`/sys/devices/virtual/infiniband`), which programs take as "no PCI locality" (UCX:
//!   every CPU local, NUMA node unknown). `device/net/<ifname>` names the network
//!   interface that holds the device's address, as an rxe device's does (pyverbs'
//!   rdma_cm tests find the address to listen on there).
//! - `sys/class/infiniband_verbs/`: `abi_version` (6, the uverbs ABI) and per device
//!   `uverbs<N>/` with `ibdev`, `abi_version` and `dev` (uverbs' major 231, minors from
//!   192).
//! - `dev/infiniband/uverbs<N>`: a link to `/dev/null`, a character device every user
//!   may read and write, which is what UCX checks (`uct_ib_device_is_accessible()`); the
//!   sim's verbs never use it.
//! - `dev/infiniband/rdma_cm` (a link to `/dev/null` for `stat` and `access`; opening
//!   it opens the sim's connection manager, [`crate::ucma`]) and
//!   `sys/class/misc/rdma_cm/`: `abi_version` (4, the rdma_cm ABI librdmacm checks) and
//!   `dev`.

use std::io;
use std::net::IpAddr;

use verbs_api::{guid_text, Context as _, Gid, LinkLayer};

use super::tree::{self, Tree};
use super::{DEV, IB_CLASS, MISC_CM, VERBS_CLASS};
use crate::runtime::{runtime, Device, SimContext};

/// uverbs' character-device major (`IB_UVERBS_MAJOR`) and its first minor.
const UVERBS_MAJOR: u32 = 231;
const UVERBS_BASE_MINOR: u32 = 192;

/// Fills a new tree: the class directories, every device's node files, links and uverbs
/// entry, and the ports of the devices already open.
pub fn fill(tree: &Tree) -> io::Result<()> {
    tree.writing(|| {
        tree.dir(DEV)?;
        tree.dir(IB_CLASS)?;
        tree.write(&format!("{VERBS_CLASS}/abi_version"), "6")?;
        tree.link(&format!("{DEV}/rdma_cm"), "/dev/null")?;
        tree.write(
            &format!("{MISC_CM}/abi_version"),
            &crate::abi::ucma::RDMA_USER_CM_ABI_VERSION.to_string(),
        )?;
        tree.write(&format!("{MISC_CM}/dev"), &crate::ucma::rdev_text())?;
        // A bad setting lists no devices: the tree is empty, as the device list is.
        let Ok(rt) = runtime() else { return Ok(()) };
        for d in &rt.devices {
            node(tree, d)?;
            if let Some(ctx) = d.opened() {
                port(tree, d, &ctx)?;
            }
        }
        Ok(())
    })
}

/// Writes the port files of `d`, just opened as `ctx` (making the tree if it is not yet
/// made: its making, which writes the ports of the devices open then, may be under way
/// in another thread, and waiting for it leaves no open device without its files).
pub fn opened(d: &Device, ctx: &SimContext) {
    if let Ok(t) = tree::get() {
        if let Err(e) = t.writing(|| port(t, d, ctx)) {
            tracing::warn!(device = %d.name, error = %e, "cannot write the device's port files in /sys");
        }
    }
}

/// The uverbs name of the device at `index` in the list (`ibv_device.dev_name`, its
/// `class/infiniband_verbs` entry and its node in `/dev/infiniband`), as the kernel
/// numbers them.
pub fn uverbs_name(index: u32) -> String {
    format!("uverbs{index}")
}

fn node(tree: &Tree, d: &Device) -> io::Result<()> {
    let dir = format!("{IB_CLASS}/{}", d.name);
    let guid = guid_text(d.guid);
    for (file, text) in [
        ("node_type", "1: CA".to_string()),
        ("node_guid", guid.clone()),
        ("sys_image_guid", guid),
        ("fw_ver", concat!("sim-", env!("CARGO_PKG_VERSION")).to_string()),
        ("hca_type", "sim".to_string()),
        ("board_id", "VERBS-RS-SIM".to_string()),
        ("node_desc", format!("{} (verbs-rs simulated HCA)", d.name)),
    ] {
        tree.write(&format!("{dir}/{file}"), &text)?;
    }
    let uverbs = uverbs_name(d.index);
    let vdir = format!("{VERBS_CLASS}/{uverbs}");
    tree.write(&format!("{vdir}/ibdev"), &d.name)?;
    tree.write(&format!("{vdir}/abi_version"), "1")?;
    tree.write(
        &format!("{vdir}/dev"),
        &format!("{UVERBS_MAJOR}:{}", UVERBS_BASE_MINOR + d.index),
    )?;
    tree.link(&format!("{DEV}/{uverbs}"), "/dev/null")?;
    if let Some(net) = runtime()
        .ok()
        .and_then(|rt| netdev_of(rt.backend.advertised_ip()))
    {
        tree.dir(&format!("{dir}/device/net/{net}"))?;
    }
    Ok(())
}

fn port(tree: &Tree, d: &Device, ctx: &SimContext) -> io::Result<()> {
    let p = ctx.query_port(1).map_err(io::Error::other)?;
    let dir = format!("{IB_CLASS}/{}/ports/1", d.name);
    tree.clear(&dir)?;
    let ethernet = p.link_layer == LinkLayer::Ethernet;
    let state = match p.state as u8 {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        _ => "ACTIVE_DEFER",
    };
    for (file, text) in [
        ("state", format!("{}: {state}", p.state as u8)),
        ("phys_state", phys_state(p.phys_state)),
        (
            "link_layer",
            if ethernet { "Ethernet" } else { "InfiniBand" }.to_string(),
        ),
        ("rate", rate(p.active_speed, p.active_width)),
        ("lid", format!("{:#x}", p.lid)),
        ("lid_mask_count", p.lmc.to_string()),
        ("sm_lid", format!("{:#x}", p.sm_lid)),
        ("sm_sl", "0".to_string()),
        ("pkeys/0", "0xffff".to_string()),
    ] {
        tree.write(&format!("{dir}/{file}"), &text)?;
    }
    // The device's own address (GID 1); GID 0, the default GID, is made of it.
    let own = ctx.query_gid(1, 1).ok().and_then(|g| gid_ip(&g));
    for i in 0..p.gid_tbl_len {
        let g = ctx.query_gid(1, i).map_err(io::Error::other)?;
        if g.is_zero() {
            continue;
        }
        // `ibv_devinfo`'s spelling is sysfs' (eight groups of four hex digits).
        tree.write(&format!("{dir}/gids/{i}"), &g.to_string())?;
        let ty = if ethernet { "RoCE v2" } else { "IB/RoCE v1" };
        tree.write(&format!("{dir}/gid_attrs/types/{i}"), ty)?;
        let ip = if i == 0 { own } else { gid_ip(&g) };
        if let Some(dev) = ethernet.then_some(ip).flatten().and_then(netdev_of) {
            tree.write(&format!("{dir}/gid_attrs/ndevs/{i}"), &dev)?;
        }
    }
    Ok(())
}

/// The address a GID holds: IPv4 for an IPv4-mapped GID, else the IPv6 address.
fn gid_ip(g: &Gid) -> Option<IpAddr> {
    if g.is_zero() {
        return None;
    }
    Some(match g.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(g.to_ipv6()),
    })
}

/// `phys_state` as the kernel's `phys_state_show()` spells it.
fn phys_state(s: u8) -> String {
    let name = match s {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "Phy Test",
        _ => "<unknown>",
    };
    format!("{s}: {name}")
}

/// `rate` as the kernel's `rate_show()` spells it: "2.5 Gb/sec (1X SDR)".
fn rate(speed: u8, width: u8) -> String {
    let (name, deci_gbps) = match speed {
        2 => ("DDR", 50),
        4 => ("QDR", 100),
        8 => ("FDR10", 100),
        16 => ("FDR", 140),
        32 => ("EDR", 250),
        64 => ("HDR", 500),
        128 => ("NDR", 1000),
        _ => ("SDR", 25),
    };
    let lanes = match width {
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 1,
    };
    let r = deci_gbps * lanes;
    let half = if r % 10 != 0 { ".5" } else { "" };
    format!("{}{half} Gb/sec ({lanes}X {name})", r / 10)
}

/// The network interface that holds `ip`: the one with that address, else the one whose
/// subnet contains it (127.0.0.0/8 on `lo` holds every loopback address).
fn netdev_of(ip: IpAddr) -> Option<String> {
    let mut ifs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifs` with a list freed below.
    if unsafe { libc::getifaddrs(&mut ifs) } != 0 {
        return None;
    }
    let mut exact = None;
    let mut subnet = None;
    let mut cur = ifs;
    while !cur.is_null() {
        // SAFETY: `cur` is an element of the list getifaddrs made, alive until freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        // SAFETY: the address and netmask are NULL or sockaddrs of their family.
        let (addr, mask) = unsafe { (sock_ip(ifa.ifa_addr), sock_ip(ifa.ifa_netmask)) };
        let Some(addr) = addr else { continue };
        // SAFETY: `ifa_name` is a NUL-terminated interface name.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        if addr == ip {
            exact.get_or_insert(name);
        } else if mask.is_some_and(|m| same_subnet(addr, ip, m)) {
            subnet.get_or_insert(name);
        }
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(ifs) };
    exact.or(subnet)
}

/// The IP address of an AF_INET or AF_INET6 sockaddr.
///
/// # Safety
///
/// `sa` is NULL or points to a sockaddr of the size its family has.
unsafe fn sock_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's contract; the family says which struct it is.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let a = &*sa.cast::<libc::sockaddr_in>();
                // `s_addr` is in network byte order: its bytes in memory are the octets.
                Some(IpAddr::from(a.sin_addr.s_addr.to_ne_bytes()))
            }
            libc::AF_INET6 => {
                let a = &*sa.cast::<libc::sockaddr_in6>();
                Some(IpAddr::from(a.sin6_addr.s6_addr))
            }
            _ => None,
        }
    }
}

fn same_subnet(a: IpAddr, b: IpAddr, mask: IpAddr) -> bool {
    let bytes = |ip: IpAddr| match ip {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    };
    let (a, b, m) = (bytes(a), bytes(b), bytes(mask));
    a.len() == b.len() && a.len() == m.len() && a.iter().zip(&b).zip(&m).all(|((x, y), k)| x & k == y & k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_spellings() {
        assert_eq!(rate(1, 1), "2.5 Gb/sec (1X SDR)");
        assert_eq!(rate(32, 2), "100 Gb/sec (4X EDR)");
        assert_eq!(phys_state(5), "5: LinkUp");
        let g = Gid::from(std::net::Ipv4Addr::new(127, 0, 0, 1));
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:7f00:0001");
        assert_eq!(gid_ip(&g), Some("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn a_loopback_address_is_on_lo() {
        assert_eq!(netdev_of("127.9.8.7".parse().unwrap()).as_deref(), Some("lo"));
        assert_eq!(netdev_of("127.0.0.1".parse().unwrap()).as_deref(), Some("lo"));
    }
}
