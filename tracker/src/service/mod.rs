//! The gRPC services. Prost types stop here: requests are converted into validated domain types
//! ([`convert`]) before the tracker sees them, and errors leave through the one
//! `From<Error> for tonic::Status`.

pub(crate) mod convert;
pub(crate) mod dispatch;
pub(crate) mod tuning;
