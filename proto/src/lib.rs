//! The gRPC protocol of tensortune, generated from `proto/tensortune.proto`.
//!
//! Prost types stop at the service layer: the tracker and worker convert them into validated
//! domain types (`tensortune-kernels`) on arrival.

pub mod access;
pub mod convert;

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
