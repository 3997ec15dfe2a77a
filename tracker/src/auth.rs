//! Who is calling: bearer tokens with roles, checked on every RPC by an interceptor.
//!
//! A token is spelled `tt_<id>_<secret>`; the tracker stores only the SHA-256 of the secret
//! (`tokens` table) and compares it in constant time. Tokens are made, listed and revoked offline
//! with `tensortune-tracker token ...` on the database; a running tracker re-reads the table every
//! [`REFRESH`], so a new or revoked token takes effect within that time.
//!
//! A database that has ever held a token requires one on every call; one that never did runs
//! open (every caller is an anonymous admin), which the binary allows only on loopback unless told
//! `--insecure`.
//!
//! Roles: `worker` calls `Dispatch`; `client` calls `Tuning` and cancels only its own jobs;
//! `admin` calls everything (quarantine included). The interceptor of each service admits the
//! roles the service takes and leaves a [`Caller`] in the request's extensions for the finer
//! checks (job ownership, a worker's calls carrying the token it registered with).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::Rng as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use crate::error::{Error, Result};
use crate::model::now_ms;
use crate::store::{Pool, on};

/// How often a running tracker re-reads the tokens table.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);
/// Bytes of randomness in a token's secret (256 bits).
const SECRET_BYTES: usize = 32;
/// Longest token name.
const MAX_NAME: usize = 64;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// A worker daemon: register, lease, heartbeat, report.
    Worker,
    /// A person or script: submit and cancel its own jobs, read everything.
    Client,
    /// Everything, including other tokens' jobs and quarantine.
    Admin,
}

impl Role {
    /// The role's spelling in flags and in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Client => "client",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "worker" => Ok(Role::Worker),
            "client" => Ok(Role::Client),
            "admin" => Ok(Role::Admin),
            other => Err(format!("invalid role {other:?}: expected worker, client or admin")),
        }
    }
}

/// Who made a call, as the interceptor found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    /// The token's id; `None` on a tracker without tokens.
    pub(crate) token: Option<i64>,
    pub(crate) role: Role,
}

impl Caller {
    /// The caller of a tracker without tokens: may do everything, owns nothing in particular.
    pub(crate) const OPEN: Caller = Caller { token: None, role: Role::Admin };

    /// The caller the interceptor left on a request (the open caller when none did, as in unit
    /// tests that call a service directly).
    pub(crate) fn of<T>(request: &Request<T>) -> Caller {
        request.extensions().get::<Caller>().cloned().unwrap_or(Caller::OPEN)
    }

    /// Whether this caller may act on something owned by `owner` (a job, a worker): admins and
    /// open trackers always; others only on what their own token made.
    pub(crate) fn owns(&self, owner: Option<i64>) -> bool {
        self.role == Role::Admin || self.token.is_none() || owner == self.token
    }

    /// Fails with `PermissionDenied` unless the caller is an admin.
    pub(crate) fn require_admin(&self, what: &str) -> Result<()> {
        if self.role == Role::Admin {
            Ok(())
        } else {
            Err(Error::Denied(format!("{what} needs an admin token; this is a {} token", self.role)))
        }
    }
}

/// A token as the tracker knows it.
#[derive(Clone, Debug)]
struct Known {
    name: String,
    role: Role,
    secret_sha256: [u8; 32],
    revoked: bool,
}

/// The tokens table as last read, shared by the interceptors.
#[derive(Default)]
pub(crate) struct Tokens {
    /// `None` until first read; then every token by id. Empty means the tracker runs open.
    known: RwLock<Option<HashMap<i64, Known>>>,
}

impl Tokens {
    /// Reads the table now.
    pub(crate) async fn load(&self, pool: &Pool) -> Result<()> {
        /// id, name, role, secret_sha256, revoked_ms.
        type Row = (i64, String, String, Vec<u8>, Option<i64>);
        let rows: Vec<Row> = on!(pool, |c, pg| {
            sqlx::query_as("SELECT id, name, role, secret_sha256, revoked_ms FROM tokens").fetch_all(c).await
        })?;
        let mut known = HashMap::with_capacity(rows.len());
        for (id, name, role, hash, revoked) in rows {
            let (Ok(role), Ok(secret_sha256)) = (role.parse(), <[u8; 32]>::try_from(hash.as_slice())) else {
                tracing::warn!(token = id, "token row is malformed; it is refused");
                continue;
            };
            known.insert(id, Known { name, role, secret_sha256, revoked: revoked.is_some() });
        }
        *self.known.write().unwrap_or_else(|e| e.into_inner()) = Some(known);
        Ok(())
    }

