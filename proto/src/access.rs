//! How a worker or a client reaches a tracker that asks for a token, TLS, or both: the token read
//! from a file or the environment (never from the command line, where `ps` shows it to everyone),
//! the CA that signs the tracker's certificate, and a client certificate for mutual TLS.

use std::fmt;
use std::path::{Path, PathBuf};

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

/// Environment variable naming a file that holds the token.
pub const TOKEN_FILE_ENV: &str = "TENSORTUNE_TOKEN_FILE";
/// Environment variable holding the token itself.
pub const TOKEN_ENV: &str = "TENSORTUNE_TOKEN";

/// A channel whose calls carry the token.
pub type Authed = InterceptedService<Channel, Bearer>;

/// Why access settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which setting.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The token is not one a tracker made.
    #[error(
        "the token from {0} is not a tensortune token (expected one line tt_<id>_<secret>, from `tensortune-tracker token add`)"
    )]
    BadToken(String),
    /// An `https://` address without a CA, or a certificate without its key.
    #[error("{0}")]
    Tls(String),
}

/// Token and TLS settings of a connection to a tracker.
#[derive(Clone, Default)]
pub struct Access {
    token: Option<AsciiMetadataValue>,
    /// PEM CA of the tracker's certificate.
    ca_pem: Option<Vec<u8>>,
    /// PEM certificate and key this side presents (mutual TLS).
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the token or the key.
        f.debug_struct("Access")
            .field("token", &self.token.is_some())
            .field("tls_ca", &self.ca_pem.is_some())
            .field("client_cert", &self.identity.is_some())
            .finish()
    }
}

impl Access {
    /// Reads the settings: the token from `token_file`, else from the file `$TENSORTUNE_TOKEN_FILE`
    /// names, else from `$TENSORTUNE_TOKEN`, else none; TLS files as given.
    pub fn load(
        token_file: Option<&Path>,
        tls_ca: Option<&Path>,
        tls_cert: Option<&Path>,
        tls_key: Option<&Path>,
    ) -> Result<Access, AccessError> {
        let env_file = std::env::var_os(TOKEN_FILE_ENV).filter(|v| !v.is_empty()).map(PathBuf::from);
        let token = match token_file.map(Path::to_path_buf).or(env_file) {
            Some(path) => {
                let text = read("token file", &path)?;
                Some(parse_token(&String::from_utf8_lossy(&text), &path.display().to_string())?)
            }
            None => match std::env::var(TOKEN_ENV) {
                Ok(text) if !text.trim().is_empty() => Some(parse_token(&text, TOKEN_ENV)?),
                _ => None,
            },
        };
        let ca_pem = tls_ca.map(|p| read("--tls-ca", p)).transpose()?;
        let identity = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => Some((read("--tls-cert", cert)?, read("--tls-key", key)?)),
            (None, None) => None,
            _ => return Err(AccessError::Tls("--tls-cert and --tls-key go together".into())),
        };
        Ok(Access { token, ca_pem, identity })
    }

    /// Settings from values in memory (tests, embedding programs).
    pub fn new(
        token: Option<&str>,
        ca_pem: Option<Vec<u8>>,
        identity: Option<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Access, AccessError> {
        let token = token.map(|t| parse_token(t, "the token given")).transpose()?;
        Ok(Access { token, ca_pem, identity })
    }

    /// Whether a token is set.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// The endpoint of `url` with TLS applied when the URL is `https://`.
    pub fn endpoint(&self, url: &str) -> Result<Endpoint, AccessError> {
        let endpoint = Endpoint::from_shared(url.to_owned()).map_err(|_| {
            AccessError::Tls(format!(
                "invalid tracker address {url:?}; expected e.g. http://127.0.0.1:7070 or https://tracker:7070"
            ))
        })?;
        let https = url.starts_with("https://");
        if !https {
            if self.ca_pem.is_some() || self.identity.is_some() {
                return Err(AccessError::Tls(format!(
                    "TLS settings were given but the tracker address {url:?} is not https://"
                )));
            }
            return Ok(endpoint);
        }
        let Some(ca) = &self.ca_pem else {
            return Err(AccessError::Tls(format!(
                "{url} is https: give --tls-ca (or TENSORTUNE_TLS_CA) with the CA that signed the tracker's certificate"
            )));
        };
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        endpoint.tls_config(tls).map_err(|e| AccessError::Tls(format!("configuring TLS for {url}: {e}")))
    }

    /// The interceptor that adds the token to every call.
    pub fn bearer(&self) -> Bearer {
        Bearer(self.token.clone())
    }
}

/// Adds `authorization: Bearer <token>` to each call (nothing without a token), and the protocol
/// version this build speaks ([`crate::PROTOCOL_HEADER`]).
#[derive(Clone)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        request.metadata_mut().insert(crate::PROTOCOL_HEADER, AsciiMetadataValue::from(crate::PROTOCOL_VERSION));
        Ok(request)
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, AccessError> {
    std::fs::read(path).map_err(|source| AccessError::Read { what, path: path.to_owned(), source })
}

fn parse_token(text: &str, from: &str) -> Result<AsciiMetadataValue, AccessError> {
    let token = text.trim();
    let well_formed = token.starts_with("tt_")
        && token.len() < 256
        && token.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !well_formed {
        return Err(AccessError::BadToken(from.to_owned()));
    }
    let mut value: AsciiMetadataValue =
        MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| AccessError::BadToken(from.to_owned()))?;
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_and_trimmed() {
        assert!(parse_token("tt_3_abcDEF-_9\n", "f").is_ok());
        for bad in ["", "abc", "tt_1 2", "Bearer tt_1_x", "tt_1_x\ny"] {
            let e = parse_token(bad, "f").unwrap_err().to_string();
            assert!(e.contains("not a tensortune token"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn https_needs_a_ca_and_tls_files_need_https() {
        let none = Access::default();
        assert!(none.endpoint("http://127.0.0.1:1").is_ok());
        let e = none.endpoint("https://tracker:7070").unwrap_err().to_string();
        assert!(e.contains("--tls-ca"), "{e}");
        let with_ca = Access { ca_pem: Some(b"x".to_vec()), ..Access::default() };
        let e = with_ca.endpoint("http://tracker:7070").unwrap_err().to_string();
        assert!(e.contains("not https"), "{e}");
        let debug = format!("{:?}", Access::new(Some("tt_1_secret"), None, None).unwrap());
        assert!(!debug.contains("secret"), "{debug}");
    }
}
