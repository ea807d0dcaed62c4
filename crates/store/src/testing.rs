//! Test support: a fresh, migrated database per test, on SQLite or MySQL, so one test body runs
//! on both engines.
//!
//! MySQL tests use the server named by `MIDFLIGHT_TEST_MYSQL_URL` (e.g.
//! `mysql://root@127.0.0.1:3306/test`) and create a database of their own, dropped afterwards.
//! Without the variable they are skipped with a note, except under `CI=true`, where a missing
//! variable fails the test: CI must never silently skip the MySQL half.

use std::path::PathBuf;

use midflight_config::DatabaseSection;
use midflight_model::{Address, Line, LogisticsAnswer, Observation, OrderEvent, Plan, Rules, Saga, WmsAnswer, plan};

use crate::{Cas, Store};

/// The variable naming the MySQL server for tests.
pub const MYSQL_URL_VAR: &str = "MIDFLIGHT_TEST_MYSQL_URL";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    MySql,
}

/// An order event for tests and benches: `PAID`, one line of `SKU-0001` x 1, an address in
/// region `CN-ZJ`, 12.00. A test that needs other values changes the fields it cares about.
pub fn order_event(order_no: &str) -> OrderEvent {
    OrderEvent {
        order_no: order_no.into(),
        event_type: "PAID".into(),
        lines: vec![Line { sku: "SKU-0001".into(), quantity: 1 }],
        address: Address {
            region: "CN-ZJ".into(),
            city: "Hangzhou".into(),
            line: "1 West Lake Rd".into(),
            postal_code: String::new(),
        },
        amount_cents: 1_200,
    }
}

/// Drives `saga`, which `actor` holds, to DONE with canned answers, as a driver would: the
/// business row and WMS intent, the WMS answer and logistics intent, the shipment (business
/// row marked shipped, outbox row) and DONE. Each write renews the lease for `lease_ms`.
/// Panics on anything but a write that applies.
pub async fn drive_to_done(store: &Store, mut saga: Saga, actor: &str, lease_ms: i64) -> Saga {
    let answers = [
        Observation::Nothing,
        Observation::Wms(WmsAnswer::Locked),
        Observation::Logistics(LogisticsAnswer::Created { tracking_no: format!("TRK-{}", saga.biz_id) }),
    ];
    for observation in answers {
        let now = store.now_ms().await.expect("clock");
        let Plan::Write { change, .. } = plan(&saga, &observation, now, &Rules::default()) else {
            panic!("{}: expected a write after {}", saga.biz_id, observation.label())
        };
        match store.write(&saga, &change, now, lease_ms, actor).await.expect("write") {
            Cas::Applied(next) => saga = next,
            Cas::Conflict => panic!("{}: conflict", saga.biz_id),
        }
    }
    saga
}

/// The engine's plan of `sql`, a line per step: MySQL's `key` (the index each step reads),
/// SQLite's `detail`.
#[cfg(test)]
pub(crate) async fn plan_of(store: &crate::Store, sql: &str, values: Vec<sea_orm::Value>) -> Vec<String> {
    use sea_orm::ConnectionTrait;
    let (explain, column) = match store.backend {
        sea_orm::DbBackend::MySql => ("EXPLAIN", "key"),
        _ => ("EXPLAIN QUERY PLAN", "detail"),
    };
    let statement = sea_orm::Statement::from_sql_and_values(store.backend, format!("{explain} {sql}"), values);
    let rows = store.db.query_all_raw(statement).await.expect("explain");
    rows.iter().map(|row| row.try_get::<Option<String>>("", column).expect("plan column").unwrap_or_default()).collect()
}

/// Inserts `sagas` in inbox batches of `batch` and drives each to DONE with
/// [`drive_to_done`], `in_flight` at a time, as the consumer does; returns when all are done.
pub async fn drive_all_to_done(store: &Store, sagas: &[Saga], batch: usize, in_flight: usize, lease_ms: i64) {
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(in_flight.max(1)));
    let mut drives = tokio::task::JoinSet::new();
    for chunk in sagas.chunks(batch.max(1)) {
        let arrivals = store.insert_arrivals(chunk, "bench", lease_ms, "consumer:bench").await.expect("inbox");
        for arrival in arrivals {
            let crate::Arrival::Fresh(saga) = arrival else { panic!("fresh rows only") };
            let permit = permits.clone().acquire_owned().await.expect("permit");
            let store = store.clone();
            drives.spawn(async move {
                drive_to_done(&store, saga, "consumer:bench", lease_ms).await;
                drop(permit);
            });
        }
    }
    while let Some(joined) = drives.join_next().await {
        joined.expect("drive task");
    }
}