    /// Whether calls need a token.
    pub(crate) fn required(&self) -> bool {
        self.known.read().unwrap_or_else(|e| e.into_inner()).as_ref().is_none_or(|k| !k.is_empty())
    }

    /// The caller a request's `authorization` header names.
    fn authenticate(&self, metadata: &MetadataMap) -> std::result::Result<Caller, Status> {
        let guard = self.known.read().unwrap_or_else(|e| e.into_inner());
        let Some(known) = guard.as_ref() else {
            return Err(Status::unavailable("the tracker is starting; retry"));
        };
        if known.is_empty() {
            return Ok(Caller::OPEN);
        }
        let Some(header) = metadata.get("authorization") else {
            return Err(Status::unauthenticated(
                "this tracker requires a token: set TENSORTUNE_TOKEN_FILE (or TENSORTUNE_TOKEN) to a token made with \
                 `tensortune-tracker token add`",
            ));
        };
        let presented = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(|| Status::unauthenticated("the authorization header must be `Bearer tt_<id>_<secret>`"))?;
        let (id, secret) = parse(presented.trim()).ok_or_else(|| {
            Status::unauthenticated("the token is not a tensortune token (expected tt_<id>_<secret>)")
        })?;
        let digest = sha256(secret);
        // The same work whether or not the id exists, so timing tells nothing about which ids do.
        let unknown = Known { name: String::new(), role: Role::Worker, secret_sha256: [0; 32], revoked: true };
        let (entry, exists) = match known.get(&id) {
            Some(k) => (k, true),
            None => (&unknown, false),
        };
        let matches: bool = entry.secret_sha256.ct_eq(&digest).into();
        if !(exists && matches) {
            return Err(Status::unauthenticated("the token is not known to this tracker"));
        }
        if entry.revoked {
            return Err(Status::unauthenticated(format!("the token {:?} was revoked", entry.name)));
        }
        Ok(Caller { token: Some(id), role: entry.role })
    }

    /// Re-reads the table every [`REFRESH`] until `stop`.
    pub(crate) async fn refresh(self: Arc<Self>, pool: Pool, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(REFRESH) => {}
            }
            if let Err(e) = self.load(&pool).await {
                tracing::warn!(error = %e, "cannot re-read the tokens table; keeping the last copy");
            }
        }
    }
}

/// The interceptor of one service: authenticates the caller, admits the service's roles, leaves
/// the [`Caller`] in the request.
#[derive(Clone)]
pub(crate) struct Gate {
    tokens: Arc<Tokens>,
    service: &'static str,
    roles: &'static [Role],
    /// Whether callers must present a TLS client certificate (mutual TLS for workers).
    client_cert: bool,
}

impl Gate {
    /// The gate of `service`, admitting `roles`.
    pub(crate) fn new(tokens: Arc<Tokens>, service: &'static str, roles: &'static [Role], client_cert: bool) -> Gate {
        Gate { tokens, service, roles, client_cert }
    }
}

impl tonic::service::Interceptor for Gate {
    fn call(&mut self, mut request: Request<()>) -> std::result::Result<Request<()>, Status> {
        if self.client_cert && request.peer_certs().is_none_or(|certs| certs.is_empty()) {
            return Err(Status::unauthenticated(format!(
                "{} needs a TLS client certificate signed by the tracker's --tls-client-ca",
                self.service
            )));
        }
        let caller = self.tokens.authenticate(request.metadata())?;
        if !self.roles.contains(&caller.role) {
            let allowed: Vec<&str> = self.roles.iter().map(|r| r.as_str()).collect();
            return Err(Status::permission_denied(format!(
                "a {} token may not call {}; it takes a {} token",
                caller.role,
                self.service,
                allowed.join(" or ")
            )));
        }
        request.extensions_mut().insert(caller);
        Ok(request)
    }
}

/// `(id, secret)` of a token spelled `tt_<id>_<secret>`.
fn parse(token: &str) -> Option<(i64, &str)> {
    let rest = token.strip_prefix("tt_")?;
    let (id, secret) = rest.split_once('_')?;
    let id: i64 = id.parse().ok().filter(|&id| id > 0)?;
    (!secret.is_empty()).then_some((id, secret))
}

fn sha256(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// A token as `token list` shows it (never its secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenInfo {
    /// The token's id (the `<id>` in `tt_<id>_...`).
    pub id: i64,
    /// Its unique name.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// When it was made, ms since the epoch.
    pub created_ms: i64,
    /// When it was revoked, if it was.
    pub revoked_ms: Option<i64>,
}

