//! The outcome class of one measurement: the status every record carries, from the worker's
//! child through the wire (`pb::RecordStatus`, converted in `tensortune_proto::convert`) to the
//! tracker's store, spelled the same everywhere ([`Status::name`]).

use serde::{Deserialize, Serialize};

/// Outcome classes of one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Verified and timed.
    Ok,
    /// The config cannot run on this device (found at load time: registers, threads, shared memory).
    InvalidConfig,
    /// NVRTC rejected the source.
    CompileError,
    /// The kernel faulted or could not be launched.
    LaunchError,
    /// The output differs from the reference.
    WrongResult,
    /// The measurement ran past its deadline.
    Timeout,
    /// The GPU (or the worker driving it) stopped answering.
    DeviceLost,
}

impl Status {
    /// Every status, in the wire enum's order.
    pub const ALL: [Status; 7] = [
        Status::Ok,
        Status::InvalidConfig,
        Status::CompileError,
        Status::LaunchError,
        Status::WrongResult,
        Status::Timeout,
        Status::DeviceLost,
    ];

    /// The lowercase name used in tables, JSON, the store and `status_counts` (`ok`,
    /// `compile_error`, ...): the serde spelling.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::InvalidConfig => "invalid_config",
            Status::CompileError => "compile_error",
            Status::LaunchError => "launch_error",
            Status::WrongResult => "wrong_result",
            Status::Timeout => "timeout",
            Status::DeviceLost => "device_lost",
        }
    }

    /// The status called `name` (inverse of [`Status::name`]).
    pub fn from_name(name: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_serde() {
        for s in Status::ALL {
            assert_eq!(Status::from_name(s.name()), Some(s));
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{}\"", s.name()));
        }
        assert_eq!(Status::from_name("unspecified"), None);
    }
}