/// Inserts sagas for the orders `names` (one each, offsets 0.. on partition 0 of `orders`),
/// leased to `c1` for a minute; returns the rows as stored.
pub async fn arrive_orders(store: &Store, names: &[&str]) -> Vec<Saga> {
    let now = store.now_ms().await.expect("clock");
    let sagas: Vec<Saga> = names
        .iter()
        .enumerate()
        .map(|(n, name)| {
            let source = midflight_model::Source { topic: "orders".into(), partition: 0, offset: n as i64 };
            Saga::received(&order_event(name), source, now, now + 600_000)
        })
        .collect();
    let arrived = store.insert_arrivals(&sagas, "c1", 60_000, "consumer:c1").await.expect("insert");
    arrived
        .into_iter()
        .map(|arrival| arrival.saga().unwrap_or_else(|| panic!("readable: {arrival:?}")).clone())
        .collect()
}

/// Runs `sql` (no parameters) on `store`, for tests that set a table up by hand; returns the
/// rows it changed.
pub async fn execute(store: &Store, sql: &str) -> u64 {
    use sea_orm::{ConnectionTrait, Statement};
    store.db.execute_raw(Statement::from_string(store.backend, sql)).await.expect(sql).rows_affected()
}

/// Sets `status` on a saga and moves its last write (and its lease, 30 s after it) `ago_ms`
/// into the past by the database clock: how a test makes a saga old enough to purge.
pub async fn age(store: &Store, biz_id: &str, status: midflight_model::Status, ago_ms: i64) {
    use sea_orm::{ConnectionTrait, Statement, Value};
    let now = store.now_ms().await.expect("clock");
    let sql = "UPDATE saga SET status = ?, updated_at_ms = ?, lease_until_ms = ? WHERE biz_id = ?";
    let values: Vec<Value> =
        vec![status.as_str().into(), (now - ago_ms).into(), (now - ago_ms + 30_000).into(), biz_id.into()];
    let result = store.db.execute_raw(Statement::from_sql_and_values(store.backend, sql, values)).await.expect("age");
    assert_eq!(result.rows_affected(), 1, "{biz_id}: no such saga");
}

/// A transaction holding saga rows locked (MySQL only), as another process's batch frozen
/// mid-way would; they are let go by [`Held::release`], or when it is dropped.
#[derive(Debug)]
pub struct Held(sea_orm::DatabaseTransaction);

impl Held {
    /// Rolls the holding transaction back.
    pub async fn release(self) {
        self.0.rollback().await.expect("the holder rolls back");
    }
}

/// Locks the saga rows `ids` by primary key (`FOR UPDATE`) in a transaction of its own on
/// `store` (MySQL only); panics unless every one of them is there.
pub async fn hold_sagas(store: &Store, ids: &[String]) -> Held {
    use sea_orm::{ConnectionTrait, Statement, TransactionTrait, Value};
    assert_eq!(store.backend, sea_orm::DbBackend::MySql, "row locks are held on MySQL only");
    let txn = store.db.begin().await.expect("holder transaction");
    let sql = format!(
        "SELECT biz_id FROM saga FORCE INDEX (PRIMARY) WHERE biz_id IN ({}) FOR UPDATE",
        crate::dialect::placeholders(ids.len())
    );
    let values: Vec<Value> = ids.iter().map(|id| Value::from(id.clone())).collect();
    let rows = txn.query_all_raw(Statement::from_sql_and_values(store.backend, sql, values)).await.expect("hold");
    assert_eq!(rows.len(), ids.len(), "every saga to hold is there");
    Held(txn)
}

/// Polls `check` every 20 ms until it holds, failing the test after a minute: how a test
/// waits for another task or connection to reach a point, instead of sleeping.
pub async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A fresh database, removed when dropped.
#[derive(Debug)]
pub struct TestDb {
    pub store: Store,
    pub url: String,
    pub engine: Engine,
    cleanup: Cleanup,
}

