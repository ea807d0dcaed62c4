//! A transition written alone goes to MySQL as one request (`one_trip.rs`); these check that it
//! writes exactly what the prepared statements write, that a stale one writes nothing, and that
//! a request that fails part-way leaves nothing behind, not even on a pooled connection. Each
//! body runs on both engines; SQLite never takes the path, and says so in the counters.

use midflight_config::DatabaseSection;
use midflight_model::{LogisticsAnswer, Observation, Plan, Rules, Saga, Source, Status, WmsAnswer, plan};
use midflight_store::testing::{Engine, TestDb, order_event};
use midflight_store::{Arrival, Cas, Store, both_engines};
use sea_orm::{ConnectionTrait, Statement};

const LEASE_MS: i64 = 60_000;

async fn arrival(store: &Store, order_no: &str) -> Saga {
    let now = store.now_ms().await.expect("clock");
    let source = Source { topic: "orders".into(), partition: 0, offset: 0 };
    let saga = Saga::received(&order_event(order_no), source, now, now + 600_000);
    match store.insert_arrivals(&[saga], "c1", LEASE_MS, "consumer:c1").await.expect("insert").pop() {
        Some(Arrival::Fresh(saga)) => saga,
        other => panic!("expected a fresh row, got {other:?}"),
    }
}

/// The write the planner makes after `observation`, timed as if its call took `call_ms`.
async fn step(store: &Store, saga: &Saga, observation: &Observation, call_ms: u64) -> Cas<Saga> {
    let now = store.now_ms().await.expect("clock");
    let Plan::Write { change, .. } = plan(saga, observation, now, &Rules::default()) else {
        panic!("{}: expected a write after {}", saga.biz_id, observation.label())
    };
    store.write_timed(saga, &change, now, LEASE_MS, "consumer:c1", Some(call_ms)).await.expect("write")
}

fn answers(saga: &Saga) -> [Observation; 3] {
    [
        Observation::Nothing,
        Observation::Wms(WmsAnswer::Locked),
        Observation::Logistics(LogisticsAnswer::Created { tracking_no: format!("TRK-{}", saga.biz_id) }),
    ]
}

/// Drives `saga` to DONE; each step's returned row must be the row stored (but for the lease
/// expiry, which the database computed from its own clock).
async fn drive(store: &Store, mut saga: Saga) -> Saga {
    for (n, observation) in answers(&saga).iter().enumerate() {
        saga = step(store, &saga, observation, 100 + n as u64).await.applied().expect("applied");
        let mut stored = store.get(&saga.biz_id).await.expect("read").expect("row");
        assert!(stored.lease.until_ms >= saga.updated_at_ms, "the lease was renewed");
        stored.lease.until_ms = saga.lease.until_ms;
        assert_eq!(stored, saga, "the row written is the row returned");
    }
    saga
}

/// What two sagas' histories must share: everything but their ids, times and the values
/// derived from their ids.
async fn history(store: &Store, saga: &Saga) -> (Vec<String>, String, Option<String>, String) {
    let log = store.transitions(&saga.biz_id).await.expect("log");
    let log = log
        .iter()
        .map(|t| {
            format!(
                "{} {:?}->{:?} e{} {} {} {:?}",
                t.version, t.from, t.to, t.lease_epoch, t.actor, t.reason, t.call_ms
            )
        })
        .collect();
    let order = store.order_row(&saga.biz_id).await.expect("read").expect("business row");
    let tracking = order.tracking_no.map(|t| t.replace(&saga.biz_id, "<id>"));
    let payload = store
        .connection()
        .query_one_raw(Statement::from_sql_and_values(
            store.backend(),
            "SELECT payload FROM outbox WHERE biz_id = ?",
            [saga.biz_id.clone().into()],
        ))
        .await
        .expect("read outbox")
        .expect("outbox row")
        .try_get::<String>("", "payload")
        .expect("payload")
        .replace(&saga.biz_id, "<id>")
        .replace(&saga.order_no, "<order>");
    (log, order.status, tracking, payload)
}

async fn prepared_store(db: &TestDb) -> Store {
    let section =
        DatabaseSection { url: db.url.clone(), max_connections: 4, one_round_trip: false, ..Default::default() };
    Store::connect(&section).await.expect("connect")
}

