//! Store behaviour, each body run on SQLite and on MySQL/MariaDB (see `both_engines!`).

use std::sync::Arc;

use midflight_model::{
    Address, Change, Line, Observation, OrderEvent, Plan, Rules, Saga, Source, Status, Step, TicketDraft, WmsAnswer,
    plan,
};
use midflight_store::testing::{Engine, TestDb, run_sql_from_drop, until};
use midflight_store::{Arrival, Cas, Error, Store, TicketState, both_engines};
use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};

const LEASE_MS: i64 = 60_000;

fn event(order_no: &str, event_type: &str) -> OrderEvent {
    OrderEvent {
        order_no: order_no.into(),
        event_type: event_type.into(),
        lines: vec![Line { sku: "SKU-0001".into(), quantity: 1 }],
        address: Address {
            region: "CN-SH".into(),
            city: "上海".into(),
            line: String::new(),
            postal_code: String::new(),
        },
        amount_cents: 500,
    }
}

async fn received(store: &Store, order_no: &str, offset: i64) -> Saga {
    let now = store.now_ms().await.expect("clock");
    let source = Source { topic: "orders".into(), partition: 0, offset };
    Saga::received(&event(order_no, "PAID"), source, now, now + 600_000)
}

/// Inserts one saga leased to `owner` for `lease_ms` and returns it (fresh).
async fn arrive(store: &Store, saga: Saga, owner: &str, lease_ms: i64) -> Saga {
    let arrivals = store.insert_arrivals(&[saga], owner, lease_ms, owner).await.expect("insert");
    match arrivals.into_iter().next() {
        Some(Arrival::Fresh(saga)) => saga,
        other => panic!("expected a fresh arrival, got {other:?}"),
    }
}

/// Applies the planner's write for `observation`, expecting it to apply.
async fn step(store: &Store, saga: &Saga, observation: Observation) -> Saga {
    let now = store.now_ms().await.expect("clock");
    let Plan::Write { change, .. } = plan(saga, &observation, now, &Rules::default()) else {
        panic!("expected a write for {} in {}", observation.label(), saga.status)
    };
    match store.write(saga, &change, now, LEASE_MS, "test").await.expect("write") {
        Cas::Applied(next) => next,
        Cas::Conflict => panic!("unexpected conflict writing {}", saga.biz_id),
    }
}

async fn migrations_are_idempotent(db: &TestDb) {
    db.store.migrate().await.expect("second migrate is a no-op");
    db.store.now_ms().await.expect("clock after migrate");
}
both_engines!(migrations_apply_twice, migrations_are_idempotent);

async fn inbox_is_idempotent(db: &TestDb) {
    let store = &db.store;
    let a = received(store, "O-1", 1).await;
    let b = received(store, "O-2", 2).await;
    let batch = vec![a.clone(), b.clone(), a.clone()];
    let first = store.insert_arrivals(&batch, "c1", LEASE_MS, "consumer:c1").await.expect("insert");
    let kinds: Vec<bool> = first.iter().map(|x| matches!(x, Arrival::Fresh(_))).collect();
    assert_eq!(kinds, vec![true, true, false], "a duplicate inside one batch is not fresh twice");
    let fresh = first[0].saga().expect("readable");
    assert_eq!((fresh.status, fresh.version, fresh.lease.epoch), (Status::Received, 0, 1));
    assert_eq!(fresh.lease.owner_id.as_deref(), Some("c1"));
    assert_eq!(fresh.order().expect("payload round-trips").address.city, "上海");

    let again =
        store.insert_arrivals(std::slice::from_ref(&a), "c2", LEASE_MS, "consumer:c2").await.expect("re-insert");
    match &again[0] {
        Arrival::Existing(saga) => assert_eq!(saga.lease.owner_id.as_deref(), Some("c1"), "redelivery changes nothing"),
        other => panic!("redelivery must find the existing row, got {other:?}"),
    }
    let log = store.transitions(&a.biz_id).await.expect("log");
    assert_eq!(log.len(), 1, "one arrival row: {log:?}");
    assert_eq!((log[0].from, log[0].to, log[0].version), (None, Status::Received, 0));
}
both_engines!(inbox_insert_is_idempotent, inbox_is_idempotent);

async fn inbox_batch_with_repeats_and_padding(db: &TestDb) {
    let store = &db.store;
    // 100 rows, padded to 128 with repeats of the last one (itself a repeat of the first); a
    // row that existed before and the repeats are each told apart from the fresh ones.
    let earlier = arrive(store, received(store, "B-earlier", 1_000).await, "c0", LEASE_MS).await;
    let mut batch = Vec::new();
    for n in 0..98 {
        batch.push(received(store, &format!("B-{n:03}"), n).await);
    }
    batch.push(earlier.clone());
    batch.push(batch[0].clone());
    let arrivals = store.insert_arrivals(&batch, "c1", LEASE_MS, "consumer:c1").await.expect("insert");
    assert_eq!(arrivals.len(), 100);
    for (n, (sent, arrival)) in batch.iter().zip(&arrivals).enumerate() {
        assert_eq!(arrival.saga().expect("readable").biz_id, sent.biz_id, "in input order");
        assert_eq!(matches!(arrival, Arrival::Fresh(_)), n < 98, "{n}: {arrival:?}");
    }
    assert_eq!(
        arrivals[98].saga().expect("readable").lease.owner_id.as_deref(),
        Some("c0"),
        "the earlier row is untouched"
    );
    for sent in &batch[..98] {
        let log = store.transitions(&sent.biz_id).await.expect("log");
        assert_eq!(log.len(), 1, "{}: one arrival row", sent.biz_id);
    }
}
both_engines!(inbox_batch_is_classified_per_row, inbox_batch_with_repeats_and_padding);

async fn poison_is_parked_unleased(db: &TestDb) {
    let store = &db.store;
    let now = store.now_ms().await.expect("clock");
    let source = Source { topic: "orders".into(), partition: 1, offset: 9 };
    let error = OrderEvent::parse(b"{oops").expect_err("poison");
    let parked = Saga::parked(source, "{oops".into(), &error, now);
    let arrivals = store.insert_arrivals(&[parked], "c1", LEASE_MS, "consumer:c1").await.expect("insert");
    let saga = arrivals[0].saga().expect("readable");
    assert!(matches!(arrivals[0], Arrival::Existing(_)), "a parked row is nobody's to drive");
    assert_eq!(saga.status, Status::Parked);
    assert_eq!(saga.biz_id, "parked:orders:1:9");
    assert!(saga.last_error.as_deref().is_some_and(|e| e.contains("not a valid order event")), "{saga:?}");
    assert!(store.abandoned(10).await.expect("scan").is_empty(), "parked rows are terminal");
}
both_engines!(poison_rows_are_parked, poison_is_parked_unleased);

async fn cas_applies_once_and_logs(db: &TestDb) {
    let store = &db.store;
    let saga = arrive(store, received(store, "O-1", 1).await, "c1", LEASE_MS).await;
    let requested = step(store, &saga, Observation::Nothing).await;
    assert_eq!((requested.status, requested.version), (Status::WmsRequested, 2));
    assert!(requested.wms_request_id.is_some() && requested.wms_voucher.is_some());
    let order = store.order_row(&saga.biz_id).await.expect("read").expect("business row written with the intent");
    assert_eq!(order.status, "FULFILLING");

    // The same write again names version 0, which is gone: nothing is written twice.
    let now = store.now_ms().await.expect("clock");
    let Plan::Write { change, .. } = plan(&saga, &Observation::Nothing, now, &Rules::default()) else { panic!() };
    assert_eq!(store.write(&saga, &change, now, LEASE_MS, "test").await.expect("write"), Cas::Conflict);

    let log = store.transitions(&saga.biz_id).await.expect("log");
    let edges: Vec<_> = log.iter().map(|t| (t.from, t.to, t.version, t.lease_epoch)).collect();
    assert_eq!(
        edges,
        vec![
            (None, Status::Received, 0, 1),
            (Some(Status::Received), Status::DbWritten, 1, 1),
            (Some(Status::DbWritten), Status::WmsRequested, 2, 1),
        ]
    );
}
both_engines!(transition_is_compare_and_set, cas_applies_once_and_logs);

async fn fused_writes_are_atomic_with_status(db: &TestDb) {
    let store = &db.store;
    let saga = arrive(store, received(store, "O-1", 1).await, "c1", LEASE_MS).await;
    let saga = step(store, &saga, Observation::Nothing).await;
    let saga = step(store, &saga, Observation::Wms(WmsAnswer::Locked)).await;
    assert_eq!(saga.status, Status::LogisticsRequested);
    assert!(saga.wms_locked_at_ms.is_some() && saga.logistics_request_id.is_some());
    let done = step(
        store,
        &saga,
        Observation::Logistics(midflight_model::LogisticsAnswer::Created { tracking_no: "TRK42".into() }),
    )
    .await;
    assert_eq!((done.status, done.tracking_no.as_deref()), (Status::Done, Some("TRK42")));
    let order = store.order_row(&saga.biz_id).await.expect("read").expect("row");
    assert_eq!((order.status.as_str(), order.tracking_no.as_deref()), ("SHIPPED", Some("TRK42")));
    assert_eq!(store.outbox_rows().await.expect("outbox"), vec![(saga.biz_id.clone(), false)]);

    // A rollback reverses the business row in the same transaction.
    let other = arrive(store, received(store, "O-2", 2).await, "c1", LEASE_MS).await;
    let other = step(store, &other, Observation::Nothing).await;
    let rolled = step(store, &other, Observation::Wms(WmsAnswer::Rejected { reason: "out of stock".into() })).await;
    assert_eq!(rolled.status, Status::RolledBack);
    assert_eq!(store.order_row(&other.biz_id).await.expect("read").expect("row").status, "REVERSED");
}
both_engines!(fused_writes, fused_writes_are_atomic_with_status);

