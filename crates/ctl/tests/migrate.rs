//! `sagactl migrate`, the deploy job that owns the schema (docker compose's `migrate` service,
//! the Kubernetes `midflight-migrate` Job): it creates the schema on an empty database, and a
//! second run on a migrated one changes nothing.

use midflight_config::DatabaseSection;
use midflight_store::testing::TestDb;
use midflight_store::{Store, both_engines};

/// Runs `sagactl migrate` against `url`, with nothing from this process's MIDFLIGHT_* environment.
async fn migrate(url: &str) -> (i32, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_sagactl"));
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("MIDFLIGHT_")) {
        command.env_remove(name);
    }
    let output = command.arg("--set").arg(format!("database.url={url}")).arg("migrate").output().await.expect("run");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code().unwrap_or(-1), text)
}

#[tokio::test]
async fn an_empty_database_gets_the_schema() {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let path = std::env::temp_dir().join(format!("midflight-migrate-{}-{nanos}.db", std::process::id()));
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let (code, text) = migrate(&url).await;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("schema up to date"), "{text}");
    let store = Store::connect(&DatabaseSection { url, ..DatabaseSection::default() }).await.expect("connect");
    assert!(store.status_summary().await.expect("the saga table exists").is_empty());
    store.close().await.ok();
    for suffix in ["", "-wal", "-shm"] {
        std::fs::remove_file(format!("{}{suffix}", path.display())).ok();
    }
}

async fn migrating_twice_changes_nothing(db: &TestDb) {
    let (code, text) = migrate(&db.url).await;
    assert_eq!(code, 0, "{text}");
    assert!(db.store.status_summary().await.expect("the saga table is still there").is_empty());
}

both_engines!(a_migrated_database_is_left_as_it_is, migrating_twice_changes_nothing);
