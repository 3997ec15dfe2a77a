//! Errors of the kernels crate. Every message names the offending field and the allowed range.

use thiserror::Error;

/// An error from validating a workload or config, or from generating a kernel.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Error {
    /// A field of a workload, config or request is out of range or unknown.
    #[error("invalid {field}: {message}")]
    Invalid {
        /// The field, e.g. `k` or `layout`.
        field: &'static str,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// The template does not implement this workload (operation, dtypes or device).
    #[error("template {template} does not support {what}")]
    Unsupported {
        /// Template name.
        template: &'static str,
        /// What is not supported.
        what: String,
    },
    /// A config that cannot run on the target device, with the reason.
    #[error("config rejected: {0}")]
    Rejected(String),
}

impl Error {
    /// An `Invalid` error for `field`.
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Error::Invalid { field, message: message.into() }
    }

    /// The field named by an `Invalid` error.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Error::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// Result with this crate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

thread_local! {
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `walk` with rejection reasons left unwritten on this thread. A walk over a space asks only
/// whether each point is valid, and formatting the reason of every invalid point was most of the
/// cost of enumerating `wmma_gemm`'s ~400k points (a rejected config's `Rejected` message is then
/// empty; nothing inside a walk reads it).
pub fn without_reasons<T>(walk: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            QUIET.with(|q| q.set(self.0));
        }
    }
    let _restore = Restore(QUIET.with(|q| q.replace(true)));
    walk()
}

/// Whether a rejection's reason is wanted on this thread (false inside [`without_reasons`]).
pub fn reasons_wanted() -> bool {
    !QUIET.with(|q| q.get())
}
