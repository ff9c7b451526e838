//! What every example binary's `main` does ([`main`]): parse the command line, install
//! the logging subscriber, run, and on failure print the error with every context it
//! gathered ([`describe`]) and exit non-zero.

use std::process::ExitCode;

use clap::Parser;

use crate::Res;

/// Parses the command line as `C`, installs the logging subscriber
/// ([`init_tracing`](crate::init_tracing)) and runs `run`; the outcome is [`report`]ed
/// under the name `prog`.
///
/// ```text
/// fn main() -> ExitCode {
///     examples::program::main("kv-rpc", |cli: Cli| run(&cli))
/// }
/// ```
pub fn main<C: Parser>(prog: &str, run: impl FnOnce(C) -> Res<()>) -> ExitCode {
    let cli = C::parse();
    crate::init_tracing();
    report(prog, run(cli))
}

/// Prints `PROG: error: ...` for a failed run (see [`describe`]) and turns the outcome
/// into an exit code (0 on success, 1 on error).
pub fn report(prog: &str, r: Res<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{prog}: error: {}", describe(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error with every context it gathered on its way up, outermost first:
/// `connecting to the server at ...: cm connect failed: Connection refused (os error 111)`.
///
/// Like anyhow's `{:#}`, except that a cause whose text its parent already ends with is
/// left out: `verbs_api::Error`'s messages include their source's text (`"{call} failed:
/// {source}"`), which `{:#}` would print twice.
pub fn describe(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    #[test]
    fn contexts_are_joined_and_a_source_already_in_its_parent_is_not_repeated() {
        let io = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        let e = Err::<(), _>(verbs_api::Error::from_io("connect", io))
            .context("connecting to the server at 127.0.0.1:1")
            .unwrap_err();
        let io_text = std::io::Error::from_raw_os_error(libc::ECONNREFUSED).to_string();
        assert_eq!(
            describe(&e),
            format!("connecting to the server at 127.0.0.1:1: connect failed: {io_text}")
        );
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(describe(&e), "outer: inner");
    }
}
