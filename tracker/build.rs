//! Embeds `migrations/sqlite/` and `migrations/postgres/` in the tracker: writes
//! `$OUT_DIR/migrations.rs`, a list per database of (version, description, SQL) read the way
//! sqlx reads a migration folder (`<version>_<description>.sql`, underscores shown as spaces),
//! from which `store::migrator` builds sqlx's `Migrator` at run time. (sqlx's `migrate!` macro
//! does the same at compile time, but its proc-macro builds sqlx's drivers and SQLite a second
//! time for the host.)

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let root = Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../migrations");
    let mut code = String::new();
    for db in ["sqlite", "postgres"] {
        let dir = root.join(db);
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        writeln!(code, "pub(crate) const {}: &[(i64, &str, &str)] = &[", db.to_uppercase()).unwrap();
        for path in files {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let Some((version, rest)) = name.split_once('_').filter(|(_, r)| r.ends_with(".sql")) else {
                continue;
            };
            assert!(
                !rest.ends_with(".up.sql") && !rest.ends_with(".down.sql"),
                "{name}: reversible migrations are not supported (only <version>_<description>.sql)"
            );
            let version: i64 = version.parse().unwrap_or_else(|_| panic!("{name}: the version is not an integer"));
            let description = rest.trim_end_matches(".sql").replace('_', " ");
            let path = path.canonicalize().unwrap();
            writeln!(code, "    ({version}, {description:?}, include_str!({:?})),", path.display().to_string())
                .unwrap();
        }
        code.push_str("];\n");
    }
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("migrations.rs");
    std::fs::write(out, code).unwrap();
}
