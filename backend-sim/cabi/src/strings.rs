//! Names and rates (`man ibv_event_type_str`, `man ibv_rate_to_mult`,
//! `man ibv_rate_to_mbps`): the texts and tables libibverbs prints and converts with.

use std::ffi::{c_char, c_int, CStr};

const WC_STATUS: [&CStr; 24] = [
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM software rendezvous",
];

const EVENT_TYPE: [&CStr; 20] = [
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
];

/// Node types from `IBV_NODE_CA` (1) on.
const NODE_TYPE: [&CStr; 7] = [
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
    c"unspecified",
];

const PORT_STATE: [&CStr; 6] = [
    c"no state change (NOP)",
    c"down",
    c"init",
    c"armed",
    c"active",
    c"active defer",
];

fn lookup(table: &[&'static CStr], i: i64) -> *const c_char {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .copied()
        .unwrap_or(c"unknown")
        .as_ptr()
}

/// `ibv_wc_status_str`.
pub(crate) extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    lookup(&WC_STATUS, status as i64)
}

/// `ibv_event_type_str`.
pub(crate) extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    lookup(&EVENT_TYPE, event as i64)
}

/// `ibv_node_type_str`.
pub(crate) extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    lookup(&NODE_TYPE, node_type as i64 - 1)
}

/// `ibv_port_state_str`.
pub(crate) extern "C" fn ibv_port_state_str(state: c_int) -> *const c_char {
    lookup(&PORT_STATE, state as i64)
}

/// `enum ibv_rate`, the multiple of 2.5 Gb/s and the rate in Mb/s of each value that
/// has them (the multiple only where it is a whole number).
const RATES: [(c_int, Option<c_int>, c_int); 23] = [
    (2, Some(1), 2500),
    (5, Some(2), 5000),
    (3, Some(4), 10000),
    (6, Some(8), 20000),
    (4, Some(12), 30000),
    (7, Some(16), 40000),
    (8, Some(24), 60000),
    (9, Some(32), 80000),
    (10, Some(48), 120000),
    (11, None, 14062),
    (12, None, 56250),
    (13, None, 112500),
    (14, None, 168750),
    (15, None, 25781),
    (16, None, 103125),
    (17, None, 206250),
    (18, None, 309375),
    (19, Some(11), 28125),
    (20, Some(20), 53125),
    (21, Some(160), 425000),
    (22, Some(240), 637500),
    (23, Some(320), 850000),
    (24, Some(480), 1275000),
];

/// `IBV_RATE_MAX`: what the conversions to a rate answer for a value without one.
const IBV_RATE_MAX: c_int = 0;

/// `ibv_rate_to_mult`: the rate as a multiple of 2.5 Gb/s, or -1.
pub(crate) extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).and_then(|r| r.1).unwrap_or(-1)
}

/// `mult_to_ibv_rate`.
pub(crate) extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == Some(mult))
        .map_or(IBV_RATE_MAX, |r| r.0)
}

/// `ibv_rate_to_mbps`: the rate in Mb/s, or -1.
pub(crate) extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate`.
pub(crate) extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(IBV_RATE_MAX, |r| r.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(p: *const c_char) -> &'static str {
        // SAFETY: every result points at a static C string of this module.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn texts() {
        assert_eq!(s(ibv_wc_status_str(13)), "RNR retry counter exceeded");
        assert_eq!(s(ibv_wc_status_str(24)), "unknown");
        assert_eq!(s(ibv_wc_status_str(-1)), "unknown");
        assert_eq!(s(ibv_event_type_str(15)), "SRQ limit reached");
        assert_eq!(s(ibv_node_type_str(1)), "InfiniBand channel adapter");
        assert_eq!(s(ibv_node_type_str(0)), "unknown");
        assert_eq!(s(ibv_port_state_str(4)), "active");
    }

    #[test]
    fn rates() {
        assert_eq!(ibv_rate_to_mult(3), 4);
        assert_eq!(ibv_rate_to_mult(11), -1);
        assert_eq!(mult_to_ibv_rate(4), 3);
        assert_eq!(mult_to_ibv_rate(5), IBV_RATE_MAX);
        assert_eq!(ibv_rate_to_mbps(16), 103125);
        assert_eq!(mbps_to_ibv_rate(25781), 15);
        assert_eq!(ibv_rate_to_mbps(0), -1);
    }
}