async fn one_request_writes_what_prepared_statements_write(db: &TestDb) {
    let prepared = prepared_store(db).await;
    let (before, before_prepared) = (db.store.stats(), prepared.stats());
    let one = drive(&db.store, arrival(&db.store, "ONE").await).await;
    let other = drive(&prepared, arrival(&prepared, "PREP").await).await;
    assert_eq!(one.status, Status::Done);
    assert_eq!(history(&db.store, &one).await, history(&db.store, &other).await);
    let (after, after_prepared) = (db.store.stats(), prepared.stats());
    let expected = if db.engine == Engine::MySql { 3 } else { 0 };
    assert_eq!(after.one_trip - before.one_trip, expected, "each of the three steps was one request on MySQL only");
    assert_eq!(after_prepared.one_trip, before_prepared.one_trip, "turned off, the path is not taken");
    assert_eq!(after.transitions - before.transitions, 3);
    assert_eq!(after_prepared.transitions - before_prepared.transitions, 3);
}
both_engines!(one_request_writes_what_prepared_statements_write, one_request_writes_what_prepared_statements_write);

async fn a_stale_request_writes_nothing(db: &TestDb) {
    let store = &db.store;
    let saga = arrival(store, "STALE").await;
    let moved = step(store, &saga, &Observation::Nothing, 5).await.applied().expect("applied");
    let before = store.stats();
    // The same first step again, from the row as it was: its compare-and-set names a version
    // that is gone, so neither it nor any write guarded by it may land.
    assert_eq!(step(store, &saga, &Observation::Nothing, 5).await, Cas::Conflict);
    // A later step sent by an owner whose lease epoch is gone.
    let mut zombie = moved.clone();
    zombie.lease.epoch += 1;
    assert_eq!(step(store, &zombie, &Observation::Wms(WmsAnswer::Locked), 5).await, Cas::Conflict);
    let after = store.stats();
    let mut stored = store.get(&saga.biz_id).await.expect("read").expect("row");
    stored.lease.until_ms = moved.lease.until_ms;
    assert_eq!(stored, moved, "the row is as the one write left it");
    assert_eq!(store.transitions(&saga.biz_id).await.expect("log").len(), 3, "arrival and the first step's two edges");
    assert_eq!(after.transitions, before.transitions);
    let expected = if db.engine == Engine::MySql { 2 } else { 0 };
    assert_eq!(after.one_trip - before.one_trip, expected);
}
both_engines!(a_stale_request_writes_nothing, a_stale_request_writes_nothing);

/// The last step's outbox INSERT fails (its table is renamed away), after the request's
/// compare-and-set, log rows and business row ran. Nothing of it may stay: not at once, and not
/// later, when other transactions run on the pool's connections (a connection returned to the
/// pool with the request's transaction open would commit it at its next `BEGIN`).
async fn a_request_that_fails_part_way_leaves_nothing(db: &TestDb) {
    let store = &db.store;
    let mut saga = arrival(store, "FAIL").await;
    for observation in answers(&saga).iter().take(2) {
        saga = step(store, &saga, observation, 5).await.applied().expect("applied");
    }
    let log_before = store.transitions(&saga.biz_id).await.expect("log").len();
    let rename =
        |from: &str, to: &str| Statement::from_string(store.backend(), format!("ALTER TABLE {from} RENAME TO {to}"));
    store.connection().execute_raw(rename("outbox", "outbox_away")).await.expect("rename");
    let now = store.now_ms().await.expect("clock");
    let last = answers(&saga)[2].clone();
    let Plan::Write { change, .. } = plan(&saga, &last, now, &Rules::default()) else { panic!("a write") };
    let error = store.write(&saga, &change, now, LEASE_MS, "consumer:c1").await.expect_err("the outbox is gone");
    assert!(error.to_string().contains(&saga.biz_id), "the error names the saga: {error}");
    store.connection().execute_raw(rename("outbox_away", "outbox")).await.expect("rename back");
    // Other sagas' transactions on every connection of the pool.
    let names: Vec<String> = (0..24).map(|n| format!("OTHER-{n}")).collect();
    let others: Vec<Saga> = futures::future::join_all(names.iter().map(|name| arrival(store, name))).await;
    let moved =
        futures::future::join_all(others.iter().map(|other| step(store, other, &Observation::Nothing, 5))).await;
    assert!(moved.iter().all(Cas::is_applied));
    let mut stored = store.get(&saga.biz_id).await.expect("read").expect("row");
    stored.lease.until_ms = saga.lease.until_ms;
    assert_eq!(stored, saga, "the failed step changed nothing");
    assert_eq!(store.transitions(&saga.biz_id).await.expect("log").len(), log_before, "no log row stayed");
    let order = store.order_row(&saga.biz_id).await.expect("read").expect("business row");
    assert_eq!(order.status, "FULFILLING", "the business row was not marked shipped");
    // And the step, sent again, applies: no lock of the failed request is held.
    let done = step(store, &saga, &last, 5).await.applied().expect("applied");
    assert_eq!(done.status, Status::Done);
}
both_engines!(a_request_that_fails_part_way_leaves_nothing, a_request_that_fails_part_way_leaves_nothing);
