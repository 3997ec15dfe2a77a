//! `sqlx::migrate!` embeds `migrations/sqlite/` and `migrations/postgres/` at compile time; rebuild when a migration is added.

fn main() {
    println!("cargo:rerun-if-changed=../migrations/sqlite");
    println!("cargo:rerun-if-changed=../migrations/postgres");
}
