//! devinfo: the devices of a verbs backend with their device and port attributes,
//! formatted like `ibv_devinfo -v`, followed by the verbs-api `Capabilities` summary that
//! programs use to decide what to expect from a device (atomics, SRQs and their limits,
//! UC and UD QPs and the largest datagram, ...).
//!
//! ```text
//! devinfo                        # every sim device
//! devinfo -d sim0                # one device
//! devinfo -l                     # names only (ibv_devinfo -l)
//! devinfo --backend ibverbs      # needs --features ibverbs
//! ```
//!
//! How each attribute value is named is in `examples::ibv_names`.
//!
//! On the sim it ends with the device profile the devices play (`RDMA_SIM_PROFILE`:
//! portable, rxe or mlx5; see docs/profiles.md) and the value of each of its behavioural
//! switches, where HCAs differ.

use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::Parser;
use examples::backend::open_device;
use examples::cli::CommonArgs;
use examples::ibv_names::{atomic_cap, link_layer, mtu, phys_state, port_state, speed, width, yes};
use examples::{with_backend, Res};
use verbs_api::{guid_text, Backend, Capabilities, Context};

/// Print the devices of a verbs backend like `ibv_devinfo -v`.
#[derive(Parser, Debug)]
#[command(
    name = "devinfo",
    version,
    after_help = "Examples:\n  devinfo\n  devinfo -d sim0\n  devinfo --backend ibverbs -d rxe0   (build with --features ibverbs)"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    /// Only list the device names.
    #[arg(short = 'l', long)]
    list: bool,
    /// Only this port.
    #[arg(short = 'i', long = "ib-port")]
    port: Option<u8>,
    /// Accepted for ibv_devinfo compatibility (the output is always verbose).
    #[arg(short = 'v', long)]
    verbose: bool,
}

fn main() -> ExitCode {
    examples::program::main("devinfo", |cli: Cli| run(&cli))
}

fn run(cli: &Cli) -> Res<()> {
    with_backend!(cli.common, |b| devinfo(b, cli))?;
    if matches!(cli.common.backend, examples::cli::BackendKind::Sim) && !cli.list {
        print_profile(examples::backend::sim_backend_for(&cli.common)?.config().profile);
    }
    Ok(())
}

/// The sim's profile and its switches (the table of docs/profiles.md).
fn print_profile(p: backend_sim::Profile) {
    println!();
    println!("sim profile:	{p}	(RDMA_SIM_PROFILE=portable|rxe|mlx5; docs/profiles.md)");
    println!("	switches:");
    for s in backend_sim::profile::switches::table() {
        println!("		{}:	{}", s.name, s.value(p));
        println!("			({})", s.what);
    }
    if p.warns() {
        println!("	portability warnings: on (a full send queue of unpolled completions; CQEs removed by RESET/destroy)");
    }
}

