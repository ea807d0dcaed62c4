//! Group commit: transitions of many sagas sharing one transaction keep every promise a
//! transition of its own makes. Each body runs on SQLite and on MySQL/MariaDB; the test
//! databases group transitions (the default), and the writes below are sent at once so they
//! share groups. Outcomes are asserted per saga, so they hold however the groups formed.

use midflight_model::{Observation, Plan, Rules, Saga, Source, Status, plan};
use midflight_store::testing::{TestDb, drive_to_done, order_event, until};
use midflight_store::{Arrival, Cas, Store, both_engines};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, Statement, TransactionTrait};

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

async fn each_saga_gets_its_own_rows(db: &TestDb) {
    let store = &db.store;
    let sagas = arrivals(store, "R").await;
    let before = store.stats();
    // All at once, so the business rows, shipments and outbox rows of many sagas share groups
    // (and their multi-row statements, padded to powers of two).
    let done = futures::future::join_all(
        sagas.iter().cloned().map(|saga| drive_to_done(store, saga, "consumer:c1", LEASE_MS)),
    )
    .await;
    let after = store.stats();
    assert_eq!(after.transitions - before.transitions, 3 * SAGAS as u64);
    assert!(after.batches - before.batches < 3 * SAGAS as u64, "some transitions shared a group");
    for saga in &done {
        let row = store.get(&saga.biz_id).await.expect("read").expect("row");
        assert_eq!((row.status, row.version), (Status::Done, 6), "{}", saga.biz_id);
        let versions: Vec<u64> =
            store.transitions(&saga.biz_id).await.expect("log").iter().map(|t| t.version).collect();
        assert_eq!(versions, (0..=6).collect::<Vec<u64>>(), "{}: one log row per version", saga.biz_id);
        let order = store.order_row(&saga.biz_id).await.expect("read").expect("business row");
        assert_eq!(order.status, "SHIPPED", "{}", saga.biz_id);
        assert_eq!(order.tracking_no, Some(format!("TRK-{}", saga.biz_id)), "its own tracking number");
    }
    let outbox = store.outbox_rows().await.expect("outbox");
    let mut ids: Vec<&str> = outbox.iter().map(|(biz_id, _)| biz_id.as_str()).collect();
    let mut expected: Vec<&str> = done.iter().map(|saga| saga.biz_id.as_str()).collect();
    ids.sort_unstable();
    expected.sort_unstable();
    assert_eq!(ids, expected, "one outbox row per saga");
    let claimed = store.claim_outbox("relay", SAGAS as u64, LEASE_MS).await.expect("claim");
    assert_eq!(claimed.len(), SAGAS);
    for message in claimed {
        assert!(message.payload.contains(&format!("\"tracking_no\":\"TRK-{}\"", message.biz_id)), "{message:?}");
    }
}
both_engines!(group_each_saga_gets_its_own_rows, each_saga_gets_its_own_rows);

/// Drives `sagas` to DONE through `store`, all at once (so their rows share groups).
async fn all_to_done(store: &Store, sagas: Vec<Saga>) -> Vec<String> {
    let done =
        futures::future::join_all(sagas.into_iter().map(|saga| drive_to_done(store, saga, "consumer:c1", LEASE_MS)))
            .await;
    done.into_iter().map(|saga| saga.biz_id).collect()
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort_unstable();
    ids
}