async fn exactly_one_of_32_claims_wins(db: &TestDb) {
    // A lease of 0 ms is expired at once: the row is abandoned from the start.
    let saga = arrive(&db.store, received(&db.store, "O-1", 1).await, "c0", 0).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let mut tasks = Vec::new();
    for n in 0..32 {
        let store = if n % 2 == 0 { db.store.clone() } else { db.another_store().await };
        let (barrier, biz_id) = (barrier.clone(), saga.biz_id.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.claim(&biz_id, &format!("w{n}"), LEASE_MS, &format!("recovery:w{n}")).await.expect("claim")
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        if let Cas::Applied(saga) = task.await.expect("join") {
            winners.push(saga);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claim wins: {winners:?}");
    assert_eq!((winners[0].lease.epoch, winners[0].version), (2, 1));
    let takeovers: Vec<_> =
        db.store.transitions(&saga.biz_id).await.expect("log").into_iter().filter(|t| t.is_takeover()).collect();
    assert_eq!(takeovers.len(), 1);
}
both_engines!(claim_race, exactly_one_of_32_claims_wins);

async fn stale_epoch_is_fenced(db: &TestDb) {
    let store = &db.store;
    let zombie = arrive(store, received(store, "O-1", 1).await, "c1", 0).await;
    let winner =
        store.claim(&zombie.biz_id, "r1", LEASE_MS, "recovery:r1").await.expect("claim").applied().expect("claimed");
    assert_eq!(winner.lease.epoch, 2);

    let now = store.now_ms().await.expect("clock");
    let Plan::Write { change, .. } = plan(&zombie, &Observation::Nothing, now, &Rules::default()) else { panic!() };
    assert_eq!(store.write(&zombie, &change, now, LEASE_MS, "consumer:c1").await.expect("write"), Cas::Conflict);
    assert_eq!(store.renew(&zombie, LEASE_MS).await.expect("renew"), Cas::Conflict);
    assert_eq!(store.release(&zombie).await.expect("release"), Cas::Conflict);
    // Even a zombie that re-read the version but kept its old epoch is refused.
    let mut reread = zombie.clone();
    reread.version = winner.version;
    assert_eq!(store.renew(&reread, LEASE_MS).await.expect("renew"), Cas::Conflict);
    // The holder of the current epoch is not disturbed.
    let renewed = store.renew(&winner, LEASE_MS).await.expect("renew").applied().expect("holder renews");
    assert_eq!(renewed.version, winner.version + 1);
    assert_eq!(store.get(&zombie.biz_id).await.expect("get").expect("row").status, Status::Received);
}
both_engines!(stale_epoch_conflicts, stale_epoch_is_fenced);

async fn live_lease_refuses_takeover(db: &TestDb) {
    let store = &db.store;
    let saga = arrive(store, received(store, "O-1", 1).await, "c1", LEASE_MS).await;
    assert_eq!(store.claim(&saga.biz_id, "r1", LEASE_MS, "recovery:r1").await.expect("claim"), Cas::Conflict);
    // Released, it can be claimed.
    store.release(&saga).await.expect("release").applied().expect("holder releases");
    assert!(store.claim(&saga.biz_id, "r1", LEASE_MS, "recovery:r1").await.expect("claim").is_applied());
}
both_engines!(takeover_refused_while_lease_live, live_lease_refuses_takeover);

async fn skewed_worker_clock_cannot_take_over(db: &TestDb) {
    let store = &db.store;
    let saga = arrive(store, received(store, "O-1", 1).await, "c1", LEASE_MS).await;
    // A worker whose own clock runs an hour ahead believes the lease is long gone...
    let skewed_now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis()
        as i64
        + 3_600_000;
    assert!(!saga.lease_live(skewed_now), "by the skewed clock the lease looks expired");
    // ...but the claim compares against the database clock, which says it is live.
    assert_eq!(store.claim(&saga.biz_id, "skewed", LEASE_MS, "recovery:skewed").await.expect("claim"), Cas::Conflict);
    let db_now = store.now_ms().await.expect("clock");
    assert!(saga.lease_live(db_now), "by the database clock the lease is live");
    assert!(store.abandoned(10).await.expect("scan").is_empty(), "and the recovery scan does not offer it");
}
both_engines!(database_clock_decides_leases, skewed_worker_clock_cannot_take_over);

async fn bad_rows_are_typed_errors(db: &TestDb) {
    let store = &db.store;
    let saga = arrive(store, received(store, "O-1", 1).await, "c1", 0).await;
    // An impossible transition asked of the store names the saga and writes nothing.
    let error = store
        .write(&saga, &Change::to(&[Status::Done], "skip"), 0, LEASE_MS, "test")
        .await
        .expect_err("illegal transition");
    assert!(matches!(error, Error::Model(midflight_model::Error::IllegalTransition { .. })), "{error:?}");
    assert!(error.to_string().contains("O-1:PAID"), "{error}");
    // An unknown status string in the table (written by something else) is a typed error.
    db.store
        .connection()
        .execute_unprepared("UPDATE saga SET status = 'PROCESSING' WHERE biz_id = 'O-1:PAID'")
        .await
        .expect("corrupt the row");
    let error = store.get(&saga.biz_id).await.expect_err("unknown status");
    assert_eq!(error.to_string(), "saga O-1:PAID: unknown status \"PROCESSING\" in the table");
    let error = store.page("", 10).await.expect_err("listing sees it too");
    assert!(error.to_string().contains("O-1:PAID"), "{error}");
}
both_engines!(bad_input_is_a_typed_error, bad_rows_are_typed_errors);

async fn abandoned_scan_finds_only_abandoned(db: &TestDb) {
    let store = &db.store;
    let live = arrive(store, received(store, "O-1", 1).await, "c1", LEASE_MS).await;
    let expired = arrive(store, received(store, "O-2", 2).await, "c1", 0).await;
    let backing_off = arrive(store, received(store, "O-3", 3).await, "c1", LEASE_MS).await;
    let backing_off = step(store, &backing_off, Observation::Nothing).await;
    let now = store.now_ms().await.expect("clock");
    let unreachable = Observation::Unreachable { step: Step::Wms, error: "timeout".into() };
    let Plan::Write { change, .. } = plan(&backing_off, &unreachable, now, &Rules::default()) else { panic!() };
    let backing_off =
        store.write(&backing_off, &change, now, LEASE_MS, "test").await.expect("write").applied().expect("applied");
    assert!(backing_off.next_attempt_at_ms > now && backing_off.attempts == 1);
    let finished = arrive(store, received(store, "O-4", 4).await, "c1", LEASE_MS).await;
    let finished = step(store, &finished, Observation::Nothing).await;
    step(store, &finished, Observation::Wms(WmsAnswer::Rejected { reason: "none left".into() })).await;

    let found: Vec<String> = store.abandoned(10).await.expect("scan").into_iter().map(|s| s.biz_id).collect();
    assert_eq!(found, vec![expired.biz_id.clone()], "live {} / backing off / terminal are left alone", live.biz_id);
    assert_eq!(
        store.claim(&backing_off.biz_id, "r1", LEASE_MS, "r").await.expect("claim"),
        Cas::Conflict,
        "backoff respected"
    );
}
both_engines!(abandoned_scan, abandoned_scan_finds_only_abandoned);

async fn earlier_unfinished_saga_of_the_order_blocks(db: &TestDb) {
    let store = &db.store;
    let now = store.now_ms().await.expect("clock");
    let first = Saga::received(
        &event("O-7", "PAID"),
        Source { topic: "orders".into(), partition: 0, offset: 10 },
        now,
        now + 600_000,
    );
    let second = Saga::received(
        &event("O-7", "SHIPPED"),
        Source { topic: "orders".into(), partition: 0, offset: 11 },
        now,
        now + 600_000,
    );
    let arrivals = store.insert_arrivals(&[first, second], "c1", LEASE_MS, "c1").await.expect("insert");
    let (first, second) =
        (arrivals[0].saga().expect("readable").clone(), arrivals[1].saga().expect("readable").clone());
    assert_eq!(store.earlier_unfinished(&second).await.expect("check"), Some(first.biz_id.clone()));
    assert_eq!(store.earlier_unfinished(&first).await.expect("check"), None);
    // The batch form answers the same for both at once (another order's saga is never blocked).
    let other = arrive(store, received(store, "O-8", 12).await, "c1", LEASE_MS).await;
    let blocked = store.maybe_blocked(&[&first, &second, &other]).await.expect("batch check");
    assert_eq!(blocked, std::collections::HashSet::from([second.biz_id.clone()]));
    let first = step(store, &first, Observation::Nothing).await;
    step(store, &first, Observation::Wms(WmsAnswer::Rejected { reason: "none".into() })).await;
    assert_eq!(
        store.earlier_unfinished(&second).await.expect("check"),
        None,
        "a terminal predecessor no longer blocks"
    );
    assert!(store.maybe_blocked(&[&second]).await.expect("batch check").is_empty());
}
both_engines!(per_order_check, earlier_unfinished_saga_of_the_order_blocks);

/// The planner's first write for a fresh saga, as the consumer asks for it before the inbox write.
fn first_change(saga: &Saga, now: i64) -> Change {
    match plan(saga, &Observation::Nothing, now, &Rules::default()) {
        Plan::Write { change, then: Some(_) } => change,
        other => panic!("a fresh saga opens with a write and a call, not {other:?}"),
    }
}

async fn receive_opens_fresh_rows_nothing_holds_back(db: &TestDb) {
    let store = &db.store;
    let now = store.now_ms().await.expect("clock");
    // O-2 has an unfinished saga already; O-3's first saga is redelivered below.
    let earlier = arrive(store, received(store, "O-2", 1).await, "c0", LEASE_MS).await;
    let redelivered = arrive(store, received(store, "O-3", 2).await, "c0", LEASE_MS).await;
    let mut later = received(store, "O-2", 3).await;
    later.biz_id = "O-2:SHIPPED".into();
    let opened = received(store, "O-1", 4).await;
    let mut same_order = received(store, "O-1", 5).await;
    same_order.biz_id = "O-1:SHIPPED".into();
    let unnamed = received(store, "O-4", 6).await;
    let batch = vec![later.clone(), redelivered.clone(), opened.clone(), same_order.clone(), unnamed.clone()];
    let openings: std::collections::HashMap<String, Change> = [&later, &redelivered, &opened, &same_order]
        .into_iter()
        .map(|saga| (saga.biz_id.clone(), first_change(saga, now)))
        .collect();
    let before = store.stats();
    let received = store.receive(&batch, "c1", LEASE_MS, "consumer:c1", now, &openings).await.expect("receive");
    let after = store.stats();
    assert_eq!(after.write_txns - before.write_txns, 1, "one transaction for the batch and its openings");
    assert_eq!(after.transitions - before.transitions, 1);
    assert_eq!(received.opened, std::collections::HashSet::from([opened.biz_id.clone()]));
    assert_eq!(
        received.maybe_blocked,
        std::collections::HashSet::from([later.biz_id.clone(), same_order.biz_id.clone()]),
        "held back by an unfinished saga of the order, committed before or in the same batch"
    );
    let statuses: Vec<(bool, Status, u64)> = received
        .arrivals
        .iter()
        .map(|a| {
            (matches!(a, Arrival::Fresh(_)), a.saga().expect("readable").status, a.saga().expect("readable").version)
        })
        .collect();
    assert_eq!(
        statuses,
        [
            (true, Status::Received, 0),
            (false, Status::Received, 0),
            (true, Status::WmsRequested, 2),
            (true, Status::Received, 0),
            (true, Status::Received, 0),
        ]
    );
    // A retry after a commit whose answer was lost: the same call again finds what it wrote and
    // reports the opened row opened again, writing nothing more for it.
    let again = store.receive(&batch, "c1", LEASE_MS, "consumer:c1", now, &openings).await.expect("retry");
    let retried = store.stats();
    assert_eq!(again.opened, received.opened);
    assert_eq!(again.maybe_blocked, received.maybe_blocked);
    let again_statuses: Vec<(bool, Status, u64)> = again
        .arrivals
        .iter()
        .map(|a| {
            (matches!(a, Arrival::Fresh(_)), a.saga().expect("readable").status, a.saga().expect("readable").version)
        })
        .collect();
    assert_eq!(again_statuses, statuses);
    assert_eq!(retried.transitions, after.transitions, "nothing opened twice");
    // Another owner, or another clock reading, is not that retry: the row is someone's work.
    let other = store.receive(&batch, "c2", LEASE_MS, "consumer:c2", now, &openings).await.expect("other owner");
    assert!(other.opened.is_empty() && matches!(other.arrivals[2], Arrival::Existing(_)));
    let later_call = store.receive(&batch, "c1", LEASE_MS, "consumer:c1", now + 1, &openings).await.expect("later");
    assert!(later_call.opened.is_empty() && matches!(later_call.arrivals[2], Arrival::Existing(_)));
    // The opened row is as a write of its own would have left it: leased to c1, in the table,
    // with its log rows and its business row.
    let row = received.arrivals[2].saga().expect("readable");
    let mut stored = store.get(&opened.biz_id).await.expect("get").expect("row");
    assert!(stored.lease.until_ms > stored.updated_at_ms, "still leased");
    // As after any write, the lease's end is the caller's estimate; the table has the database's.
    stored.lease.until_ms = row.lease.until_ms;
    assert_eq!(&stored, row);
    assert_eq!(row.lease.owner_id.as_deref(), Some("c1"));
    assert!(row.wms_request_id.is_some(), "the intent names its request id");
    let log: Vec<(u64, Status)> =
        store.transitions(&opened.biz_id).await.expect("log").iter().map(|t| (t.version, t.to)).collect();
    assert_eq!(log, [(0, Status::Received), (1, Status::DbWritten), (2, Status::WmsRequested)]);
    assert!(store.order_row(&opened.biz_id).await.expect("order row").is_some(), "business row written");
    for other in [&later, &same_order, &unnamed] {
        assert!(store.order_row(&other.biz_id).await.expect("order row").is_none(), "{} not opened", other.biz_id);
    }
    // The holder drives on from the opened row as from any write of its own.
    let done = step(store, row, Observation::Wms(WmsAnswer::Locked)).await;
    assert_eq!(done.status, Status::LogisticsRequested);
    assert_eq!(store.get(&earlier.biz_id).await.expect("get").map(|s| s.status), Some(Status::Received));
}
both_engines!(receive_opens, receive_opens_fresh_rows_nothing_holds_back);

/// A batch of orders `prefix`-1, -2, -4 and -5 and a poison message: -2 has an earlier
/// unfinished saga (inserted here), -1 is twice in the batch; every row of an order but -4's
/// is named for opening. Six rows, so the batch's statements are padded to eight.
async fn opening_batch(
    store: &Store,
    prefix: &str,
    now: i64,
) -> (Vec<Saga>, std::collections::HashMap<String, Change>) {
    arrive(store, received(store, &format!("{prefix}-2"), 1).await, "c0", LEASE_MS).await;
    let mut later = received(store, &format!("{prefix}-2"), 3).await;
    later.biz_id = format!("{prefix}-2:SHIPPED");
    let opened = received(store, &format!("{prefix}-1"), 4).await;
    let mut same_order = received(store, &format!("{prefix}-1"), 5).await;
    same_order.biz_id = format!("{prefix}-1:SHIPPED");
    let unnamed = received(store, &format!("{prefix}-4"), 6).await;
    let error = OrderEvent::parse(b"{oops").expect_err("poison");
    let source = Source { topic: "orders".into(), partition: 0, offset: 7 };
    let mut parked = Saga::parked(source, "{oops".into(), &error, now);
    parked.biz_id = format!("{prefix}-parked");
    let also_opened = received(store, &format!("{prefix}-5"), 8).await;
    let openings = [&later, &opened, &same_order, &also_opened]
        .into_iter()
        .map(|saga| (saga.biz_id.clone(), first_change(saga, now)))
        .collect();
    (vec![later, opened, same_order, unnamed, parked, also_opened], openings)
}

/// The parts of a row that do not depend on its order number or on when its message was made
/// (each `received` reads the clock), with the order number's `prefix` written as `P`.
fn comparable(saga: &Saga, prefix: &str) -> String {
    let mut saga = saga.clone();
    saga.created_at_ms = 0;
    saga.deadline_ms = 0;
    saga.lease.until_ms = 0;
    if matches!(saga.status, Status::Received | Status::Parked) {
        saga.updated_at_ms = 0;
    }
    // The WMS request id and voucher are digests of the biz_id.
    let derived = |value: &mut Option<String>, expected: String| {
        if value.as_ref() == Some(&expected) {
            *value = Some("derived from the biz_id".to_owned());
        }
    };
    derived(&mut saga.wms_request_id, midflight_model::request_id(&saga.biz_id, Step::Wms));
    derived(&mut saga.wms_voucher, midflight_model::voucher(&saga.biz_id, Step::Wms));
    format!("{saga:?}").replace(&format!("{prefix}-"), "P-")
}

async fn receive_opens_on_insert_as_the_general_path_does(db: &TestDb) {
    let store = &db.store;
    let now = store.now_ms().await.expect("clock");
    let (fresh_batch, fresh_openings) = opening_batch(store, "A", now).await;
    let (mut general_batch, general_openings) = opening_batch(store, "B", now).await;
    // One row of the second batch is in the table already: that batch takes the general path.
    let redelivered = arrive(store, received(store, "B-9", 2).await, "c0", LEASE_MS).await;
    general_batch.insert(1, redelivered);

    let before = store.stats();
    let fresh = store.receive(&fresh_batch, "c1", LEASE_MS, "consumer:c1", now, &fresh_openings).await.expect("fresh");
    let after = store.stats();
    let general =
        store.receive(&general_batch, "c1", LEASE_MS, "consumer:c1", now, &general_openings).await.expect("general");
    let after_general = store.stats();
    let on_insert = u64::from(db.engine == midflight_store::testing::Engine::MySql);
    assert_eq!(
        after.opened_on_insert - before.opened_on_insert,
        2 * on_insert,
        "MySQL opens a new batch's rows on insert"
    );
    assert_eq!(
        after_general.opened_on_insert, after.opened_on_insert,
        "a batch with a redelivery takes the general path"
    );
    for (stats, earlier) in [(after, before), (after_general, after)] {
        assert_eq!(stats.write_txns - earlier.write_txns, 1, "one transaction for the batch and its openings");
        assert_eq!(stats.transitions - earlier.transitions, 2, "two rows opened");
    }

    let opened =
        |prefix: &str| std::collections::HashSet::from([format!("{prefix}-1:PAID"), format!("{prefix}-5:PAID")]);
    assert_eq!(fresh.opened, opened("A"));
    assert_eq!(general.opened, opened("B"));
    let held =
        |prefix: &str| std::collections::HashSet::from([format!("{prefix}-2:SHIPPED"), format!("{prefix}-1:SHIPPED")]);
    assert_eq!(fresh.maybe_blocked, held("A"), "held back by a saga committed before or one earlier in the batch");
    assert_eq!(general.maybe_blocked, held("B"));
    let mut general_arrivals = general.arrivals.clone();
    assert!(matches!(general_arrivals.remove(1), Arrival::Existing(_)), "the redelivered row is someone's work");
    let shape = |arrivals: &[Arrival], prefix: &str| -> Vec<(bool, String)> {
        arrivals
            .iter()
            .map(|a| (matches!(a, Arrival::Fresh(_)), comparable(a.saga().expect("readable"), prefix)))
            .collect()
    };
    assert_eq!(shape(&fresh.arrivals, "A"), shape(&general_arrivals, "B"), "the same arrivals either way");
    assert_eq!(fresh.arrivals[1].saga().expect("readable").status, Status::WmsRequested);
    assert!(matches!(fresh.arrivals[4], Arrival::Existing(_)), "a parked row is nobody's to drive");
    for (arrivals, index) in
        [(&fresh.arrivals, 1), (&fresh.arrivals, 5), (&general_arrivals, 1), (&general_arrivals, 5)]
    {
        let saga = arrivals[index].saga().expect("readable");
        assert_eq!(saga.lease.until_ms, saga.updated_at_ms + LEASE_MS, "{}: held for the lease asked", saga.biz_id);
    }

    // The table holds the same rows, log rows and business rows either way.
    for suffix in ["-1:PAID", "-1:SHIPPED", "-2:SHIPPED", "-4:PAID", "-5:PAID", "-parked"] {
        let (a, b) = (format!("A{suffix}"), format!("B{suffix}"));
        let row_a = store.get(&a).await.expect("get").expect("row");
        let row_b = store.get(&b).await.expect("get").expect("row");
        assert_eq!(comparable(&row_a, "A"), comparable(&row_b, "B"), "{suffix}");
        for row in [&row_a, &row_b] {
            // The table's lease end is the database clock at the insert plus the lease asked.
            let held_ms = row.lease.until_ms - row.updated_at_ms;
            match row.status {
                Status::Received | Status::WmsRequested => {
                    assert!((LEASE_MS - 5_000..=LEASE_MS + 5_000).contains(&held_ms), "{}: {held_ms}", row.biz_id);
                }
                _ => assert_eq!(row.lease.until_ms, 0, "{}: not leased", row.biz_id),
            }
        }
        let business = |row: Option<midflight_store::OrderRow>| row.map(|r| (r.status, r.tracking_no));
        let business_a = business(store.order_row(&a).await.expect("order row"));
        assert_eq!(business_a, business(store.order_row(&b).await.expect("order row")), "{suffix}");
        assert_eq!(business_a.is_some(), row_a.status == Status::WmsRequested, "{suffix}: business row only if opened");
        let log =
            |entries: Vec<midflight_store::Transition>| -> Vec<(u64, Option<Status>, Status, u64, String, String)> {
                entries.into_iter().map(|t| (t.version, t.from, t.to, t.lease_epoch, t.actor, t.reason)).collect()
            };
        let log_a = log(store.transitions(&a).await.expect("log"));
        assert_eq!(log_a, log(store.transitions(&b).await.expect("log")), "{suffix}");
        assert!(!log_a.is_empty());
    }

    // A retry after a commit whose answer was lost finds the rows and writes nothing more.
    let again = store.receive(&fresh_batch, "c1", LEASE_MS, "consumer:c1", now, &fresh_openings).await.expect("retry");
    let retried = store.stats();
    assert_eq!(again.opened, fresh.opened);
    assert_eq!(again.maybe_blocked, fresh.maybe_blocked);
    assert_eq!(shape(&again.arrivals, "A"), shape(&fresh.arrivals, "A"));
    assert_eq!(
        (retried.transitions, retried.opened_on_insert),
        (after_general.transitions, after_general.opened_on_insert)
    );
    // The holder drives on from the row opened on insert as from any write of its own.
    for index in [1, 5] {
        let next =
            step(store, fresh.arrivals[index].saga().expect("readable"), Observation::Wms(WmsAnswer::Locked)).await;
        assert_eq!(next.status, Status::LogisticsRequested);
    }
}
both_engines!(receive_opens_on_insert, receive_opens_on_insert_as_the_general_path_does);

/// Another consumer's inbox transaction inserts one of a batch's rows while this one is under
/// way (two consumers handed the same message around a rebalance). On MySQL the batch's
/// transaction has already looked for its rows and found none, and its insert waits for the
/// rival's uncommitted row; once the rival commits, the row-opening insert must give way: the
/// row stays the rival's, unopened and not fresh here, and the batch's other row is opened as
/// usual. On SQLite, which never takes that path, the batch may or may not wait for the rival's
/// write lock; only the outcome is checked.
///
/// On MariaDB the scenario runs with `innodb_snapshot_isolation` off in the batch's sessions
/// (the read-back finds the row missing and gives way), then on (the default from MariaDB
/// 11.6.2: the insert fails with error 1020 instead, and the retry finds the row and takes the
/// general path). A server without the setting runs the first only, on the test's own store.
async fn receive_gives_way_to_a_row_inserted_meanwhile(db: &TestDb) {
    if db.engine != Engine::MySql {
        gives_way(db, &db.store, "R").await;
        return;
    }
    let off = snapshot_isolated(db, false).await;
    let store = off.as_ref().unwrap_or(&db.store);
    let before = store.stats();
    gives_way(db, store, "R").await;
    let after = store.stats();
    assert_eq!(after.gave_way - before.gave_way, 1, "the read-back found the rival's row");
    assert_eq!(after.retried, before.retried, "nothing failed on the way");
    if off.is_none() {
        eprintln!("note: this server has no innodb_snapshot_isolation; skipping the run with it on");
        return;
    }
    let on = snapshot_isolated(db, true).await.expect("the setting exists");
    let before = on.stats();
    gives_way(db, &on, "S").await;
    let after = on.stats();
    assert!(after.retried > before.retried, "the insert failed with 1020 and was tried again");
    assert_eq!(after.gave_way, before.gave_way, "the retry found the row before inserting");
}
both_engines!(receive_gives_way, receive_gives_way_to_a_row_inserted_meanwhile);

/// A store on `db` whose sessions have MariaDB's `innodb_snapshot_isolation` set to `on`;
/// `None` on a server without the setting (MySQL error 1193, unknown system variable).
async fn snapshot_isolated(db: &TestDb, on: bool) -> Option<Store> {
    use sea_orm::sqlx::Executor;
    let known = Statement::from_string(DbBackend::MySql, "SELECT @@innodb_snapshot_isolation AS v");
    if let Err(error) = db.store.connection().query_one_raw(known).await {
        assert!(error.to_string().contains("1193"), "reading innodb_snapshot_isolation: {error}");
        return None;
    }
    let set =
        if on { "SET SESSION innodb_snapshot_isolation = ON" } else { "SET SESSION innodb_snapshot_isolation = OFF" };
    let pool = sea_orm::sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(4)
        .after_connect(move |conn, _| Box::pin(async move { conn.execute(set).await.map(|_| ()) }))
        .connect(&db.url)
        .await
        .expect("connect with the setting");
    let store = Store::from_connection(sea_orm::SqlxMySqlConnector::from_sqlx_mysql_pool(pool)).await.expect("store");
    let read = Statement::from_string(DbBackend::MySql, "SELECT @@session.innodb_snapshot_isolation AS v");
    let row = store.connection().query_one_raw(read).await.expect("read the setting").expect("a row");
    assert_eq!(row.try_get::<i64>("", "v").expect("v"), i64::from(on), "the store's sessions have the setting");
    Some(store)
}

/// The scenario of [`receive_gives_way_to_a_row_inserted_meanwhile`] with `store` as the batch's
/// consumer, on orders named `prefix`-0, -1 and -2.
async fn gives_way(db: &TestDb, store: &Store, prefix: &str) {
    let rival_store = db.another_store().await;
    let now = store.now_ms().await.expect("clock");
    let contested = received(store, &format!("{prefix}-1"), 1).await;
    let other = received(store, &format!("{prefix}-2"), 2).await;
    // The rival's rows are copies of a row it inserted earlier, with the contested biz_id.
    let template = arrive(&rival_store, received(store, &format!("{prefix}-0"), 0).await, "c2", LEASE_MS).await;
    let rival = rival_store.connection().begin().await.expect("begin the rival");
    let backend = store.backend();
    for (table, copy) in [("saga", "rival_saga"), ("saga_transition", "rival_log")] {
        let create = format!("CREATE TEMPORARY TABLE {copy} AS SELECT * FROM {table} WHERE biz_id = ?");
        let rename = format!("UPDATE {copy} SET biz_id = ?");
        for (sql, id) in [(create, &template.biz_id), (rename, &contested.biz_id)] {
            rival.execute_raw(Statement::from_sql_and_values(backend, sql, [id.as_str().into()])).await.expect("copy");
        }
    }
    let order = "UPDATE rival_saga SET order_no = ?, src_offset = ?";
    let values = [contested.order_no.as_str().into(), contested.source.offset.into()];
    rival.execute_raw(Statement::from_sql_and_values(backend, order, values)).await.expect("the rival's order");
    rival.execute_unprepared("INSERT INTO saga SELECT * FROM rival_saga").await.expect("the rival's row");
    rival.execute_unprepared("INSERT INTO saga_transition SELECT * FROM rival_log").await.expect("its arrival");

    let batch = vec![contested.clone(), other.clone()];
    let openings: std::collections::HashMap<String, Change> =
        batch.iter().map(|saga| (saga.biz_id.clone(), first_change(saga, now))).collect();
    let before = store.stats();
    let receive = tokio::spawn({
        let (store, batch, openings) = (store.clone(), batch.clone(), openings.clone());
        async move { store.receive(&batch, "c1", LEASE_MS, "consumer:c1", now, &openings).await }
    });
    if backend == DbBackend::MySql {
        let waiting = "SELECT COUNT(*) AS n FROM information_schema.processlist \
                       WHERE db = DATABASE() AND info LIKE 'INSERT INTO saga (%'";
        until("the batch's insert to wait for the rival's row", || async {
            let row = store.connection().query_one_raw(Statement::from_string(backend, waiting)).await;
            row.expect("processlist").expect("a count").try_get::<i64>("", "n").expect("n") > 0
        })
        .await;
    }
    rival.commit().await.expect("the rival commits");
    let received = receive.await.expect("receive task").expect("the batch is received");
    let after = store.stats();

    match &received.arrivals[0] {
        Arrival::Existing(row) => {
            assert_eq!((row.status, row.version), (Status::Received, 0), "the rival's row, untouched");
            assert_eq!(row.lease.owner_id.as_deref(), Some("c2"));
        }
        fresh => panic!("the rival's row must not be this consumer's to drive: {fresh:?}"),
    }
    assert!(matches!(&received.arrivals[1], Arrival::Fresh(row) if row.status == Status::WmsRequested));
    assert_eq!(received.opened, std::collections::HashSet::from([other.biz_id.clone()]));
    assert_eq!(after.write_txns - before.write_txns, 1, "one commit");
    assert_eq!(after.transitions - before.transitions, 1, "only the other row opened");
    assert_eq!(after.opened_on_insert, before.opened_on_insert, "the row-opening insert gave way");
    let row = store.get(&contested.biz_id).await.expect("get").expect("row");
    assert_eq!((row.status, row.version, row.lease.owner_id.as_deref()), (Status::Received, 0, Some("c2")));
    let log: Vec<(u64, String)> =
        store.transitions(&contested.biz_id).await.expect("log").into_iter().map(|t| (t.version, t.actor)).collect();
    assert_eq!(log, [(0, "c2".to_owned())], "the rival's arrival only");
    assert!(store.order_row(&contested.biz_id).await.expect("order row").is_none(), "not opened by anyone");
    assert_eq!(store.get(&other.biz_id).await.expect("get").map(|s| s.status), Some(Status::WmsRequested));
}

async fn tickets_are_one_per_step_and_carry_evidence(db: &TestDb) {
    let store = &db.store;
    let saga = arrive(store, received(store, "O-1", 1).await, "c1", LEASE_MS).await;
    let saga = step(store, &saga, Observation::Nothing).await;
    let saga = step(store, &saga, Observation::Wms(WmsAnswer::Locked)).await;
    let saga =
        step(store, &saga, Observation::Logistics(midflight_model::LogisticsAnswer::Rejected { reason: "XX".into() }))
            .await;
    assert_eq!(saga.status, Status::WmsReversing);
    let irreversible = Observation::Wms(WmsAnswer::Irreversible { reason: "window passed".into() });
    let review = step(store, &saga, irreversible.clone()).await;
    assert_eq!(review.status, Status::ManualReview);
    let tickets = store.tickets(Some(TicketState::Open), 10).await.expect("tickets");
    assert_eq!(tickets.len(), 1);
    let ticket = &tickets[0];
    assert_eq!((ticket.biz_id.as_str(), ticket.step.as_str()), (saga.biz_id.as_str(), "WMS"));
    assert_eq!(ticket.evidence["voucher"], serde_json::json!(saga.wms_voucher));
    assert_eq!(ticket.evidence["saga"]["status"], "MANUAL_REVIEW");
    assert!(ticket.evidence["transitions"].as_array().is_some_and(|log| log.len() >= 5), "{}", ticket.evidence);
    assert!(ticket.evidence["answer"].as_str().is_some_and(|a| a.contains("window passed")));

    // The operator sends it back to be retried; it fails the same way: the same ticket reopens.
    let retried = store
        .resolve(&saga.biz_id, review.version, Status::WmsReversing, None, "alice", "retry")
        .await
        .expect("resolve");
    let retried = retried.applied().expect("resolved");
    assert_eq!(store.tickets(Some(TicketState::Open), 10).await.expect("tickets").len(), 0);
    let retried =
        store.claim(&retried.biz_id, "r1", LEASE_MS, "recovery:r1").await.expect("claim").applied().expect("claimable");
    step(store, &retried, irreversible).await;
    let all = store.tickets_of(&saga.biz_id).await.expect("tickets");
    assert_eq!(all.len(), 1, "one ticket per (biz_id, step): {all:?}");
    assert_eq!(all[0].state, TicketState::Open);
    let log = store.transitions(&saga.biz_id).await.expect("log");
    assert!(log.iter().any(|t| t.actor == "operator:alice"), "the operator's action is in the log");
}
both_engines!(manual_tickets, tickets_are_one_per_step_and_carry_evidence);

async fn operator_is_refused_if_the_row_changed(db: &TestDb) {
    let store = &db.store;
    let saga = arrive(store, received(store, "O-1", 1).await, "c1", LEASE_MS).await;
    let saga = step(store, &saga, Observation::Nothing).await;
    // Not in MANUAL_REVIEW: operators cannot move it.
    let error =
        store.resolve(&saga.biz_id, saga.version, Status::Done, None, "bob", "done").await.expect_err("not reviewable");
    assert!(matches!(error, Error::Model(_)), "{error:?}");
    let now = store.now_ms().await.expect("clock");
    let change = Change {
        ticket: Some(TicketDraft { step: Step::Wms, reason: "look".into(), evidence: "none".into() }),
        ..Change::to(&[Status::ManualReview], "test")
    };
    let review = store.write(&saga, &change, now, LEASE_MS, "test").await.expect("write").applied().expect("applied");
    assert_eq!(
        store.resolve(&saga.biz_id, review.version - 1, Status::Done, None, "bob", "x").await.expect("resolve"),
        Cas::Conflict
    );
    let done = store
        .resolve(&saga.biz_id, review.version, Status::RolledBack, None, "bob", "reversed by hand")
        .await
        .expect("resolve");
    assert_eq!(done.applied().map(|s| s.status), Some(Status::RolledBack));
}
both_engines!(operator_resolution, operator_is_refused_if_the_row_changed);

/// An operator's close writes what automation's would: DONE marks the order SHIPPED with the
/// shipment's tracking number and queues the notification; ROLLED_BACK marks the order
/// REVERSED. DONE without a tracking number, or a tracking number with anything else, is
/// refused with nothing written.
async fn operator_closes_like_automation(db: &TestDb) {
    let store = &db.store;
    let shipped = to_review(store, &arrive(store, received(store, "O-1", 1).await, "c1", LEASE_MS).await).await;
    let undone = to_review(store, &arrive(store, received(store, "O-2", 2).await, "c1", LEASE_MS).await).await;
    assert_eq!(store.order_row(&shipped.biz_id).await.expect("read").map(|o| o.status), Some("FULFILLING".into()));
    let refused = [
        (&shipped, Status::Done, None),
        (&shipped, Status::Done, Some(" ")),
        (&shipped, Status::Done, Some(&*"T".repeat(65))),
        (&undone, Status::RolledBack, Some("TRK-2")),
        (&undone, Status::WmsRequested, Some("TRK-2")),
    ];
    for (saga, to, tracking_no) in refused {
        let result = store.resolve(&saga.biz_id, saga.version, to, tracking_no, "bob", "by hand").await;
        assert!(matches!(result, Err(Error::Invalid(_))), "{to} {tracking_no:?}: {result:?}");
        let row = store.get(&saga.biz_id).await.expect("get").expect("row");
        assert_eq!((row.status, row.version), (Status::ManualReview, saga.version), "nothing written");
    }
    assert!(store.outbox_rows().await.expect("outbox").is_empty());

    let done = store.resolve(&shipped.biz_id, shipped.version, Status::Done, Some("TRK-1"), "bob", "shipped by hand");
    let done = done.await.expect("resolve").applied().expect("applied");
    assert_eq!((done.status, done.tracking_no.as_deref()), (Status::Done, Some("TRK-1")));
    let row = store.get(&shipped.biz_id).await.expect("get").expect("row");
    assert_eq!(row.tracking_no.as_deref(), Some("TRK-1"));
    let order = store.order_row(&shipped.biz_id).await.expect("read").expect("order row");
    assert_eq!((order.status.as_str(), order.tracking_no.as_deref()), ("SHIPPED", Some("TRK-1")));
    let claimed = store.claim_outbox("relay", 10, LEASE_MS).await.expect("claim");
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    let payload: serde_json::Value = serde_json::from_str(&claimed[0].payload).expect("json");
    assert_eq!((payload["biz_id"].as_str(), payload["tracking_no"].as_str()), (Some(&*shipped.biz_id), Some("TRK-1")));

    // A saga with a tracking number from logistics keeps it: another one is refused.
    let tracked = to_review(store, &arrive(store, received(store, "O-3", 3).await, "c1", LEASE_MS).await).await;
    let set = "UPDATE saga SET tracking_no = 'TRK-L' WHERE biz_id = ?";
    let values: Vec<sea_orm::Value> = vec![tracked.biz_id.clone().into()];
    store.connection().execute_raw(Statement::from_sql_and_values(store.backend(), set, values)).await.expect("track");
    let other = store.resolve(&tracked.biz_id, tracked.version, Status::Done, Some("TRK-X"), "bob", "by hand").await;
    assert!(matches!(&other, Err(Error::Invalid(reason)) if reason.contains("TRK-L")), "{other:?}");
    let kept = store.resolve(&tracked.biz_id, tracked.version, Status::Done, Some("TRK-L"), "bob", "by hand").await;
    assert_eq!(kept.expect("resolve").applied().and_then(|s| s.tracking_no), Some("TRK-L".to_owned()));
    let order = store.order_row(&tracked.biz_id).await.expect("read").expect("order row");
    assert_eq!((order.status.as_str(), order.tracking_no.as_deref()), ("SHIPPED", Some("TRK-L")));

    let back = store.resolve(&undone.biz_id, undone.version, Status::RolledBack, None, "bob", "undone by hand").await;
    assert_eq!(back.expect("resolve").applied().map(|s| s.status), Some(Status::RolledBack));
    let order = store.order_row(&undone.biz_id).await.expect("read").expect("order row");
    assert_eq!(order.status, "REVERSED");
    assert_eq!(store.outbox_rows().await.expect("outbox").len(), 2, "no notification for a rolled-back saga");
}
both_engines!(operator_close, operator_closes_like_automation);

/// Takes `saga` (fresh) past its first step into MANUAL_REVIEW with an open WMS ticket.
async fn to_review(store: &Store, saga: &Saga) -> Saga {
    let saga = &step(store, saga, Observation::Nothing).await;
    let now = store.now_ms().await.expect("clock");
    let change = Change {
        ticket: Some(TicketDraft { step: Step::Wms, reason: "look".into(), evidence: "none".into() }),
        ..Change::to(&[Status::ManualReview], "test")
    };
    store.write(saga, &change, now, LEASE_MS, "test").await.expect("write").applied().expect("applied")
}

/// Resolving a saga closes its review tickets, not a reconciliation finding under the same
/// key: that one waits for a person to close it (and, once closed, is never opened again).
async fn resolve_leaves_findings_open(db: &TestDb) {
    let store = &db.store;
    let review = to_review(store, &arrive(store, received(store, "O-9", 1).await, "c1", LEASE_MS).await).await;
    let finding = midflight_store::FindingTicket {
        key: review.biz_id.clone(),
        step: midflight_store::WMS_LEDGER_STEP,
        reason: "two locks in force".into(),
        fingerprint: "double_effect:L1,L2".into(),
        evidence: serde_json::json!({}),
    };
    let opened = store.open_finding_ticket(&finding, "recovery:r1").await.expect("open finding");
    assert_eq!(opened, midflight_store::TicketOutcome::Opened);
    let closed = store.resolve(&review.biz_id, review.version, Status::RolledBack, None, "bob", "undone by hand").await;
    assert_eq!(closed.expect("resolve").applied().map(|s| s.status), Some(Status::RolledBack));
    let states: Vec<(String, TicketState)> =
        store.tickets_of(&review.biz_id).await.expect("tickets").into_iter().map(|t| (t.step, t.state)).collect();
    assert!(states.contains(&("WMS".to_owned(), TicketState::Resolved)), "{states:?}");
    assert!(states.contains(&(midflight_store::WMS_LEDGER_STEP.to_owned(), TicketState::Open)), "{states:?}");
    let again = store.open_finding_ticket(&finding, "recovery:r1").await.expect("open again");
    assert_eq!(again, midflight_store::TicketOutcome::AlreadyOpen);
}
both_engines!(resolving_a_saga_leaves_its_findings_open, resolve_leaves_findings_open);

/// A review ticket's evidence keeps the latest 200 rows of a long log, ending with the one
/// that sent the saga to a person.
async fn ticket_evidence_keeps_the_latest_log(db: &TestDb) {
    let store = &db.store;
    let saga = arrive(store, received(store, "O-10", 1).await, "c1", LEASE_MS).await;
    // A long history before it: 250 older rows (versions below the saga's own).
    for version in -250..0 {
        midflight_store::testing::execute(
            store,
            &format!(
                "INSERT INTO saga_transition (biz_id, version, from_status, to_status, lease_epoch, actor, reason, at_ms) \
                 VALUES ('{}', {version}, 'WMS_REQUESTED', 'WMS_REQUESTED', 1, 'test', 'old', 0)",
                saga.biz_id
            ),
        )
        .await;
    }
    let review = to_review(store, &saga).await;
    let tickets = store.tickets_of(&review.biz_id).await.expect("tickets");
    let transitions = tickets[0].evidence["transitions"].as_array().expect("transitions").clone();
    assert_eq!(transitions.len(), 200);
    let last = transitions.last().expect("a row");
    assert_eq!(last["to_status"], "MANUAL_REVIEW", "{last}");
    assert_eq!(last["version"].as_i64(), Some(review.version as i64), "{last}");
}
both_engines!(a_review_tickets_evidence_keeps_the_latest_log, ticket_evidence_keeps_the_latest_log);

/// A time zone named in the URL does not reach the session: the database clock reads its time
/// as UTC, and a zone with daylight saving would move it by an hour once a year.
#[tokio::test]
async fn the_mysql_session_runs_in_utc_whatever_the_url_says() {
    let Some(db) = TestDb::fresh(Engine::MySql).await else { return };
    let section = midflight_config::DatabaseSection {
        url: format!("{}{}timezone=%2B05:00", db.url, if db.url.contains('?') { '&' } else { '?' }),
        ..midflight_config::DatabaseSection::default()
    };
    let store = Store::connect(&section).await.expect("connect");
    let zone = Statement::from_string(DbBackend::MySql, "SELECT @@session.time_zone AS zone");
    let row = store.connection().query_one_raw(zone).await.expect("query").expect("a row");
    assert_eq!(row.try_get::<String>("", "zone").expect("zone"), "+00:00");
}

/// A saga waiting out a backoff keeps its lease until its retry time, so the recovery scan's
/// index range leaves it out: on MySQL a page over 300 such sagas and one due reads a few
/// index entries, not all 301 rows (it read them all, at every page, and a backlog after an
/// outage made every scan cost as much as the backlog: 0.5 s a page at 200,000 sagas).
async fn a_backoff_keeps_the_row_out_of_the_scan(db: &TestDb) {
    let store = &db.store;
    let mut waiting = Vec::new();
    for n in 0..300 {
        let saga = arrive(store, received(store, &format!("B-{n}"), n).await, "c1", LEASE_MS).await;
        let now = store.now_ms().await.expect("clock");
        let failure = midflight_model::Failure { error: "wms unreachable".into(), retry_at_ms: now + 600_000 };
        let change = Change { failure: Some(failure), release_lease: true, ..Change::default() };
        let written =
            store.write(&saga, &change, now, LEASE_MS, "test").await.expect("write").applied().expect("applied");
        assert_eq!(written.lease.until_ms, now + 600_000, "leased to nobody until the retry");
        waiting.push(written);
    }
    let stored = store.get(&waiting[0].biz_id).await.expect("get").expect("row");
    assert!(stored.lease.until_ms >= waiting[0].next_attempt_at_ms - 1_000, "{stored:?}");
    let due = arrive(store, received(store, "D-1", 1_000).await, "c1", 0).await;
    let page = store.abandoned_after(None, 200).await.expect("scan");
    assert_eq!(page.sagas.iter().map(|s| s.biz_id.clone()).collect::<Vec<_>>(), vec![due.biz_id.clone()]);
    if db.engine != Engine::MySql {
        return;
    }
    // One connection, so the session's counters are the scan's.
    let section = midflight_config::DatabaseSection { url: db.url.clone(), max_connections: 1, ..Default::default() };
    let single = Store::connect(&section).await.expect("connect");
    single.connection().execute_unprepared("FLUSH STATUS").await.expect("flush");
    let page = single.abandoned_after(None, 200).await.expect("scan");
    assert_eq!(page.sagas.len(), 1);
    // Rows and index entries read, whichever plan the server chose (a range on the index, or
    // the whole table).
    let read = Statement::from_string(DbBackend::MySql, "SHOW SESSION STATUS LIKE 'Handler_read%'");
    let rows = single.connection().query_all_raw(read).await.expect("status");
    let mut read = 0_u64;
    for row in rows {
        let value: String = row.try_get("", "Value").expect("value");
        read += value.parse::<u64>().expect("a number");
    }
    assert!(read < 50, "the scan read {read} rows and index entries");
}
both_engines!(a_saga_waiting_out_a_backoff_is_outside_the_scan, a_backoff_keeps_the_row_out_of_the_scan);

/// A saga of another event of `order_no` at `offset`.
async fn later_event(store: &Store, order_no: &str, event_type: &str, offset: i64) -> Saga {
    let now = store.now_ms().await.expect("clock");
    let source = Source { topic: "orders".into(), partition: 0, offset };
    Saga::received(&event(order_no, event_type), source, now, now + 600_000)
}

async fn send_back_waits_for_no_later_saga(db: &TestDb) {
    let store = &db.store;
    let review = to_review(store, &arrive(store, received(store, "O-1", 1).await, "c1", LEASE_MS).await).await;
    // Neither a parked later saga of the order, nor a later saga of another order or on another
    // partition keeps it from automation.
    let parked = arrive(store, later_event(store, "O-1", "AMENDED", 2).await, "c1", LEASE_MS).await;
    let now = store.now_ms().await.expect("clock");
    let parked = store.write(&parked, &Change::to(&[Status::Parked], "test"), now, LEASE_MS, "test").await;
    assert_eq!(parked.expect("park").applied().map(|s| s.status), Some(Status::Parked));
    arrive(store, received(store, "O-2", 3).await, "c1", LEASE_MS).await;
    let mut elsewhere = later_event(store, "O-1", "CANCELLED", 4).await;
    elsewhere.source.partition = 1;
    arrive(store, elsewhere, "c1", LEASE_MS).await;
    let mut other_topic = later_event(store, "O-1", "REFUNDED", 5).await;
    other_topic.source.topic = "orders-retry".into();
    arrive(store, other_topic, "c1", LEASE_MS).await;
    assert_eq!(store.later_saga_of_order(&review).await.expect("look"), None);
    let back = store.resolve(&review.biz_id, review.version, Status::WmsRequested, None, "bob", "ask again").await;
    assert_eq!(back.expect("resolve").applied().map(|s| s.status), Some(Status::WmsRequested));

    // A later saga of its order is in the table: it may have run, so the earlier one stays with
    // the operator, untouched, until closed by hand.
    let review = to_review(store, &arrive(store, received(store, "O-3", 10).await, "c1", LEASE_MS).await).await;
    let later = arrive(store, later_event(store, "O-3", "AMENDED", 11).await, "c1", LEASE_MS).await;
    let expected = Some((later.biz_id.clone(), "RECEIVED".to_owned()));
    assert_eq!(store.later_saga_of_order(&review).await.expect("look"), expected);
    let log_before = store.transitions(&review.biz_id).await.expect("log").len();
    for to in [Status::WmsRequested, Status::LogisticsRequested, Status::WmsReversing, Status::LogisticsCancelling] {
        let refused = store.resolve(&review.biz_id, review.version, to, None, "bob", "ask again").await;
        match refused {
            Err(Error::LaterSagaOfOrder { biz_id, later: named, later_status }) => {
                assert_eq!(
                    (biz_id.as_str(), named.as_str(), later_status.as_str()),
                    (review.biz_id.as_str(), later.biz_id.as_str(), "RECEIVED")
                );
            }
            other => panic!("send-back to {to} beside a later saga: {other:?}"),
        }
    }
    let row = store.get(&review.biz_id).await.expect("get").expect("row");
    assert_eq!((row.status, row.version), (Status::ManualReview, review.version), "nothing written");
    assert_eq!(store.transitions(&review.biz_id).await.expect("log").len(), log_before);
    assert_eq!(store.tickets_of(&review.biz_id).await.expect("tickets")[0].state, TicketState::Open);
    let closed = store.resolve(&review.biz_id, review.version, Status::RolledBack, None, "bob", "undone by hand").await;
    assert_eq!(closed.expect("resolve").applied().map(|s| s.status), Some(Status::RolledBack));
    assert_eq!(store.tickets_of(&review.biz_id).await.expect("tickets")[0].state, TicketState::Resolved);
}
both_engines!(operator_send_back_keeps_order, send_back_waits_for_no_later_saga);

async fn outbox_claims_do_not_overlap(db: &TestDb) {
    let store = &db.store;
    for n in 0..5 {
        let saga = arrive(store, received(store, &format!("O-{n}"), n).await, "c1", LEASE_MS).await;
        let saga = step(store, &saga, Observation::Nothing).await;
        let saga = step(store, &saga, Observation::Wms(WmsAnswer::Locked)).await;
        step(
            store,
            &saga,
            Observation::Logistics(midflight_model::LogisticsAnswer::Created { tracking_no: format!("T{n}") }),
        )
        .await;
    }
    let a = store.claim_outbox("relay-a", 3, 60_000).await.expect("claim");
    // b's claims run out at once: as a relay that died, or whose delivery outlived its claim.
    let b = store.claim_outbox("relay-b", 10, 1).await.expect("claim");
    assert_eq!((a.len(), b.len()), (3, 2));
    assert!(a.iter().all(|m| b.iter().all(|n| n.biz_id != m.biz_id)), "claims are disjoint");
    let payload: serde_json::Value = serde_json::from_str(&a[0].payload).expect("json");
    assert_eq!(payload["kind"], "ORDER_SHIPPED");
    let ids: Vec<String> = a.iter().map(|m| m.biz_id.clone()).collect();
    assert_eq!(store.mark_published("relay-b", &ids).await.expect("mark"), 0, "only the claimant marks");
    assert_eq!(store.mark_published("relay-a", &ids).await.expect("mark"), 3);
    assert_eq!(store.outbox_pending().await.expect("pending"), 2);

    // A claim that ran out is taken by another relay, which publishes the rows again (at
    // least once); the first relay's late mark is refused, so the rows are marked once, by
    // the relay that holds them.
    let taken = std::sync::Mutex::new(Vec::new());
    until("the short claims to run out and another relay to take the rows", || async {
        let claimed = store.claim_outbox("relay-c", 10, 60_000).await.expect("claim");
        let mut taken = taken.lock().expect("taken");
        taken.extend(claimed);
        taken.len() == 2
    })
    .await;
    let b_ids: Vec<String> = b.iter().map(|m| m.biz_id.clone()).collect();
    assert_eq!(
        store.mark_published("relay-b", &b_ids).await.expect("mark"),
        0,
        "a claim another relay took over marks nothing"
    );
    assert_eq!(store.mark_published("relay-c", &b_ids).await.expect("mark"), 2);
    assert_eq!(store.outbox_pending().await.expect("pending"), 0);
}
both_engines!(outbox_relay_claims, outbox_claims_do_not_overlap);

/// Order numbers are compared byte for byte on both engines: AB-1 and ab-1 are two orders,
/// each with its saga, log, business row and outbox row (on MySQL's default collation they were
/// one key, and the second order's inbox batch failed at every try).
async fn case_differs(db: &TestDb) {
    let store = &db.store;
    let (upper, lower) = (received(store, "AB-1", 1).await, received(store, "ab-1", 2).await);
    let arrivals = store.insert_arrivals(&[upper.clone(), lower.clone()], "c1", LEASE_MS, "c1").await.expect("insert");
    let fresh: Vec<Saga> = arrivals
        .into_iter()
        .map(|arrival| match arrival {
            Arrival::Fresh(saga) => saga,
            other => panic!("expected two fresh arrivals, got {other:?}"),
        })
        .collect();
    let ids: Vec<&str> = fresh.iter().map(|saga| saga.biz_id.as_str()).collect();
    assert_eq!(ids, ["AB-1:PAID", "ab-1:PAID"]);
    for saga in [&upper, &lower] {
        let row = store.get(&saga.biz_id).await.expect("get").expect("row");
        assert_eq!((row.biz_id.as_str(), row.order_no.as_str()), (saga.biz_id.as_str(), saga.order_no.as_str()));
        assert_eq!(store.transitions(&saga.biz_id).await.expect("log").len(), 1, "{}: its own arrival", saga.biz_id);
    }
    // The business row and the intent of one are not the other's.
    let requested = step(store, &fresh[1], Observation::Nothing).await;
    assert_eq!(requested.status, Status::WmsRequested);
    assert!(store.order_row(&lower.biz_id).await.expect("read").is_some());
    assert!(store.order_row(&upper.biz_id).await.expect("read").is_none());
    assert_eq!(store.get(&upper.biz_id).await.expect("get").expect("row").status, Status::Received);
}
both_engines!(order_numbers_differing_in_case_are_two_orders, case_differs);

#[test]
fn migration_comments_hold_no_semicolons() {
    for (name, sql) in midflight_store::migration_files() {
        for (number, line) in sql.lines().enumerate() {
            if let Some((_, comment)) = line.split_once("--") {
                assert!(!comment.contains(';'), "{name}:{}: ';' in a comment would split the statement", number + 1);
            }
        }
        assert!(!midflight_store::migration_statements(sql).is_empty(), "{name} has statements");
    }
}

/// A pool hands the server back the connections a burst opened once they have been idle for
/// `database.idle_timeout_ms`, so another process can open its own (the driver alone would
/// keep them for 10 minutes).
async fn idle_connections_are_closed(db: &TestDb) {
    let section = midflight_config::DatabaseSection {
        url: db.url.clone(),
        max_connections: 8,
        idle_timeout_ms: 1_000,
        group_commit_max: 1,
        ..midflight_config::DatabaseSection::default()
    };
    let store = Store::connect(&section).await.expect("connect");
    let pool_size = || match db.engine {
        Engine::Sqlite => store.connection().get_sqlite_connection_pool().size(),
        Engine::MySql => store.connection().get_mysql_connection_pool().size(),
    };
    let burst: Vec<_> = futures::future::join_all((0..4).map(|_| store.connection().begin()))
        .await
        .into_iter()
        .map(|txn| txn.expect("begin"))
        .collect();
    assert!(pool_size() >= 4, "four transactions at once hold four connections, the pool has {}", pool_size());
    for txn in burst {
        txn.rollback().await.expect("rollback");
    }
    until("the pool to close the burst's idle connections", || async { pool_size() <= 1 }).await;
    store.now_ms().await.expect("the pool still serves");
}
both_engines!(idle_connections_go_back_to_the_server, idle_connections_are_closed);

/// `url` with its user and password replaced.
fn as_user(url: &str, user: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let host_and_path = rest.split_once('@').map_or(rest, |(_, after)| after);
    format!("{scheme}://{user}:{password}@{host_and_path}")
}

/// A transaction on the one connection `store`'s pool has opened. The pool takes a connection
/// back a moment after its last user is done with it; beginning before that would ask the
/// server for a second one.
async fn hold_the_one_connection(store: &Store) -> sea_orm::DatabaseTransaction {
    let pool = store.connection().get_mysql_connection_pool();
    until("the pool to take its connection back", || async { pool.num_idle() == 1 }).await;
    assert_eq!(pool.size(), 1, "the pool has one connection");
    store.connection().begin().await.expect("begin on the pool's idle connection")
}

/// A server that is full refuses a new connection (MySQL 1040, or 1226 when the account's own
/// `MAX_USER_CONNECTIONS` is reached, which is how this test fills it without touching the
/// shared server's limit). Nothing of the operation has run then, and the store asks again
/// until `database.acquire_timeout_ms` has passed, instead of failing the operation at once:
/// a drive goes on when a connection comes free. Past the timeout, the server's error is the
/// operation's. MySQL only: SQLite has no server to refuse a connection. The test's account
/// must be allowed to create accounts (the tests' `root` is).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_server_is_waited_out_then_named() {
    let Some(db) = TestDb::fresh(Engine::MySql).await else { return };
    let database = db.url.rsplit('/').next().expect("a database name").split('?').next().expect("name").to_owned();
    let user = format!("{database}_cap");
    let root = db.store.connection();
    let _dropped = DropUser { url: db.url.clone(), user: user.clone() };
    for sql in [
        format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'capped' WITH MAX_USER_CONNECTIONS 2"),
        format!("GRANT ALL ON {database}.* TO '{user}'@'%'"),
    ] {
        root.execute_unprepared(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let url = as_user(&db.url, &user, "capped");
    let connect = |acquire_timeout_ms| {
        let section = midflight_config::DatabaseSection {
            url: url.clone(),
            max_connections: 4,
            acquire_timeout_ms,
            group_commit_max: 1,
            ..midflight_config::DatabaseSection::default()
        };
        async move { Store::connect(&section).await.expect("connect as the capped account") }
    };
    let saga = received(&db.store, "O-full", 1).await;
    let count_sql = format!("SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE USER = '{user}'");
    let connections_of_the_account = || async {
        let row = root.query_one_raw(Statement::from_string(DbBackend::MySql, count_sql.clone())).await;
        row.expect("processlist").expect("a count").try_get::<i64>("", "n").expect("n")
    };

    // The account's two connections: another process's, and the store's one, held by a
    // transaction. (The other connects first: a store that is connecting may open a second
    // connection for a moment, when its first has not yet been taken back by the pool.)
    // Anything more the store does needs a third, which the server refuses.
    let other = sea_orm::Database::connect(url.as_str()).await.expect("the other process connects");
    let impatient = connect(300).await;
    let held = hold_the_one_connection(&impatient).await;
    let before = impatient.stats().refused;
    let started = std::time::Instant::now();
    let insert = impatient.insert_arrivals(std::slice::from_ref(&saga), "c1", LEASE_MS, "c1");
    let error = tokio::time::timeout(std::time::Duration::from_secs(60), insert)
        .await
        .expect("the store gives up once database.acquire_timeout_ms has passed")
        .expect_err("the server is full for longer than the timeout");
    assert!(error.to_string().contains("1226"), "the server's refusal is the error: {error}");
    assert!(impatient.stats().refused > before, "the store asked again before giving up");
    assert!(started.elapsed() >= std::time::Duration::from_millis(300), "it asked for 300 ms");
    assert_eq!(db.store.get(&saga.biz_id).await.expect("read"), None, "nothing was written");
    drop(held);
    impatient.close().await.expect("close");
    // The server counts a closed connection out a moment after the client has closed it.
    until("the server to count the closed store out", || async { connections_of_the_account().await == 1 }).await;

    let patient = connect(60_000).await;
    let held = hold_the_one_connection(&patient).await;
    let before = patient.stats().refused;
    let insert = tokio::spawn({
        let (patient, saga) = (patient.clone(), saga.clone());
        async move { patient.insert_arrivals(&[saga], "c1", LEASE_MS, "c1").await }
    });
    until("the server to refuse the store a connection", || async { patient.stats().refused > before }).await;
    assert!(!insert.is_finished(), "the insert waits while the server is full");
    other.close().await.expect("the other process goes");
    let arrivals = insert.await.expect("join").expect("the insert lands once a connection is free");
    assert!(matches!(arrivals.as_slice(), [Arrival::Fresh(stored)] if stored.biz_id == saga.biz_id), "{arrivals:?}");
    assert!(db.store.get(&saga.biz_id).await.expect("read").is_some(), "the row is there");
    drop(held);
    patient.close().await.expect("close");
}

/// Drops a test's account when the test ends, passed or not.
struct DropUser {
    url: String,
    user: String,
}

impl Drop for DropUser {
    fn drop(&mut self) {
        if !run_sql_from_drop(&self.url, &format!("DROP USER IF EXISTS '{}'@'%'", self.user)) {
            eprintln!("note: could not drop the test account {}", self.user);
        }
    }
}

/// The server's connection limits as a store reads them (logged at connect, beside the pool):
/// the values the server itself shows; SQLite has no server and no limits.
async fn budget_is_the_servers(db: &TestDb) {
    let budget = db.store.connection_budget().await.expect("read the limits");
    let Engine::MySql = db.engine else {
        assert_eq!(budget, None, "SQLite has no connection limit");
        return;
    };
    let budget = budget.expect("MySQL has limits");
    let shown = |sql: &'static str| async move {
        let row = db.store.connection().query_one_raw(Statement::from_string(DbBackend::MySql, sql)).await;
        let value = row.expect("show").expect("a row").try_get_by_index::<String>(1).expect("value");
        value.parse::<u64>().expect("a number")
    };
    assert_eq!(budget.server_max, shown("SHOW VARIABLES LIKE 'max_connections'").await);
    assert_eq!(budget.per_account_max, shown("SHOW VARIABLES LIKE 'max_user_connections'").await);
    assert!(budget.connected >= 1, "this store's own connection is open: {budget:?}");
    // What this reading leaves free, its first connection included, fits; one more does not.
    let mut free = budget.server_max.saturating_sub(budget.connected) + 1;
    if budget.per_account_max > 0 {
        free = free.min(budget.per_account_max);
    }
    let free = u32::try_from(free).expect("fits");
    assert_eq!(budget.shortfall(free), None, "{free} fits: {budget:?}");
    assert!(budget.shortfall(free + 1).is_some(), "{} does not: {budget:?}", free + 1);
}
both_engines!(connection_budget_is_read_from_the_server, budget_is_the_servers);

/// A statement that runs past `database.statement_timeout_ms` is stopped by the server: here an
/// update waiting on a row another transaction holds fails after a second instead of waiting
/// out InnoDB's 50 s. Migrations run free of it: one whose ALTER waits longer than that on a
/// metadata lock still completes. MariaDB only for the two waits (MySQL's bound covers SELECTs
/// only; there the session variable is checked); SQLite has no sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_statement_past_its_bound_is_stopped_by_the_server() {
    let Some(db) = TestDb::fresh(Engine::MySql).await else { return };
    let saga = arrive(&db.store, received(&db.store, "SLOW-1", 1).await, "c1", LEASE_MS).await;
    let section = midflight_config::DatabaseSection {
        url: db.url.clone(),
        max_connections: 2,
        statement_timeout_ms: 1_000,
        ..midflight_config::DatabaseSection::default()
    };
    let bounded = Store::connect(&section).await.expect("connect");
    let read = |store: &Store, sql: &str| {
        let (connection, statement) = (store.connection().clone(), Statement::from_string(DbBackend::MySql, sql));
        async move { connection.query_one_raw(statement).await.expect("read").expect("a row") }
    };
    let version: String = read(&bounded, "SELECT VERSION() AS v").await.try_get("", "v").expect("version");
    if !version.contains("MariaDB") {
        let bound: u64 = read(&bounded, "SELECT @@SESSION.max_execution_time AS t").await.try_get("", "t").expect("t");
        assert_eq!(bound, 1_000, "MySQL: max_execution_time");
        return;
    }
    let bound: f64 = read(&bounded, "SELECT @@SESSION.max_statement_time AS t").await.try_get("", "t").expect("t");
    assert!((bound - 1.0).abs() < 1e-9, "MariaDB: max_statement_time {bound}");

    let update = Statement::from_sql_and_values(
        DbBackend::MySql,
        "UPDATE saga SET attempts = attempts + 1 WHERE biz_id = ?",
        [saga.biz_id.clone().into()],
    );
    let holder = db.store.connection().begin().await.expect("begin");
    holder.execute_raw(update.clone()).await.expect("lock the row");
    let waiting = bounded.connection().execute_raw(update);
    let error = tokio::time::timeout(std::time::Duration::from_secs(20), waiting)
        .await
        .expect("stopped well before the server's lock wait ends")
        .expect_err("stopped by the server");
    assert!(error.to_string().contains("max_statement_time"), "{error}");
    holder.rollback().await.expect("rollback");

    // The last migration undone, and a reader holding the table's metadata lock: the bounded
    // store's migration waits on it past its statement bound, and completes once it is let go.
    for sql in [
        "DELETE FROM seaql_migrations WHERE version = '0007_transition_call_time'",
        "ALTER TABLE saga_transition DROP COLUMN call_ms",
    ] {
        midflight_store::testing::execute(&db.store, sql).await;
    }
    let reader = db.store.connection().begin().await.expect("begin");
    reader
        .query_one_raw(Statement::from_string(DbBackend::MySql, "SELECT COUNT(*) AS n FROM saga_transition"))
        .await
        .expect("read");
    let migrating = tokio::spawn(async move { bounded.migrate().await });
    let waited = "SELECT COUNT(*) AS n FROM information_schema.processlist \
                  WHERE state LIKE 'Waiting for table metadata lock' AND info LIKE '%ALTER TABLE saga_transition%' AND time >= 2";
    until("the migration to wait on the metadata lock past its bound", || async {
        read(&db.store, waited).await.try_get::<i64>("", "n").expect("n") == 1
    })
    .await;
    reader.rollback().await.expect("let the lock go");
    migrating.await.expect("join").expect("the migration completes");
    let columns = "SELECT COUNT(*) AS n FROM information_schema.columns \
                   WHERE table_schema = DATABASE() AND table_name = 'saga_transition' AND column_name = 'call_ms'";
    assert_eq!(read(&db.store, columns).await.try_get::<i64>("", "n").expect("n"), 1, "the column is back");
}

/// A transaction its client left idle (begun, one row locked, then nothing: a process frozen
/// or cut off mid-transaction) is ended by the server after `database.session_idle_timeout_ms`,
/// and its row lock with it, so a writer waiting on that row goes on instead of waiting out the
/// server's lock wait (50 s) and failing. MySQL and MariaDB only: SQLite has no sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abandoned_transaction_is_ended_by_the_server() {
    let Some(db) = TestDb::fresh(Engine::MySql).await else { return };
    let saga = arrive(&db.store, received(&db.store, "IDLE-1", 1).await, "c1", LEASE_MS).await;
    let section = midflight_config::DatabaseSection {
        url: db.url.clone(),
        max_connections: 2,
        session_idle_timeout_ms: 1_000,
        ..midflight_config::DatabaseSection::default()
    };
    let short = Store::connect(&section).await.expect("connect");
    let sql = "SELECT VERSION() AS v";
    let row = short.connection().query_one_raw(Statement::from_string(DbBackend::MySql, sql)).await.expect("read");
    let version = row.expect("a row").try_get::<String>("", "v").expect("version");
    let variable = if version.contains("MariaDB") { "idle_transaction_timeout" } else { "wait_timeout" };
    let sql = format!("SELECT @@SESSION.{variable} AS t");
    let row = short.connection().query_one_raw(Statement::from_string(DbBackend::MySql, sql)).await.expect("read");
    assert_eq!(row.expect("a row").try_get::<u64>("", "t").expect(variable), 1, "{variable}");

    let update = |by: i32| {
        Statement::from_sql_and_values(
            DbBackend::MySql,
            "UPDATE saga SET attempts = attempts + ? WHERE biz_id = ?",
            [by.into(), saga.biz_id.clone().into()],
        )
    };
    let abandoned = short.connection().begin().await.expect("begin");
    abandoned.execute_raw(update(1)).await.expect("lock the row");
    let waiting = db.store.connection().execute_raw(update(10));
    let applied = tokio::time::timeout(std::time::Duration::from_secs(20), waiting)
        .await
        .expect("the waiting writer goes on well before the server's lock wait ends")
        .expect("update");
    assert_eq!(applied.rows_affected(), 1);
    assert!(abandoned.commit().await.is_err(), "the abandoned transaction's session is gone");
    let row = db.store.get(&saga.biz_id).await.expect("get").expect("row");
    assert_eq!(row.attempts, 10, "the abandoned transaction's write was rolled back");
}