#[derive(Debug)]
enum Cleanup {
    File(PathBuf),
    Database { server_url: String, name: String },
}

impl TestDb {
    /// A fresh database on `engine`, or `None` when MySQL is not configured outside CI.
    pub async fn fresh(engine: Engine) -> Option<TestDb> {
        match engine {
            Engine::Sqlite => Some(TestDb::sqlite().await),
            Engine::MySql => TestDb::mysql().await,
        }
    }

    async fn sqlite() -> TestDb {
        let path = std::env::temp_dir().join(format!("midflight-test-{}.db", uuid::Uuid::new_v4().simple()));
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let store = connect(&url).await;
        TestDb { store, url, engine: Engine::Sqlite, cleanup: Cleanup::File(path) }
    }

    async fn mysql() -> Option<TestDb> {
        let server_url = mysql_server_url()?;
        let name = format!("mf_t_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
        run_sql(&server_url, &format!("CREATE DATABASE {name}")).await;
        let url = with_database(&server_url, &name);
        let store = connect(&url).await;
        Some(TestDb { store, url, engine: Engine::MySql, cleanup: Cleanup::Database { server_url, name } })
    }

    /// A second, independent connection pool on the same database (another "process").
    pub async fn another_store(&self) -> Store {
        connect(&self.url).await
    }
}

/// The MySQL server URL for tests, `None` (with a note) when unset outside CI.
pub fn mysql_server_url() -> Option<String> {
    required_in_ci(MYSQL_URL_VAR, "the MySQL half of the tests", "the MySQL variant of this test")
}

/// The value of the test variable `var`, or `None` (with a note naming what is `skipped`)
/// when it is unset or blank outside CI. Under `CI=true` a missing value fails the test:
/// CI must never silently skip what `must_run` names.
pub fn required_in_ci(var: &str, must_run: &str, skipped: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(value) if !value.trim().is_empty() => Some(value),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI=true but {var} is not set: {must_run} must run in CI")
        }
        _ => {
            eprintln!("note: {var} is not set; skipping {skipped}");
            None
        }
    }
}

/// `server_url` with its database path replaced by `name`.
pub fn with_database(server_url: &str, name: &str) -> String {
    midflight_config::with_database_name(server_url, name)
}

async fn connect(url: &str) -> Store {
    let section = DatabaseSection { url: url.to_owned(), max_connections: 16, ..DatabaseSection::default() };
    let store = Store::connect(&section).await.unwrap_or_else(|e| panic!("connect to test database {url}: {e}"));
    store.migrate().await.unwrap_or_else(|e| panic!("migrate test database {url}: {e}"));
    store
}

async fn run_sql(url: &str, sql: &str) {
    use sea_orm::ConnectionTrait;
    let db = sea_orm::Database::connect(url).await.unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    db.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    db.close().await.ok();
}

impl Drop for TestDb {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::File(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    std::fs::remove_file(format!("{}{suffix}", path.display())).ok();
                }
            }
            Cleanup::Database { server_url, name } => {
                if !run_sql_from_drop(server_url, &format!("DROP DATABASE IF EXISTS {name}")) {
                    eprintln!("note: could not drop test database {name}");
                }
            }
        }
    }
}

/// Runs `sql` on `url` from a `Drop` of a test's: drop runs inside the test's runtime, so a
/// separate thread with its own runtime blocks on it without stalling that. Whether it ran.
pub fn run_sql_from_drop(url: &str, sql: &str) -> bool {
    let (url, sql) = (url.to_owned(), sql.to_owned());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
        if let Ok(runtime) = runtime {
            runtime.block_on(run_sql(&url, &sql));
        }
    })
    .join()
    .is_ok()
}

/// Defines `mod $name { sqlite, mysql }`: one async test body run on both engines.
/// The body is an `async fn(&TestDb)`.
#[macro_export]
macro_rules! both_engines {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                let db = $crate::testing::TestDb::fresh($crate::testing::Engine::Sqlite).await.expect("sqlite");
                super::$body(&db).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mysql() {
                if let Some(db) = $crate::testing::TestDb::fresh($crate::testing::Engine::MySql).await {
                    super::$body(&db).await;
                }
            }
        }
    };
}