async fn rows_written_claimed_go_to_their_relay(db: &TestDb) {
    let unclaimed = &db.store;
    for (owner, claim_ms) in [("relay-a", 0), ("", LEASE_MS)] {
        let refused = unclaimed.with_outbox_claim(owner, claim_ms).expect_err("refused");
        assert!(matches!(refused, midflight_store::Error::Invalid(_)), "{owner:?}, {claim_ms}: {refused}");
    }
    let store = &unclaimed.with_outbox_claim("relay-a", LEASE_MS).expect("a claimant");

    // Both handles at once, so their transitions share groups (the test store groups them):
    // each row gets the claim of the handle that wrote it.
    let (claimed_sagas, unclaimed_sagas) = (arrivals(store, "H").await, arrivals(unclaimed, "U").await);
    let (mut ids, plain) =
        futures::future::join(all_to_done(store, claimed_sagas), all_to_done(unclaimed, unclaimed_sagas)).await;
    let taken = store.claim_outbox("relay-b", 2 * SAGAS as u64, LEASE_MS).await.expect("claim");
    assert_eq!(sorted(taken.into_iter().map(|m| m.biz_id).collect()), sorted(plain), "only the unclaimed rows");
    assert!(store.read_claimed_outbox("relay-b", &ids, 0).await.expect("read").is_empty(), "not relay-b's to read");
    ids.push("H-never-written".to_owned());
    let rows = store.read_claimed_outbox("relay-a", &ids, 0).await.expect("read");
    ids.pop();
    // Written with 60 s of claim: a read asking for more leaves them out, until they are extended.
    assert!(
        store.read_claimed_outbox("relay-a", &ids, 2 * LEASE_MS).await.expect("read").is_empty(),
        "too little left"
    );
    assert_eq!(store.extend_outbox_claims("relay-b", &ids, 5 * LEASE_MS).await.expect("extend"), 0, "not relay-b's");
    assert_eq!(store.extend_outbox_claims("relay-a", &ids, 5 * LEASE_MS).await.expect("extend"), SAGAS as u64);
    let extended = store.read_claimed_outbox("relay-a", &ids, 2 * LEASE_MS).await.expect("read");
    assert_eq!(extended.len(), SAGAS, "extended claims have the time left");
    assert_eq!(sorted(rows.iter().map(|m| m.biz_id.clone()).collect()), sorted(ids.clone()), "each row once");
    for message in &rows {
        assert!(message.payload.contains(&format!("\"tracking_no\":\"TRK-{}\"", message.biz_id)), "{message:?}");
    }
    let (published, rest) = ids.split_at(SAGAS / 4);
    assert_eq!(store.mark_published("relay-a", published).await.expect("mark"), published.len() as u64);
    let left = store.read_claimed_outbox("relay-a", &ids, 0).await.expect("read");
    assert_eq!(left.len(), rest.len(), "published rows are left out");

    // Released, the rest are any relay's at once; a claim another relay holds is not released.
    assert_eq!(store.release_outbox("relay-a", &ids).await.expect("release"), rest.len() as u64);
    let taken = store.claim_outbox("relay-b", SAGAS as u64, LEASE_MS).await.expect("claim");
    assert_eq!(sorted(taken.into_iter().map(|m| m.biz_id).collect()), sorted(rest.to_vec()));
    assert_eq!(store.release_outbox("relay-a", &ids).await.expect("release"), 0);
    assert!(store.read_claimed_outbox("relay-a", &ids, 0).await.expect("read").is_empty());

    // A claim written with the row runs out like any other: then a scan takes the row.
    let short = unclaimed.with_outbox_claim("relay-gone", 1).expect("a claimant");
    let lapsed = sorted(all_to_done(&short, arrivals(&short, "S").await).await);
    let taken = std::sync::Mutex::new(Vec::new());
    until("the rows' 1 ms claims to run out and relay-b to take them", || async {
        let claimed = store.claim_outbox("relay-b", SAGAS as u64, LEASE_MS).await.expect("claim");
        let mut taken = taken.lock().expect("taken");
        taken.extend(claimed.into_iter().map(|m| m.biz_id));
        taken.len() >= SAGAS
    })
    .await;
    assert_eq!(sorted(taken.into_inner().expect("taken")), lapsed);
    assert_eq!(store.outbox_pending().await.expect("pending"), (rest.len() + 2 * SAGAS) as u64, "none published");
}
both_engines!(group_rows_written_claimed_go_to_their_relay, rows_written_claimed_go_to_their_relay);

/// A store of `db` whose groups wait `linger_ms` for more transitions to join.
async fn lingering(db: &TestDb, linger_ms: u64) -> Store {
    let section = midflight_config::DatabaseSection {
        url: db.url.clone(),
        max_connections: 8,
        group_commit_linger_ms: linger_ms,
        ..midflight_config::DatabaseSection::default()
    };
    Store::connect(&section).await.expect("connect")
}

async fn linger_holds_a_group_open(db: &TestDb) {
    let linger = std::time::Duration::from_millis(100);
    let store = lingering(db, linger.as_millis() as u64).await;
    let sagas = arrivals(&store, "L").await;
    let before = store.stats();
    let started = std::time::Instant::now();
    assert!(first_write(&store, &sagas[0]).await.expect("write").is_applied());
    assert!(started.elapsed() >= linger, "a write alone waited out the linger: {:?}", started.elapsed());
    assert_eq!(store.stats().batches - before.batches, 1, "in one group transaction");
    // Sagas written side by side with a linger still each get their own rows.
    let done = futures::future::join_all(
        sagas.iter().skip(1).cloned().map(|saga| drive_to_done(&store, saga, "consumer:c1", LEASE_MS)),
    )
    .await;
    for saga in &done {
        let versions: Vec<u64> =
            store.transitions(&saga.biz_id).await.expect("log").iter().map(|t| t.version).collect();
        assert_eq!(versions, (0..=6).collect::<Vec<u64>>(), "{}: one log row per version", saga.biz_id);
    }
    let after = store.stats();
    assert_eq!(after.transitions - before.transitions, 1 + 3 * (SAGAS as u64 - 1));
}
both_engines!(group_linger_holds_a_group_open, linger_holds_a_group_open);

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

