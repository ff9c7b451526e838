//! The examples' error handling: one boxed error type, a `context` helper that says what
//! was being done when something failed, and [`bail!`](crate::bail) for early returns.
//! `main` prints the chain with [`report`] and exits non-zero.

use std::fmt;
use std::process::ExitCode;

/// Any error, with the context added on its way up.
pub type Error = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with [`Error`].
pub type Res<T> = std::result::Result<T, Error>;

/// An error that wraps another one with a sentence about what was being done.
#[derive(Debug)]
struct Context {
    what: String,
    source: Error,
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.source)
    }
}

impl std::error::Error for Context {}

/// Adds context to any fallible value.
pub trait ResultExt<T> {
    /// On error, prefixes it with `what` ("connecting to 10.0.0.1:18515: ...").
    fn context(self, what: impl Into<String>) -> Res<T>;
    /// Like [`ResultExt::context`], computing the text only on error.
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Res<T>;
}

impl<T, E: Into<Error>> ResultExt<T> for std::result::Result<T, E> {
    fn context(self, what: impl Into<String>) -> Res<T> {
        self.map_err(|e| {
            Box::new(Context {
                what: what.into(),
                source: e.into(),
            }) as Error
        })
    }

    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Res<T> {
        self.map_err(|e| {
            Box::new(Context {
                what: what().into(),
                source: e.into(),
            }) as Error
        })
    }
}

/// Returns early with an error built like `format!`.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(format!($($arg)*).into())
    };
}

/// Prints `error: ...` for a failed run and turns the outcome into an exit code
/// (0 on success, 1 on error).
pub fn report(prog: &str, r: Res<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{prog}: error: {e}");
            ExitCode::FAILURE
        }
    }
}
