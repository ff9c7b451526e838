//! The demo harness: a `demo` subcommand runs this binary's `server` (and sometimes
//! `client`) subcommands as child processes ([`ChildProc`]) with the demo's own common
//! options ([`ChildArgs`]), each server on a free loopback port ([`start_server`]).

use std::fmt::Display;
use std::net::SocketAddr;
use std::time::Duration;

use crate::child::{ChildProc, Echo};
use crate::cli::CommonArgs;
use crate::Res;

/// How long a server child may take to print where it listens.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(20);

/// The command line of a child run of this binary: the common options, a subcommand and
/// its options.
#[derive(Clone, Debug)]
pub struct ChildArgs(Vec<String>);

impl ChildArgs {
    /// `common`'s options, then the subcommand `sub`.
    pub fn new(common: &CommonArgs, sub: &str) -> Self {
        let mut v = common.to_args();
        v.push(sub.to_string());
        ChildArgs(v)
    }

    /// The `server` subcommand listening on a free loopback port (`--listen 127.0.0.1:0`).
    pub fn server(common: &CommonArgs) -> Self {
        ChildArgs::new(common, "server").opt("--listen", "127.0.0.1:0")
    }

    /// Adds `name value`.
    pub fn opt(mut self, name: &str, value: impl Display) -> Self {
        self.0.push(name.to_string());
        self.0.push(value.to_string());
        self
    }

    /// Adds the flag `name` if `on`.
    pub fn flag(mut self, name: &str, on: bool) -> Self {
        if on {
            self.0.push(name.to_string());
        }
        self
    }

    /// The arguments.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// Starts this binary with these arguments; its output is echoed as `[name] ...`.
    pub fn spawn(&self, name: &str) -> Res<ChildProc> {
        ChildProc::spawn(name, &self.0, Echo::Stdout)
    }
}

/// Starts a server child (see [`ChildArgs::server`]) and returns it with the address it
/// listens on.
pub fn start_server(name: &str, args: &ChildArgs) -> Res<(ChildProc, SocketAddr)> {
    let mut child = args.spawn(name)?;
    let addr = child.listen_addr(LISTEN_TIMEOUT)?;
    Ok((child, addr))
}
