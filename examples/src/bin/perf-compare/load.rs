//! The `load` target: `send_lat`'s 99th percentile while a third thread only spins on the
//! machine's cores (this program's `spin` subcommand, [`spin`]), against TCP's under the
//! same load: scheduler-tick stalls would show as a p99 of milliseconds.

use std::process::Command;
use std::time::{Duration, Instant};

use examples::stats::Figures;
use examples::Res;

use crate::perf_runs::perf1;
use crate::report::Target;
use crate::tcp::{tcp_pingpong, Peer};
use crate::Cli;

/// How long the spinning process runs (longer than both measurements).
const SPIN_SECS: f64 = 20.0;

/// Spins for `secs` seconds (the `spin` subcommand).
pub fn spin(secs: f64) -> Res<()> {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        std::hint::spin_loop();
    }
    Ok(())
}

/// Measures the target's row.
pub fn loaded_send_lat(cli: &Cli, peer: &Peer) -> Res<Target> {
    let mut spinner = Command::new(std::env::current_exe()?)
        .args(["spin", "--secs", &SPIN_SECS.to_string()])
        .spawn()?;
    std::thread::sleep(Duration::from_millis(100));
    let loaded = perf1(&["send_lat", "-s", "8", "-n", &cli.lat_iters.to_string()]);
    let tcp_loaded: Figures = tcp_pingpong(peer, cli.lat_iters, true)?.into_iter().collect();
    let _ = spinner.kill();
    let _ = spinner.wait();
    let loaded = loaded?;
    let tcp_p99 = tcp_loaded.percentile(99.0);
    Ok(Target {
        test: "send_lat p99 with a third spinning thread".into(),
        measured: format!("p99 {:.1} us (max {:.0} us)", loaded.t_p99_us, loaded.t_max_us),
        baseline: format!("TCP busy p99 {tcp_p99:.1} us"),
        ratio: loaded.t_p99_us / tcp_p99,
        pairs: String::new(),
        target: "p99 < 4000 us".into(),
        pass: loaded.t_p99_us < 4000.0,
        not_measured: None,
    })
}