/// One member's statement refused by the database (here a trigger refusing one saga's row)
/// fails that member only: the refused group is written again one member at a time. The
/// writes share one group (a linger gathers them).
async fn one_refused_member_fails_alone(db: &TestDb) {
    let store = lingering(db, 100).await;
    let sagas = arrivals(&store, "R").await;
    let refused = sagas[7].biz_id.clone();
    let trigger = match store.connection().get_database_backend() {
        DbBackend::MySql => format!(
            "CREATE TRIGGER refuse_one BEFORE UPDATE ON saga FOR EACH ROW BEGIN \
             IF NEW.biz_id = '{refused}' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by a test trigger'; \
             END IF; END"
        ),
        _ => format!(
            "CREATE TRIGGER refuse_one BEFORE UPDATE ON saga WHEN NEW.biz_id = '{refused}' \
             BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END"
        ),
    };
    store.connection().execute_unprepared(&trigger).await.expect("trigger");
    let before = store.stats();
    let outcomes = futures::future::join_all(sagas.iter().map(|saga| first_write(&store, saga))).await;
    store.connection().execute_unprepared("DROP TRIGGER refuse_one").await.expect("drop trigger");
    for (saga, outcome) in sagas.iter().zip(outcomes) {
        if saga.biz_id == refused {
            let error = outcome.expect_err("the refused member fails");
            assert!(error.to_string().contains("refused by a test trigger"), "{error}");
        } else {
            assert!(outcome.expect("written").is_applied(), "{}", saga.biz_id);
        }
    }
    assert_eq!(store.stats().transitions - before.transitions, SAGAS as u64 - 1);
}
both_engines!(group_member_refused_alone, one_refused_member_fails_alone);

/// A transaction that holds `biz_id`'s business-row key (an uncommitted row of its own) and,
/// on MySQL, enough undo that InnoDB never picks it as a deadlock's victim.
async fn rival(store: &Store, biz_id: &str) -> DatabaseTransaction {
    let rival = store.connection().begin().await.expect("begin the rival");
    if store.backend() == DbBackend::MySql {
        let rows: Vec<String> = (0..2_000).map(|n| format!("({n})")).collect();
        rival.execute_unprepared(&format!("INSERT INTO weight (n) VALUES {}", rows.join(","))).await.expect("weight");
    }
    let insert = "INSERT INTO orders (biz_id, order_no, event_type, status, amount_cents, tracking_no, \
                  created_at_ms, updated_at_ms) VALUES (?, 'rival', 'PAID', 'FULFILLING', 0, NULL, 0, 0)";
    rival
        .execute_raw(Statement::from_sql_and_values(store.backend(), insert, [biz_id.into()]))
        .await
        .expect("the rival's business row");
    rival
}

async fn rolled_back_group_is_retried(db: &TestDb) {
    let store = &db.store;
    let saga = arrivals(store, "D").await.swap_remove(0);
    if store.backend() == DbBackend::MySql {
        store.connection().execute_unprepared("CREATE TABLE weight (n INT PRIMARY KEY)").await.expect("weight table");
    }
    let before = store.stats();
    let rival = rival(store, &saga.biz_id).await;
    let write = tokio::spawn({
        let (store, saga) = (store.clone(), saga.clone());
        async move { first_write(&store, &saga).await }
    });
    if store.backend() == DbBackend::MySql {
        // The group holds the saga row and waits for the rival's business row; the rival now
        // asks for the saga row: a deadlock, and the lighter group is rolled back.
        let waiting = "SELECT COUNT(*) AS n FROM information_schema.processlist \
                       WHERE db = DATABASE() AND info LIKE 'INSERT INTO orders%'";
        until("the group to wait for the rival's row", || async {
            let row = store.connection().query_one_raw(Statement::from_string(DbBackend::MySql, waiting)).await;
            row.expect("processlist").expect("a count").try_get::<i64>("", "n").expect("n") > 0
        })
        .await;
        let lock = Statement::from_sql_and_values(
            DbBackend::MySql,
            "SELECT biz_id FROM saga WHERE biz_id = ? FOR UPDATE",
            [saga.biz_id.as_str().into()],
        );
        rival.query_one_raw(lock).await.expect("the rival wins the deadlock").expect("the saga row");
    }
    // On SQLite the rival holds the one write lock: the group gives up after the busy timeout.
    let retried = || store.stats().retried > before.retried;
    until("the group to be rolled back and tried again", || async { retried() || write.is_finished() }).await;
    if !retried() {
        panic!("the group ended without being tried again: {:?}", write.await.expect("write task"));
    }
    rival.rollback().await.expect("the rival rolls back");
    let written = write.await.expect("write task").expect("the retried group commits");
    assert!(written.is_applied(), "the current write applied on its retry: {written:?}");
    let row = store.get(&saga.biz_id).await.expect("read").expect("row");
    assert_eq!((row.status, row.version), (Status::WmsRequested, 2));
    assert_eq!(store.transitions(&saga.biz_id).await.expect("log").len(), 3, "written once");
    let order = store.order_row(&saga.biz_id).await.expect("read").expect("business row");
    assert_ne!(order.order_no, "rival", "the business row is the saga's own");
    let after = store.stats();
    assert_eq!(after.transitions - before.transitions, 1);
}
both_engines!(group_rolled_back_by_the_database_is_retried, rolled_back_group_is_retried);
