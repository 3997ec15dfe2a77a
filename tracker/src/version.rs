//! Version skew: every call says which protocol version its caller speaks
//! ([`PROTOCOL_HEADER`]); this tracker serves versions [`MIN_PROTOCOL_VERSION`] ..=
//! [`PROTOCOL_VERSION`] and refuses others before anything else looks at the call, with
//! `FailedPrecondition` naming both versions and which side to upgrade. A call without the header
//! comes from a build that predates it: version 1.

use tensortune_proto::{MIN_PROTOCOL_VERSION, PROTOCOL_HEADER, PROTOCOL_VERSION};
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

/// The version of callers built before the header existed.
const UNANNOUNCED: u32 = 1;

/// Fails unless the caller's protocol version is one this tracker serves. `service` names the
/// service for the message.
pub(crate) fn check(metadata: &MetadataMap, service: &str) -> Result<(), Status> {
    let announced = match metadata.get(PROTOCOL_HEADER) {
        None => UNANNOUNCED,
        Some(value) => match value.to_str().ok().and_then(|v| v.trim().parse::<u32>().ok()) {
            Some(v) => v,
            None => {
                return Err(Status::invalid_argument(format!(
                    "metadata {PROTOCOL_HEADER} {value:?} is not a protocol version; expected a number such as \
                     {PROTOCOL_VERSION}"
                )));
            }
        },
    };
    compatible(announced).map_err(|hint| {
        Status::failed_precondition(format!(
            "protocol version {announced} of this {service} caller is not compatible with this tracker's protocol \
             version {PROTOCOL_VERSION} (it serves {MIN_PROTOCOL_VERSION} ..= {PROTOCOL_VERSION}); {hint}"
        ))
    })
}

/// `Ok` for a version this tracker serves; else what to do about it.
fn compatible(version: u32) -> Result<(), &'static str> {
    if version < MIN_PROTOCOL_VERSION {
        Err("upgrade the worker or client")
    } else if version > PROTOCOL_VERSION {
        Err("upgrade the tracker first (trackers go before workers and clients)")
    } else {
        Ok(())
    }
}

/// The version check, then `inner` (the token gate): the interceptor of one service.
#[derive(Clone)]
pub(crate) struct Versioned<I> {
    service: &'static str,
    inner: I,
}

impl<I> Versioned<I> {
    /// `inner` behind the version check of `service`.
    pub(crate) fn new(service: &'static str, inner: I) -> Self {
        Versioned { service, inner }
    }
}

impl<I: tonic::service::Interceptor> tonic::service::Interceptor for Versioned<I> {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        check(request.metadata(), self.service)?;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(version: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(v) = version {
            m.insert(PROTOCOL_HEADER, v.parse().unwrap());
        }
        m
    }

    #[test]
    fn served_versions_pass_and_others_name_both_versions() {
        assert!(check(&with(None), "Dispatch").is_ok(), "a caller without the header is version 1");
        for v in MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION {
            assert!(check(&with(Some(&v.to_string())), "Dispatch").is_ok(), "{v}");
        }
        let old = check(&with(Some("0")), "Dispatch").unwrap_err();
        assert_eq!(old.code(), tonic::Code::FailedPrecondition);
        assert!(
            old.message().contains("protocol version 0")
                && old.message().contains(&format!("version {PROTOCOL_VERSION}"))
        );
        assert!(old.message().contains("upgrade the worker"), "{}", old.message());
        let new = check(&with(Some(&(PROTOCOL_VERSION + 1).to_string())), "Tuning").unwrap_err();
        assert!(new.message().contains("upgrade the tracker"), "{}", new.message());
        let junk = check(&with(Some("two")), "Tuning").unwrap_err();
        assert_eq!(junk.code(), tonic::Code::InvalidArgument);
        assert!(junk.message().contains(PROTOCOL_HEADER));
    }
}