fn devinfo<B: Backend>(b: &B, cli: &Cli) -> Res<()> {
    let devices = b
        .devices()
        .with_context(|| format!("listing the devices of the {} backend", b.name()))?;
    if cli.list {
        println!(
            "{} HCA{} found:",
            devices.len(),
            if devices.len() == 1 { "" } else { "s" }
        );
        for d in &devices {
            println!("\t{}", d.name);
        }
        return Ok(());
    }
    if devices.is_empty() {
        bail!("the {} backend lists no devices", b.name());
    }
    let selected: Vec<_> = match &cli.common.device {
        Some(name) => {
            let Some(d) = devices.iter().find(|d| &d.name == name) else {
                bail!(
                    "no device {name:?}; the {} backend has: {}",
                    b.name(),
                    devices
                        .iter()
                        .map(|d| d.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            vec![d.clone()]
        }
        None => devices,
    };
    for (i, d) in selected.iter().enumerate() {
        if i > 0 {
            println!();
        }
        let ctx = open_device(b, Some(&d.name))?;
        print_device(&ctx, &d.transport, cli.port)?;
    }
    Ok(())
}

fn print_device<C: Context>(ctx: &C, transport: &str, only_port: Option<u8>) -> Res<()> {
    let a = ctx.query_device().context("ibv_query_device")?;
    println!("hca_id:\t{}", ctx.name());
    println!("\ttransport:\t\t\t{transport}");
    println!("\tfw_ver:\t\t\t\t{}", a.fw_ver);
    println!("\tnode_guid:\t\t\t{}", guid_text(a.node_guid));
    println!("\tsys_image_guid:\t\t\t{}", guid_text(a.sys_image_guid));
    println!("\tvendor_id:\t\t\t{:#06x}", a.vendor_id);
    println!("\tvendor_part_id:\t\t\t{}", a.vendor_part_id);
    println!("\thw_ver:\t\t\t\t{:#x}", a.hw_ver);
    println!("\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
    println!("\tmax_mr_size:\t\t\t{:#x}", a.max_mr_size);
    println!("\tpage_size_cap:\t\t\t{:#x}", a.page_size_cap);
    println!("\tmax_qp:\t\t\t\t{}", a.max_qp);
    println!("\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
    println!("\tdevice_cap_flags:\t\t{:#010x}", a.device_cap_flags);
    println!("\tmax_sge:\t\t\t{}", a.max_sge);
    println!("\tmax_sge_rd:\t\t\t{}", a.max_sge_rd);
    println!("\tmax_cq:\t\t\t\t{}", a.max_cq);
    println!("\tmax_cqe:\t\t\t{}", a.max_cqe);
    println!("\tmax_mr:\t\t\t\t{}", a.max_mr);
    println!("\tmax_pd:\t\t\t\t{}", a.max_pd);
    println!("\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
    println!("\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
    println!("\tatomic_cap:\t\t\t{}", atomic_cap(a.atomic_cap));
    println!("\tmax_srq:\t\t\t{}", a.max_srq);
    println!("\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
    println!("\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
    println!("\tmax_pkeys:\t\t\t{}", a.max_pkeys);
    for port in 1..=a.phys_port_cnt {
        if only_port.is_some_and(|p| p != port) {
            continue;
        }
        let p = ctx
            .query_port(port)
            .with_context(|| format!("ibv_query_port({port})"))?;
        println!("\t\tport:\t{port}");
        println!("\t\t\tstate:\t\t\t{}", port_state(p.state));
        println!("\t\t\tmax_mtu:\t\t{}", mtu(p.max_mtu));
        println!("\t\t\tactive_mtu:\t\t{}", mtu(p.active_mtu));
        println!("\t\t\tsm_lid:\t\t\t{}", p.sm_lid);
        println!("\t\t\tport_lid:\t\t{}", p.lid);
        println!("\t\t\tport_lmc:\t\t{:#04x}", p.lmc);
        println!("\t\t\tlink_layer:\t\t{}", link_layer(p.link_layer));
        println!("\t\t\tmax_msg_sz:\t\t{:#x}", p.max_msg_sz);
        println!("\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
        println!("\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
        println!("\t\t\tactive_width:\t\t{}", width(p.active_width));
        println!("\t\t\tactive_speed:\t\t{}", speed(p.active_speed));
        println!("\t\t\tphys_state:\t\t{}", phys_state(p.phys_state));
        // Like ibv_devinfo: the valid (non-zero) entries of the GID table.
        for i in 0..p.gid_tbl_len.min(1024) {
            match ctx.query_gid(port, i) {
                Ok(g) if !g.is_zero() => {
                    let v4 = g.to_ipv4_mapped().map(|a| format!(" ({a})")).unwrap_or_default();
                    println!("\t\t\tGID[{i:>3}]:\t\t{g}{v4}");
                }
                _ => {}
            }
        }
    }
    let c: Capabilities = ctx.capabilities().context("capabilities")?;
    println!();
    println!("\tverbs-api capabilities:");
    println!("\t\tatomics:\t\t{}", atomic_cap(c.atomic_cap));
    println!("\t\timmediate data:\t\t{}", yes(c.imm_data));
    println!("\t\tSRQ:\t\t\t{}", yes(c.srq));
    if c.srq {
        println!("\t\t  max_srq:\t\t{}", c.max_srq);
        println!("\t\t  max_srq_wr:\t\t{}", c.max_srq_wr);
        println!("\t\t  max_srq_sge:\t\t{}", c.max_srq_sge);
        println!("\t\t  resize (MAX_WR):\t{}", yes(c.srq_resize));
    }
    println!("\t\tUC QPs:\t\t\t{}", yes(c.uc));
    println!("\t\tUD QPs:\t\t\t{}", yes(c.ud));
    if c.ud {
        // A datagram is at most one packet: the port's active MTU.
        let p = ctx.query_port(1).context("ibv_query_port(1)")?;
        println!(
            "\t\t  largest datagram:\t{} B (port 1's active MTU; a receive needs 40 more for the GRH)",
            p.active_mtu.bytes()
        );
    }
    println!("\t\tmax_inline_data:\t{}", c.max_inline_data);
    println!("\t\tmax_send_sge:\t\t{}", c.max_send_sge);
    println!("\t\tmax_recv_sge:\t\t{}", c.max_recv_sge);
    println!("\t\tmax_sge_rd:\t\t{}", c.max_sge_rd);
    println!("\t\tmax_qp_wr:\t\t{}", c.max_qp_wr);
    println!("\t\tmax_cqe:\t\t{}", c.max_cqe);
    println!("\t\tmax_qp_init_rd_atom:\t{}", c.max_qp_init_rd_atom);
    println!("\t\tmax_qp_rd_atom:\t\t{}", c.max_qp_rd_atom);
    println!("\t\tmax_msg_sz:\t\t{:#x}", c.max_msg_sz);
    println!("\t\tmax_mr_size:\t\t{:#x}", c.max_mr_size);
    println!("\t\tlink layer (port 1):\t{}", link_layer(c.link_layer));
    Ok(())
}
