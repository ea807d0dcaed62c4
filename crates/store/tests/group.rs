//! Group commit: transitions of many sagas sharing one transaction keep every promise a
//! transition of its own makes. Each body runs on SQLite and on MySQL/MariaDB; the test
//! databases group transitions (the default), and the writes below are sent at once so they
//! share groups. Outcomes are asserted per saga, so they hold however the groups formed.

use midflight_model::{Observation, Plan, Rules, Saga, Source, Status, plan};
use midflight_store::testing::{TestDb, order_event};
use midflight_store::{Arrival, Cas, Store, both_engines};
use sea_orm::ConnectionTrait;

const LEASE_MS: i64 = 60_000;
const SAGAS: usize = 40;

async fn arrivals(store: &Store, prefix: &str) -> Vec<Saga> {
    arrivals_leased(store, prefix, LEASE_MS).await
}

async fn arrivals_leased(store: &Store, prefix: &str, lease_ms: i64) -> Vec<Saga> {
    let now = store.now_ms().await.expect("clock");
    let sagas: Vec<Saga> = (0..SAGAS)
        .map(|n| {
            let event = order_event(&format!("{prefix}-{n}"));
            let source = Source { topic: "orders".into(), partition: 0, offset: n as i64 };
            Saga::received(&event, source, now, now + 600_000)
        })
        .collect();
    let arrived = store.insert_arrivals(&sagas, "c1", lease_ms, "consumer:c1").await.expect("insert");
    arrived
        .into_iter()
        .map(|arrival| match arrival {
            Arrival::Fresh(saga) => saga,
            other => panic!("expected fresh rows, got {other:?}"),
        })
        .collect()
}

/// The planner's first write of a fresh saga, sent as `before` (which may be stale).
async fn first_write(store: &Store, before: &Saga) -> Result<Cas<Saga>, midflight_store::Error> {
    let now = store.now_ms().await.expect("clock");
    let Plan::Write { change, .. } = plan(before, &Observation::Nothing, now, &Rules::default()) else {
        panic!("a fresh saga's first step is a write")
    };
    store.write(before, &change, now, LEASE_MS, "consumer:c1").await
}

async fn members_keep_their_own_cas(db: &TestDb) {
    let store = &db.store;
    let sagas = arrivals(store, "G").await;
    // Odd sagas move on first, so the writes below name a version that is gone.
    for saga in sagas.iter().skip(1).step_by(2) {
        assert!(first_write(store, saga).await.expect("write").is_applied());
    }
    let before = store.stats();
    let outcomes = futures::future::join_all(sagas.iter().map(|saga| first_write(store, saga))).await;
    for (n, (saga, outcome)) in sagas.iter().zip(outcomes).enumerate() {
        match outcome.expect("no group failed") {
            Cas::Applied(next) => {
                assert_eq!(n % 2, 0, "{}: a stale write applied", saga.biz_id);
                assert_eq!((next.status, next.version), (Status::WmsRequested, 2));
                assert!(next.lease.until_ms > next.updated_at_ms, "the write renewed the lease");
            }
            Cas::Conflict => assert_eq!(n % 2, 1, "{}: a current write conflicted", saga.biz_id),
        }
        // Every saga was written exactly once: its arrival row plus the two edges of one write.
        let log = store.transitions(&saga.biz_id).await.expect("log");
        assert_eq!(log.len(), 3, "{}: {log:?}", saga.biz_id);
        let row = store.get(&saga.biz_id).await.expect("read").expect("row");
        assert_eq!((row.status, row.version), (Status::WmsRequested, 2));
        assert!(store.order_row(&saga.biz_id).await.expect("read").is_some(), "business row written once");
    }
    let after = store.stats();
    assert_eq!(after.transitions - before.transitions, (SAGAS / 2) as u64, "only the current writes applied");
    assert!(after.batches > before.batches, "the writes went through group transactions");
}
both_engines!(group_members_keep_their_own_cas, members_keep_their_own_cas);

