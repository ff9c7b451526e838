//! Device and port attribute values as `ibv_devinfo -v` prints them: libibverbs' names
//! with their numbers (`PORT_ACTIVE (4)`, `ATOMIC_HCA (1)`, `4X (2)`, ...), for
//! `devinfo`.

use verbs_api::{AtomicCap, LinkLayer, Mtu, PortState};

/// An atomic capability: its libibverbs name and number.
pub fn atomic_cap(a: AtomicCap) -> String {
    let name = match a {
        AtomicCap::None => "ATOMIC_NONE",
        AtomicCap::Hca => "ATOMIC_HCA",
        AtomicCap::Glob => "ATOMIC_GLOB",
    };
    format!("{name} ({})", a as u32)
}

/// A port state: its libibverbs name and number.
pub fn port_state(s: PortState) -> String {
    let name = match s {
        PortState::Nop => "PORT_NOP",
        PortState::Down => "PORT_DOWN",
        PortState::Init => "PORT_INIT",
        PortState::Armed => "PORT_ARMED",
        PortState::Active => "PORT_ACTIVE",
        PortState::ActiveDefer => "PORT_ACTIVE_DEFER",
    };
    format!("{name} ({})", s as u32)
}

/// An MTU: bytes and its libibverbs number.
pub fn mtu(m: Mtu) -> String {
    format!("{} ({})", m.bytes(), m as u32)
}

/// A link layer's name.
pub fn link_layer(l: LinkLayer) -> &'static str {
    match l {
        LinkLayer::Ethernet => "Ethernet",
        LinkLayer::InfiniBand => "InfiniBand",
        LinkLayer::Unspecified => "Unspecified",
    }
}

/// An `active_width` code: the link width and the code.
pub fn width(w: u8) -> String {
    let name = match w {
        1 => "1X",
        2 => "4X",
        4 => "8X",
        8 => "12X",
        16 => "2X",
        _ => "invalid width",
    };
    format!("{name} ({w})")
}

/// An `active_speed` code: the lane speed and the code.
pub fn speed(s: u8) -> String {
    let name = match s {
        1 => "2.5 Gbps",
        2 => "5.0 Gbps",
        4 | 8 => "10.0 Gbps",
        16 => "14.0 Gbps",
        32 => "25.0 Gbps",
        64 => "50.0 Gbps",
        128 => "100.0 Gbps",
        _ => "invalid speed",
    };
    format!("{name} ({s})")
}

/// A `phys_state` code: its name and the code.
pub fn phys_state(p: u8) -> String {
    let name = match p {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION TRAINNING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY TEST",
        _ => "invalid physical state",
    };
    format!("{name} ({p})")
}

/// `yes` or `no`.
pub fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
