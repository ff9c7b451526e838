//! The curves of `--curves`: `perf`'s `write_lat` and `write_bw` against message size
//! (`-a`: 2 B .. 8 MiB), and WRITE latency and aggregate bandwidth against the number of
//! QPs (1, 4, 16, ... up to `--max-qps`; 16 WRITEs outstanding per QP up to 64 QPs, then
//! 1024 in all).

use examples::Res;

use crate::multi_qp::{curve_depth, multi_qp_write_bw, multi_qp_write_lat, Posting};
use crate::perf_runs::perf;
use crate::report::{QpPoint, Report, SizePoint};
use crate::Cli;

/// Measures both curves into `rep`.
pub fn measure(cli: &Cli, rep: &mut Report) -> Res<()> {
    eprintln!("size curve");
    let lat = perf(&["write_lat".into(), "-a".into(), "-n".into(), "2000".into()])?;
    let bwr = perf(&["write_bw".into(), "-a".into(), "-n".into(), "2000".into()])?;
    for l in &lat {
        if let Some(b) = bwr.iter().find(|b| b.size == l.size) {
            rep.size_curve.push(SizePoint {
                size: l.size,
                write_lat_us: l.t_typical_us,
                write_bw_mbps: b.bw_avg_mbps,
            });
        }
    }
    let mut q = 1;
    while q <= cli.max_qps {
        eprintln!("QP curve: {q} QPs");
        rep.qp_curve.push(QpPoint {
            qps: q,
            depth: curve_depth(q),
            write_lat_us: multi_qp_write_lat(q, 2000.max(q as u64 * 2))?,
            write_bw_64k_mbps: multi_qp_write_bw(q, curve_depth(q), 65536, 1 << 30, Posting::Single)?,
        });
        q *= 4;
    }
    Ok(())
}