async fn whole_groups_apply_or_conflict(db: &TestDb) {
    let store = &db.store;
    // Leases that expire at once, so another owner can take half of the sagas over.
    let sagas = arrivals_leased(store, "W", 0).await;
    let (fenced, current) = sagas.split_at(SAGAS / 2);
    for saga in fenced {
        let claimed = store.claim(&saga.biz_id, "r1", LEASE_MS, "recovery:r1").await.expect("claim");
        assert!(claimed.is_applied(), "{}: taken over", saga.biz_id);
    }
    let before = store.stats();
    // The first owner's writes to the sagas taken over, even naming the version the takeover
    // wrote: every one is fenced by the new epoch.
    let zombies: Vec<Saga> = fenced.iter().map(|saga| Saga { version: saga.version + 1, ..saga.clone() }).collect();
    let outcomes = futures::future::join_all(zombies.iter().map(|saga| first_write(store, saga))).await;
    for (saga, outcome) in fenced.iter().zip(outcomes) {
        assert_eq!(outcome.expect("no group failed"), Cas::Conflict, "{}: a fenced write applied", saga.biz_id);
        let row = store.get(&saga.biz_id).await.expect("read").expect("row");
        assert_eq!((row.status, row.version, row.lease.epoch), (Status::Received, 1, 2), "{}", saga.biz_id);
        assert_eq!(store.transitions(&saga.biz_id).await.expect("log").len(), 2, "arrival and takeover only");
        assert!(store.order_row(&saga.biz_id).await.expect("read").is_none(), "no business row");
    }
    // The others are still the first owner's: every write applies, each with its own values.
    let outcomes = futures::future::join_all(current.iter().map(|saga| first_write(store, saga))).await;
    for (saga, outcome) in current.iter().zip(outcomes) {
        let Cas::Applied(next) = outcome.expect("no group failed") else {
            panic!("{}: a current write conflicted", saga.biz_id)
        };
        let row = store.get(&saga.biz_id).await.expect("read").expect("row");
        assert_eq!(row.biz_id, saga.biz_id);
        assert_eq!((row.status, row.version, row.lease.epoch), (Status::WmsRequested, 2, 1), "{}", saga.biz_id);
        assert_eq!(row.wms_request_id, next.wms_request_id, "{}: its own request id", saga.biz_id);
        assert!(row.wms_request_id.is_some());
        assert_eq!(store.transitions(&saga.biz_id).await.expect("log").len(), 3, "{}", saga.biz_id);
        assert!(store.order_row(&saga.biz_id).await.expect("read").is_some(), "business row written");
    }
    let after = store.stats();
    assert_eq!(after.transitions - before.transitions, (SAGAS / 2) as u64, "only the owner's writes applied");
}
both_engines!(group_whole_groups_apply_or_conflict, whole_groups_apply_or_conflict);

async fn failed_group_fails_every_member(db: &TestDb) {
    let store = &db.store;
    let sagas = arrivals(store, "F").await;
    // Without the log table every group's transaction fails after its compare-and-sets ran.
    let rename = |from: &str, to: &str| format!("ALTER TABLE {from} RENAME TO {to}");
    store.connection().execute_unprepared(&rename("saga_transition", "saga_transition_away")).await.expect("rename");
    let outcomes = futures::future::join_all(sagas.iter().map(|saga| first_write(store, saga))).await;
    store
        .connection()
        .execute_unprepared(&rename("saga_transition_away", "saga_transition"))
        .await
        .expect("rename back");
    for (saga, outcome) in sagas.iter().zip(outcomes) {
        let error = outcome.expect_err("a member of a failed group gets an error, not an outcome");
        assert!(error.to_string().contains(&saga.biz_id), "the error names the member: {error}");
        let row = store.get(&saga.biz_id).await.expect("read").expect("row");
        assert_eq!((row.status, row.version), (Status::Received, 0), "{}: rolled back", saga.biz_id);
        assert!(store.order_row(&saga.biz_id).await.expect("read").is_none(), "no business row survived");
    }
    // The same writes succeed once the database is whole again.
    for saga in &sagas {
        assert!(first_write(store, saga).await.expect("write").is_applied(), "{}", saga.biz_id);
    }
}
both_engines!(group_failure_fails_every_member, failed_group_fails_every_member);
