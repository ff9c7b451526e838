//! Device, port and GID queries (`man ibv_get_device_list`, `man ibv_query_device`,
//! `man ibv_query_port`, `man ibv_query_gid`).

use verbs_api::{AtomicCap, Backend, Context, PortState};

use super::case;
use crate::{ensure, ensure_eq, Case, CaseResult, Env, Outcome};

pub fn list<B: Backend>() -> Vec<Case<B>> {
    vec![
        case!(
            "device.list",
            "the device list names the device under test",
            "man ibv_get_device_list",
            device_list
        ),
        case!(
            "device.query",
            "query_device reports usable limits",
            "man ibv_query_device; rdma-core tests/test_device.py test_query_device",
            device_query
        ),
        case!(
            "device.port",
            "port 1 is ACTIVE with active_mtu <= max_mtu and the GID index in its table",
            "man ibv_query_port; rdma-core tests/test_device.py test_query_port",
            device_port
        ),
        case!(
            "device.port-invalid",
            "querying port 0 or a port past phys_port_cnt fails",
            "man ibv_query_port",
            device_port_invalid
        ),
        case!(
            "device.gid",
            "query_gid returns a non-zero GID at the index in use and fails past the table",
            "man ibv_query_gid; rdma-core tests/test_device.py test_query_gid",
            device_gid
        ),
        case!(
            "device.gid-table",
            "GID 0 is the port's link-local default GID (fe80::/64); the populated entries come first, the rest read as zero",
            "man ibv_query_gid (an empty entry reads as zero); IBA 4.1.1 (the default GID: link-local prefix and the port's EUI-64)",
            device_gid_table
        ),
        case!(
            "device.capabilities",
            "the capabilities summary agrees with the device attributes",
            "verbs-api Capabilities; man ibv_query_device",
            device_capabilities
        ),
    ]
}

fn device_list<B: Backend>(env: &Env<B>) -> CaseResult {
    let devs = env.backend.devices()?;
    ensure!(!devs.is_empty(), "no devices listed");
    ensure!(
        devs.iter().any(|d| d.name == env.cfg.device),
        "{} not in the list {:?}",
        env.cfg.device,
        devs.iter().map(|d| &d.name).collect::<Vec<_>>()
    );
    ensure_eq!(env.ctx.name(), env.cfg.device.as_str(), "context name");
    let missing = env.backend.open("no-such-device-42");
    ensure!(missing.is_err(), "opening a device that does not exist succeeded");
    Ok(Outcome::Pass)
}

fn device_query<B: Backend>(env: &Env<B>) -> CaseResult {
    let a = env.ctx.query_device()?;
    ensure!(a.max_qp >= 1, "max_qp {}", a.max_qp);
    ensure!(a.max_qp_wr >= 16, "max_qp_wr {}", a.max_qp_wr);
    ensure!(a.max_sge >= 1, "max_sge {}", a.max_sge);
    ensure!(
        a.max_cq >= 1 && a.max_cqe >= 16,
        "max_cq {} max_cqe {}",
        a.max_cq,
        a.max_cqe
    );
    ensure!(
        a.max_mr >= 1 && a.max_pd >= 1,
        "max_mr {} max_pd {}",
        a.max_mr,
        a.max_pd
    );
    ensure!(a.phys_port_cnt >= 1, "phys_port_cnt {}", a.phys_port_cnt);
    ensure!(a.max_mr_size >= 1 << 20, "max_mr_size {}", a.max_mr_size);
    if a.atomic_cap != AtomicCap::None {
        ensure!(
            a.max_qp_rd_atom >= 1 && a.max_qp_init_rd_atom >= 1,
            "atomics without rd_atom resources"
        );
    }
    Ok(Outcome::Pass)
}

fn device_port<B: Backend>(env: &Env<B>) -> CaseResult {
    let p = env.ctx.query_port(1)?;
    ensure_eq!(p.state, PortState::Active, "port state");
    ensure!(
        p.active_mtu <= p.max_mtu,
        "active_mtu {:?} > max_mtu {:?}",
        p.active_mtu,
        p.max_mtu
    );
    ensure!(
        (env.cfg.gid_index as u32) < p.gid_tbl_len,
        "gid index {} outside table of {}",
        env.cfg.gid_index,
        p.gid_tbl_len
    );
    ensure!(p.max_msg_sz >= 1 << 20, "max_msg_sz {}", p.max_msg_sz);
    Ok(Outcome::Pass)
}

fn device_port_invalid<B: Backend>(env: &Env<B>) -> CaseResult {
    let n = env.ctx.query_device()?.phys_port_cnt;
    for port in [0u8, n.saturating_add(1)] {
        match env.ctx.query_port(port) {
            Ok(_) => return Err(crate::Failure(format!("query_port({port}) succeeded"))),
            Err(e) => ensure_eq!(e.errno(), libc::EINVAL, "errno of query_port({port})"),
        }
    }
    Ok(Outcome::Pass)
}

fn device_gid<B: Backend>(env: &Env<B>) -> CaseResult {
    let gid = env.ctx.query_gid(1, env.cfg.gid_index as u32)?;
    ensure!(!gid.is_zero(), "GID at index {} is zero", env.cfg.gid_index);
    let len = env.ctx.query_port(1)?.gid_tbl_len;
    ensure!(
        env.ctx.query_gid(1, len).is_err(),
        "query_gid past the table ({len}) succeeded"
    );
    Ok(Outcome::Pass)
}

/// How a GID reads: `link-local` (fe80::/64), `ipv4-mapped` (::ffff:a.b.c.d), `zero`,
/// or `other`.
fn gid_kind(g: &verbs_api::Gid) -> &'static str {
    let b = &g.0;
    if g.is_zero() {
        "zero"
    } else if b[0] == 0xfe && b[1] == 0x80 && b[2..8].iter().all(|&x| x == 0) {
        "link-local"
    } else if b[..10].iter().all(|&x| x == 0) && b[10] == 0xff && b[11] == 0xff {
        "ipv4-mapped"
    } else {
        "other"
    }
}

fn device_gid_table<B: Backend>(env: &Env<B>) -> CaseResult {
    let len = env.ctx.query_port(1)?.gid_tbl_len;
    env.observe("gid_tbl_len", len);
    let mut kinds = Vec::new();
    for i in 0..len {
        kinds.push(gid_kind(&env.ctx.query_gid(1, i)?));
    }
    let populated = kinds.iter().take_while(|k| **k != "zero").count();
    env.observe("populated GIDs", kinds[..populated].join(", "));
    ensure_eq!(kinds.first().copied(), Some("link-local"), "GID 0");
    ensure!(
        kinds[populated..].iter().all(|k| *k == "zero"),
        "a populated entry after an empty one: {kinds:?}"
    );
    Ok(Outcome::Pass)
}

fn device_capabilities<B: Backend>(env: &Env<B>) -> CaseResult {
    let a = env.ctx.query_device()?;
    let c = env.ctx.capabilities()?;
    ensure_eq!(c.atomic_cap, a.atomic_cap, "atomic_cap");
    ensure_eq!(c.max_qp_wr, a.max_qp_wr, "max_qp_wr");
    ensure_eq!(c.max_cqe, a.max_cqe, "max_cqe");
    ensure!(
        c.max_send_sge >= 1 && c.max_send_sge <= a.max_sge,
        "max_send_sge {}",
        c.max_send_sge
    );
    ensure!(c.imm_data, "RC devices support immediate data");
    Ok(Outcome::Pass)
}