/// Makes a token named `name` with `role` in the database at `db` (created when missing) and
/// returns it. The secret is shown only here; the database keeps its hash.
pub async fn add_token(db: &Path, name: &str, role: Role) -> anyhow::Result<String> {
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(|c| c.is_ascii_graphic()) {
        anyhow::bail!("invalid token name {name:?}: use 1..={MAX_NAME} printable ASCII characters without spaces");
    }
    let pool = crate::store::open(db).await?;
    let mut secret = [0u8; SECRET_BYTES];
    rand::rng().fill_bytes(&mut secret);
    let secret = URL_SAFE_NO_PAD.encode(secret);
    let inserted: Result<i64, sqlx::Error> = on!(&pool, |c, pg| {
        sqlx::query_scalar(
            "INSERT INTO tokens (name, role, secret_sha256, created_ms) VALUES ($1, $2, $3, $4) RETURNING id",
        )
        .bind(name)
        .bind(role.as_str())
        .bind(sha256(&secret).as_slice())
        .bind(now_ms())
        .fetch_one(c)
        .await
    });
    pool.close().await;
    let id = match inserted {
        Ok(id) => id,
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            anyhow::bail!("a token named {name:?} exists already; pick another name or revoke it first")
        }
        Err(e) => return Err(anyhow::Error::new(e).context("storing the token")),
    };
    Ok(format!("tt_{id}_{secret}"))
}

/// Every token of the database at `db`, oldest first.
pub async fn list_tokens(db: &Path) -> anyhow::Result<Vec<TokenInfo>> {
    let pool = crate::store::open(db).await?;
    let rows: Vec<(i64, String, String, i64, Option<i64>)> =
        on!(&pool, |c, pg| sqlx::query_as("SELECT id, name, role, created_ms, revoked_ms FROM tokens ORDER BY id")
            .fetch_all(c)
            .await)?;
    pool.close().await;
    rows.into_iter()
        .map(|(id, name, role, created_ms, revoked_ms)| {
            let role = role.parse().map_err(|e: String| anyhow::anyhow!("token {id}: {e}"))?;
            Ok(TokenInfo { id, name, role, created_ms, revoked_ms })
        })
        .collect()
}

/// Revokes the token named `name` (or with id `name`); a running tracker refuses it within
/// [`REFRESH`]. Returns false when it was revoked already.
pub async fn revoke_token(db: &Path, name: &str) -> anyhow::Result<bool> {
    let pool = crate::store::open(db).await?;
    let id: Option<(i64, Option<i64>)> = on!(&pool, |c, pg| sqlx::query_as(
        "SELECT id, revoked_ms FROM tokens WHERE name = $1 OR CAST(id AS TEXT) = $1"
    )
    .bind(name)
    .fetch_optional(c)
    .await)?;
    let Some((id, revoked)) = id else {
        pool.close().await;
        anyhow::bail!("no token named {name:?}; `tensortune-tracker token list` shows them");
    };
    if revoked.is_none() {
        on!(&pool, |c, pg| {
            sqlx::query("UPDATE tokens SET revoked_ms = $2 WHERE id = $1")
                .bind(id)
                .bind(now_ms())
                .execute(c)
                .await
                .map(|r| r.rows_affected())
        })?;
    }
    pool.close().await;
    Ok(revoked.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse_only_in_their_spelling() {
        assert_eq!(parse("tt_12_abc"), Some((12, "abc")));
        assert_eq!(parse("tt_12_a_b"), Some((12, "a_b")));
        for bad in ["", "tt_", "tt_12", "tt_12_", "tt_0_x", "tt_-1_x", "tt_x_y", "xx_1_y", "Bearer tt_1_y"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn roles_round_trip_and_refuse_others() {
        for role in [Role::Worker, Role::Client, Role::Admin] {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
        }
        let e = "root".parse::<Role>().unwrap_err();
        assert!(e.contains("\"root\"") && e.contains("worker, client or admin"), "{e}");
    }

    #[test]
    fn ownership_follows_the_token_unless_admin_or_open() {
        let client = Caller { token: Some(3), role: Role::Client };
        assert!(client.owns(Some(3)));
        assert!(!client.owns(Some(4)) && !client.owns(None));
        assert!(Caller { token: Some(1), role: Role::Admin }.owns(Some(4)));
        assert!(Caller::OPEN.owns(Some(4)));
        assert!(client.require_admin("quarantine").is_err());
    }
}
