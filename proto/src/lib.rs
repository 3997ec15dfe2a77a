//! The gRPC protocol of tensortune, generated from `proto/tensortune.proto`.
//!
//! Prost types stop at the service layer: the tracker and worker convert them into validated
//! domain types (`tensortune-kernels`) on arrival.

pub mod access;
pub mod convert;
pub mod settings;

/// The protocol version this build speaks, sent with every call as [`PROTOCOL_HEADER`]. It changes
/// only when a change breaks the other side (a field's meaning, a removed rpc); added rpcs and
/// fields keep it. 1 is the protocol of builds that sent no header; 2 added `Leave`.
pub const PROTOCOL_VERSION: u32 = 2;

/// The oldest caller version a tracker of this build serves: callers from
/// `MIN_PROTOCOL_VERSION` up to [`PROTOCOL_VERSION`] work, others are refused with
/// `FailedPrecondition` naming both versions.
pub const MIN_PROTOCOL_VERSION: u32 = 1;

/// The metadata key that carries a caller's protocol version.
pub const PROTOCOL_HEADER: &str = "tensortune-protocol";

/// Whether a failed call to the tracker is worth repeating: it is down, restarting, overloaded,
/// or could not write its database (`Unavailable`); everything else is an answer.
pub fn transient(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::Unavailable
            | Code::Unknown
            | Code::DeadlineExceeded
            | Code::Internal
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Cancelled
    )
}

/// Generated messages and services (`tensortune.v1`).
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod pb {
    tonic::include_proto!("tensortune.v1");
}
