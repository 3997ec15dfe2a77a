//! The `tensortune-tracker` binary: the `token` commands and the refusal to serve a network
//! address without tokens and TLS.

use std::process::Command;

use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_tensortune-tracker");

/// Runs the tracker binary with `args`: (success, stdout, stderr).
pub(crate) fn tracker(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).env("RUST_LOG", "warn").output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn tokens_are_made_listed_and_revoked_and_only_their_hash_is_kept() {
    let dir = TempDir::new().unwrap();
    let db = dir.path().join("t.db");
    let db = db.to_str().unwrap();
    let (ok, token, _) = tracker(&["token", "add", "--name", "alice", "--role", "client", "--db", db]);
    assert!(ok);
    let token = token.trim();
    assert!(token.starts_with("tt_1_") && token.len() > 40, "{token}");
    let file = dir.path().join("w.token");
    let (ok, stdout, stderr) =
        tracker(&["token", "add", "--name", "gpu-1", "--role", "worker", "--out", file.to_str().unwrap(), "--db", db]);
    assert!(ok && stdout.is_empty(), "{stdout} {stderr}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    // The database holds neither secret.
    let bytes = std::fs::read(dir.path().join("t.db")).unwrap();
    let wal = std::fs::read(dir.path().join("t.db-wal")).unwrap_or_default();
    // tt_{id}_{secret}: the id is a number, the secret URL-safe base64 (which may hold '_').
    let secret = token.strip_prefix("tt_").and_then(|rest| rest.split_once('_')).map(|(_, s)| s).unwrap();
    assert!(secret.len() >= 32, "{token}");
    for b in [&bytes, &wal] {
        assert!(!b.windows(secret.len()).any(|w| w == secret.as_bytes()), "the secret is stored in clear");
    }

    let (_, list, _) = tracker(&["token", "list", "--db", db]);
    assert!(
        list.contains("alice") && list.contains("client") && list.contains("gpu-1") && list.contains("active"),
        "{list}"
    );
    assert!(!list.contains(secret));
    let (ok, _, stderr) = tracker(&["token", "add", "--name", "alice", "--role", "admin", "--db", db]);
    assert!(!ok && stderr.contains("exists already"), "{stderr}");
    let (ok, _, stderr) = tracker(&["token", "add", "--name", "x", "--role", "root", "--db", db]);
    assert!(!ok && stderr.contains("root"), "{stderr}");
    let (ok, stdout, _) = tracker(&["token", "revoke", "alice", "--db", db]);
    assert!(ok && stdout.contains("revoked"), "{stdout}");
    let (_, list, _) = tracker(&["token", "list", "--db", db]);
    assert!(list.lines().any(|l| l.contains("alice") && l.contains("revoked")), "{list}");
    let (ok, _, stderr) = tracker(&["token", "revoke", "nobody", "--db", db]);
    assert!(!ok && stderr.contains("no token named"), "{stderr}");
}

#[test]
fn a_network_address_without_tokens_is_refused_unless_insecure() {
    let dir = TempDir::new().unwrap();
    let db = dir.path().join("t.db");
    let (ok, _, stderr) = tracker(&["--listen", "0.0.0.0:0", "--db", db.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("refusing to serve") && stderr.contains("--insecure"), "{stderr}");
    let (ok, _, stderr) =
        tracker(&["--listen", "127.0.0.1:0", "--db", db.to_str().unwrap(), "--tls-cert", "/nonexistent"]);
    assert!(!ok && stderr.contains("--tls-key"), "{stderr}");
}
