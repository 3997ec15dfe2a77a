//! The gRPC protocol of tensortune, generated from `proto/tensortune.proto`.
//!
//! Prost types stop at the service layer: the tracker and worker convert them into validated
//! domain types (`tensortune-kernels`) on arrival.

pub mod access;
pub mod convert;

/// Generated messages and services (`tensortune.v1`).
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod pb {
    tonic::include_proto!("tensortune.v1");
}
