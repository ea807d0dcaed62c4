//! The shared resume routine end to end: real mock downstreams over gRPC on loopback, the real
//! store on SQLite and MariaDB. One test per planner branch a recovery must get right, each
//! checked against the downstreams' ledgers (the effects that really happened), not just the row.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use midflight_api::client::{Downstreams, LedgerEntry, LedgerKind};
use midflight_driver::{Downstream, Driver, DriverSettings, Outcome};
use midflight_model::{
    Call, Change, Observation, OrderEvent, Plan, RetryPolicy, Rules, Saga, Source, Status, Step, plan,
};
use midflight_stack::{ManualClock, MethodFaults, MockDownstreams, MockOptions, fault};
use midflight_store::testing::{TestDb, order_event, until};
use midflight_store::{Arrival, Cas, Store, TicketState, both_engines};
use tokio_util::sync::CancellationToken;

const LEASE_MS: i64 = 30_000;

/// Retries come back at once, so tests never wait on a backoff.
fn rules() -> Rules {
    Rules { retry: RetryPolicy { backoff_base_ms: 1, backoff_max_ms: 1, attempts_max: 10 }, ..Rules::default() }
}

fn driver<D: Downstream>(store: &Store, downstream: D, name: &str) -> Driver<D> {
    Driver::new(
        store.clone(),
        downstream,
        rules(),
        DriverSettings::new(LEASE_MS, 2_000, 500),
        name.to_owned(),
        format!("test:{name}"),
        CancellationToken::new(),
    )
}

fn event(order_no: &str, region: &str) -> OrderEvent {
    let mut event = order_event(order_no);
    event.address.region = region.into();
    event.lines[0].quantity = 3;
    event
}

/// A fresh RECEIVED row owned by `owner`, due by `deadline_in_ms` from now.
async fn arrive(store: &Store, event: &OrderEvent, owner: &str, lease_ms: i64, deadline_in_ms: i64) -> Saga {
    let now = store.now_ms().await.expect("clock");
    let saga =
        Saga::received(event, Source { topic: "orders".into(), partition: 0, offset: 1 }, now, now + deadline_in_ms);
    match store.insert_arrivals(&[saga], owner, lease_ms, owner).await.expect("insert").remove(0) {
        Arrival::Fresh(saga) => saga,
        other => panic!("expected a fresh row, got {other:?}"),
    }
}

/// Claims and drives until the claim succeeds (backoffs are 1 ms), with a deadline.
async fn resume<D: Downstream>(driver: &Driver<D>, biz_id: &str) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(outcome) = driver.claim_and_drive(biz_id).await {
            return outcome;
        }
        assert!(Instant::now() < deadline, "{biz_id} never became claimable");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn ledgers(client: &Downstreams) -> (Vec<LedgerEntry>, Vec<LedgerEntry>) {
    let timeout = Duration::from_secs(5);
    let wms = client.wms_ledger(0, 1_000, timeout).await.expect("wms ledger").0;
    let logistics = client.logistics_ledger(0, 1_000, timeout).await.expect("logistics ledger").0;
    (wms, logistics)
}

fn kinds(entries: &[LedgerEntry]) -> Vec<LedgerKind> {
    entries.iter().map(|e| e.kind).collect()
}

fn finished(outcome: &Outcome) -> Status {
    match outcome {
        Outcome::Finished(status) => *status,
        other => panic!("expected a finished saga, got {other:?}"),
    }
}

async fn happy_path(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let driver = driver(&db.store, mocks.client(), "c1");
    let saga = arrive(&db.store, &event("O-1", "CN-ZJ"), "c1", LEASE_MS, 600_000).await;
    let outcome = driver.drive(saga.clone(), Instant::now()).await;
    assert_eq!(finished(&outcome), Status::Done);
    let (wms, logistics) = ledgers(&mocks.client()).await;
    assert_eq!(kinds(&wms), vec![LedgerKind::Apply], "one lock");
    assert_eq!(
        wms[0].request_id,
        midflight_model::request_id(&saga.biz_id, Step::Wms),
        "sent under our deterministic id"
    );
    assert_eq!(kinds(&logistics), vec![LedgerKind::Apply], "one shipment");
    let done = db.store.get(&saga.biz_id).await.expect("get").expect("row");
    assert_eq!(done.tracking_no.as_deref(), Some(logistics[0].effect_id.as_str()));
    assert_eq!(db.store.order_row(&saga.biz_id).await.expect("order").expect("row").status, "SHIPPED");
    assert_eq!(db.store.outbox_rows().await.expect("outbox"), vec![(saga.biz_id.clone(), false)]);
    let path: Vec<Status> = db.store.transitions(&saga.biz_id).await.expect("log").iter().map(|t| t.to).collect();
    use Status::*;
    assert_eq!(
        path,
        vec![Received, DbWritten, WmsRequested, WmsConfirmed, LogisticsRequested, LogisticsConfirmed, Done]
    );
}
both_engines!(happy_path_locks_once_and_ships_once, happy_path);

/// Calls a driver made, in order, each with the intent clock of the row it was sent under.
type CallLog = Arc<std::sync::Mutex<Vec<(Call, Option<i64>)>>>;

/// Records every call a driver makes in a [`CallLog`].
#[derive(Clone)]
struct Recording<D> {
    inner: D,
    calls: CallLog,
}

impl<D: Downstream> Downstream for Recording<D> {
    async fn call(&self, call: Call, saga: &Saga, timeout: Duration) -> Observation {
        self.calls.lock().expect("calls").push((call, saga.intent_at_ms));
        self.inner.call(call, saga, timeout).await
    }
}

fn called(calls: &CallLog) -> Vec<Call> {
    calls.lock().expect("calls").iter().map(|(call, _)| *call).collect()
}

/// A fresh RECEIVED row for order O-1, inserted and opened in one inbox transaction (leased to
/// "c1"), as the consumer writes it: the row as received, the row as opened, and its call.
async fn open_in_the_inbox<D: Downstream>(db: &TestDb, consumer: &Driver<D>) -> (Saga, Saga, Call) {
    let now = db.store.now_ms().await.expect("clock");
    let saga = Saga::received(
        &event("O-1", "CN-ZJ"),
        Source { topic: "orders".into(), partition: 0, offset: 1 },
        now,
        now + 600_000,
    );
    let (change, call) = midflight_driver::opening(&saga, now, consumer.rules()).expect("a fresh saga opens");
    let openings = std::collections::HashMap::from([(saga.biz_id.clone(), change)]);
    let received = db
        .store
        .receive(std::slice::from_ref(&saga), "c1", LEASE_MS, "test:c1", now, &openings)
        .await
        .expect("receive");
    assert!(received.opened.contains(&saga.biz_id));
    let opened = received.arrivals[0].saga().expect("readable").clone();
    (saga, opened, call)
}

async fn opened_in_the_inbox(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let calls = CallLog::default();
    let consumer = driver(&db.store, Recording { inner: mocks.client(), calls: calls.clone() }, "c1");
    let (saga, opened, call) = open_in_the_inbox(db, &consumer).await;
    assert_eq!((opened.status, call), (Status::WmsRequested, Call::LockStock));
    let outcome = consumer.drive_opened(opened, Instant::now(), call).await;
    assert_eq!(finished(&outcome), Status::Done);
    // It starts with the lock itself: a query first would mean it treated its own fresh
    // intent as an unknown outcome.
    assert_eq!(called(&calls), [Call::LockStock, Call::CreateShipment]);
    let (wms, logistics) = ledgers(&mocks.client()).await;
    assert_eq!((kinds(&wms), kinds(&logistics)), (vec![LedgerKind::Apply], vec![LedgerKind::Apply]));
    let path: Vec<Status> = db.store.transitions(&saga.biz_id).await.expect("log").iter().map(|t| t.to).collect();
    use Status::*;
    assert_eq!(
        path,
        vec![Received, DbWritten, WmsRequested, WmsConfirmed, LogisticsRequested, LogisticsConfirmed, Done]
    );
    // Only a RECEIVED row whose first step is a write and a call is opened.
    let now = saga.created_at_ms;
    let parked = Saga { status: Status::Parked, ..saga.clone() };
    assert!(midflight_driver::opening(&parked, now, consumer.rules()).is_none());
    let late = Saga { deadline_ms: now - 1, ..saga.clone() };
    assert!(midflight_driver::opening(&late, now, consumer.rules()).is_none(), "a deadline passed rolls back");
}
both_engines!(opened_in_the_inbox_starts_with_its_call, opened_in_the_inbox);

/// A downstream that can be queried but does not deduplicate our request id: a request that
/// lands after "not found" and a resend applies twice, so its in-flight window must count from
/// the send. An intent whose write waited more than an RPC timeout (here behind a transaction
/// holding the row, on SQLite the database's write lock) gets its clock restarted first.
async fn intent_that_waited(db: &TestDb) {
    use sea_orm::{ConnectionTrait, Statement, TransactionTrait};
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let calls = CallLog::default();
    let careless = midflight_model::Contract { idempotent_for_ms: Some(0), ..midflight_model::Contract::CAREFUL };
    let rpc_timeout_ms = 500;
    let consumer = Driver::new(
        db.store.clone(),
        Recording { inner: mocks.client(), calls: calls.clone() },
        Rules { wms: careless, ..rules() },
        DriverSettings::new(LEASE_MS, rpc_timeout_ms, 100),
        "c1".to_owned(),
        "test:c1".to_owned(),
        CancellationToken::new(),
    );
    let saga = arrive(&db.store, &event("O-1", "CN-ZJ"), "c1", LEASE_MS, 600_000).await;
    let holder = db.store.connection().begin().await.expect("holder");
    let hold = Statement::from_sql_and_values(
        db.store.connection().get_database_backend(),
        "UPDATE saga SET version = version WHERE biz_id = ?",
        [saga.biz_id.clone().into()],
    );
    holder.execute_raw(hold).await.expect("hold the row");
    let held_from = db.store.now_ms().await.expect("clock");
    let biz_id = saga.biz_id.clone();
    let drive = tokio::spawn(async move { consumer.drive(saga, Instant::now()).await });
    let released_at = held_from + rpc_timeout_ms as i64 + 200;
    until("more than an RPC timeout with the row held", || async {
        db.store.now_ms().await.expect("clock") > released_at
    })
    .await;
    holder.rollback().await.expect("release");
    assert_eq!(finished(&drive.await.expect("drive")), Status::Done);
    let sent = calls.lock().expect("calls").first().cloned().expect("a call");
    assert_eq!(sent.0, Call::LockStock);
    let sent_under = sent.1.expect("an intent clock");
    assert!(
        sent_under >= released_at,
        "the lock went under a clock read before the wait: {sent_under} < {released_at}"
    );
    let done = db.store.get(&biz_id).await.expect("get").expect("row");
    assert_eq!(done.version, 7, "one write more than a drive without the wait (6)");
    let (wms, _) = ledgers(&mocks.client()).await;
    assert_eq!(kinds(&wms), vec![LedgerKind::Apply]);
}
both_engines!(an_intent_that_waited_restarts_its_clock_before_a_careless_downstream, intent_that_waited);

async fn opened_long_ago(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let calls = CallLog::default();
    let consumer = driver(&db.store, Recording { inner: mocks.client(), calls: calls.clone() }, "c1");
    let (saga, opened, call) = open_in_the_inbox(db, &consumer).await;
    // The restarted intent clock is read after the opening's; let the clock pass it, or both
    // may fall in one millisecond.
    let intent_at_ms = opened.intent_at_ms.expect("opened intent");
    until("the clock to pass the opening", || async { db.store.now_ms().await.expect("clock") > intent_at_ms }).await;
    // The batch's write began more than an RPC timeout (2 s here) before the drive starts.
    let leased_at = Instant::now().checked_sub(Duration::from_secs(3)).expect("an instant 3 s ago");
    let outcome = consumer.drive_opened(opened.clone(), leased_at, call).await;
    assert_eq!(finished(&outcome), Status::Done);
    assert_eq!(called(&calls), [Call::LockStock, Call::CreateShipment]);
    let sent_under = calls.lock().expect("calls")[0].1.expect("an intent clock");
    assert!(sent_under > opened.intent_at_ms.expect("opened intent"), "the clock restarted before the lock");
    let done = db.store.get(&saga.biz_id).await.expect("get").expect("row");
    assert_eq!(done.version, 7, "one write more than a drive without the wait (6)");
    let (wms, logistics) = ledgers(&mocks.client()).await;
    assert_eq!((kinds(&wms), kinds(&logistics)), (vec![LedgerKind::Apply], vec![LedgerKind::Apply]));
}
both_engines!(opened_intent_that_waited_restarts_its_clock, opened_long_ago);

async fn dropped_lock_response(db: &TestDb) {
    let drop_all = MethodFaults { drop_response: 1.0, ..MethodFaults::default() };
    let mocks =
        MockDownstreams::start(MockOptions { wms_faults: fault("LockStock", drop_all), ..MockOptions::default() })
            .await;
    let consumer = driver(&db.store, mocks.client(), "c1");
    let saga = arrive(&db.store, &event("O-1", "CN-ZJ"), "c1", LEASE_MS, 600_000).await;
    // The WMS applies the lock and the answer is lost: the consumer sees a timeout.
    assert!(matches!(consumer.drive(saga.clone(), Instant::now()).await, Outcome::HandedOff));
    let stuck = db.store.get(&saga.biz_id).await.expect("get").expect("row");
    assert_eq!((stuck.status, stuck.attempts), (Status::WmsRequested, 1), "not failed, not resent: {stuck:?}");
    assert_eq!(kinds(&ledgers(&mocks.client()).await.0), vec![LedgerKind::Apply], "the lock really applied");

    // Recovery asks the WMS about our request id, finds the lock, and goes on from there.
    let recovery = driver(&db.store, mocks.client(), "r1");
    assert_eq!(finished(&resume(&recovery, &saga.biz_id).await), Status::Done);
    let (wms, logistics) = ledgers(&mocks.client()).await;
    assert_eq!(kinds(&wms), vec![LedgerKind::Apply], "still exactly one deduction");
    assert_eq!(kinds(&logistics), vec![LedgerKind::Apply]);
}
both_engines!(lock_applied_answer_lost_is_found_by_query, dropped_lock_response);

async fn lock_never_applied(db: &TestDb) {
    let fail_all = MethodFaults { fail_before_apply: 1.0, ..MethodFaults::default() };
    let mocks =
        MockDownstreams::start(MockOptions { wms_faults: fault("LockStock", fail_all), ..MockOptions::default() })
            .await;
    let consumer = driver(&db.store, mocks.client(), "c1");
    let saga = arrive(&db.store, &event("O-1", "CN-ZJ"), "c1", LEASE_MS, 600_000).await;
    assert!(matches!(consumer.drive(saga.clone(), Instant::now()).await, Outcome::HandedOff));
    assert!(ledgers(&mocks.client()).await.0.is_empty(), "nothing applied");

    mocks.set_wms_faults(Default::default()).await;
    let recovery = driver(&db.store, mocks.client(), "r1");
    assert_eq!(finished(&resume(&recovery, &saga.biz_id).await), Status::Done);
    let wms = ledgers(&mocks.client()).await.0;
    assert_eq!(kinds(&wms), vec![LedgerKind::Apply], "resent once, with the same key");
    assert_eq!(wms[0].request_id, midflight_model::request_id(&saga.biz_id, Step::Wms));
}
both_engines!(lock_not_applied_is_resent_with_the_same_key, lock_never_applied);

async fn logistics_rejection(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let driver = driver(&db.store, mocks.client(), "c1");
    let saga = arrive(&db.store, &event("O-1", "XX"), "c1", LEASE_MS, 600_000).await;
    assert_eq!(finished(&driver.drive(saga.clone(), Instant::now()).await), Status::RolledBack);
    let (wms, logistics) = ledgers(&mocks.client()).await;
    assert_eq!(kinds(&wms), vec![LedgerKind::Apply, LedgerKind::Undo], "the lock was reversed: stock restored");
    assert_eq!(kinds(&logistics), vec![LedgerKind::Reject]);
    assert_eq!(db.store.order_row(&saga.biz_id).await.expect("order").expect("row").status, "REVERSED");
    assert!(db.store.outbox_rows().await.expect("outbox").is_empty(), "no notification for a rolled-back order");
}
both_engines!(logistics_rejection_rolls_back, logistics_rejection);

async fn reversal_refused(db: &TestDb) {
    let clock = Arc::new(ManualClock::default());
    let wms_faults = midflight_stack::Faults { irreversible_after_ms: 1_000, ..Default::default() };
    let mocks =
        MockDownstreams::start(MockOptions { wms_faults, clock: Some(clock.clone()), ..MockOptions::default() }).await;
    // Logistics is down: the saga waits in LOGISTICS_REQUESTED while the WMS lock ages.
    mocks.set_logistics_faults(fault("CreateShipment", MethodFaults { unavailable: true, ..Default::default() })).await;
    let consumer = driver(&db.store, mocks.client(), "c1");
    let saga = arrive(&db.store, &event("O-1", "XX"), "c1", LEASE_MS, 600_000).await;
    assert!(matches!(consumer.drive(saga.clone(), Instant::now()).await, Outcome::HandedOff));
    clock.advance(Duration::from_secs(5));
    mocks.set_logistics_faults(Default::default()).await;

    // Logistics now rejects the address; the WMS says the lock can no longer be reversed.
    let recovery = driver(&db.store, mocks.client(), "r1");
    assert_eq!(finished(&resume(&recovery, &saga.biz_id).await), Status::ManualReview);
    let tickets = db.store.tickets_of(&saga.biz_id).await.expect("tickets");
    assert_eq!(tickets.len(), 1);
    assert_eq!((tickets[0].step.as_str(), tickets[0].state), ("WMS", TicketState::Open));
    assert!(
        tickets[0].evidence["answer"].as_str().is_some_and(|a| a.contains("Irreversible")),
        "{}",
        tickets[0].evidence
    );

    // An operator retries the reversal; it is refused again: still one ticket.
    let review = db.store.get(&saga.biz_id).await.expect("get").expect("row");
    let resolved = db.store.resolve(&saga.biz_id, review.version, Status::WmsReversing, None, "alice", "retry").await;
    assert!(resolved.expect("resolve").is_applied());
    assert_eq!(finished(&resume(&recovery, &saga.biz_id).await), Status::ManualReview);
    let tickets = db.store.tickets_of(&saga.biz_id).await.expect("tickets");
    assert_eq!(tickets.len(), 1, "{tickets:?}");
    assert_eq!(tickets[0].state, TicketState::Open);
    assert_eq!(kinds(&ledgers(&mocks.client()).await.0), vec![LedgerKind::Apply], "stock stays deducted, once");
}
both_engines!(irreversible_reversal_opens_one_ticket, reversal_refused);

async fn shipment_found_after_deadline(db: &TestDb) {
    let drop_all = MethodFaults { drop_response: 1.0, ..MethodFaults::default() };
    let mocks = MockDownstreams::start(MockOptions {
        logistics_faults: fault("CreateShipment", drop_all),
        ..MockOptions::default()
    })
    .await;
    let consumer = driver(&db.store, mocks.client(), "c1");
    // The deadline passes while the shipment's answer is lost...
    let saga = arrive(&db.store, &event("O-1", "CN-ZJ"), "c1", LEASE_MS, 300).await;
    assert!(matches!(consumer.drive(saga.clone(), Instant::now()).await, Outcome::HandedOff));
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.store.now_ms().await.expect("clock") <= saga.deadline_ms {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...but a tracking number exists: past the point of no return the saga only goes forward.
    let recovery = driver(&db.store, mocks.client(), "r1");
    assert_eq!(finished(&resume(&recovery, &saga.biz_id).await), Status::Done);
    let (wms, logistics) = ledgers(&mocks.client()).await;
    assert_eq!((kinds(&wms), kinds(&logistics)), (vec![LedgerKind::Apply], vec![LedgerKind::Apply]));
}
both_engines!(shipment_found_rolls_forward_even_past_deadline, shipment_found_after_deadline);

/// Counts the calls a driver makes.
#[derive(Clone)]
struct Counting {
    inner: Downstreams,
    calls: Arc<AtomicUsize>,
}

impl Downstream for Counting {
    async fn call(&self, call: Call, saga: &Saga, timeout: Duration) -> Observation {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.call(call, saga, timeout).await
    }
}

async fn lost_owner_sends_nothing(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let zombie = driver(&db.store, Counting { inner: mocks.client(), calls: calls.clone() }, "c1");
    // The zombie's lease is 0 ms: expired the moment it was granted.
    let saga = arrive(&db.store, &event("O-1", "CN-ZJ"), "c1", 0, 600_000).await;
    let recovery = driver(&db.store, mocks.client(), "r1");
    assert_eq!(finished(&resume(&recovery, &saga.biz_id).await), Status::Done);
    // The zombie wakes up with its stale row: its first write is refused and it stops.
    assert!(matches!(zombie.drive(saga.clone(), Instant::now()).await, Outcome::Lost));
    assert_eq!(calls.load(Ordering::SeqCst), 0, "a driver that lost its CAS sends nothing");
    let (wms, logistics) = ledgers(&mocks.client()).await;
    assert_eq!((wms.len(), logistics.len()), (1, 1));
}
both_engines!(lost_cas_stops_before_any_call, lost_owner_sends_nothing);

async fn zombie_late_lock(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let client = mocks.client();
    // The zombie records its intent (WMS_REQUESTED) and is paused before LockStock leaves.
    let saga = arrive(&db.store, &event("O-1", "CN-ZJ"), "c1", 0, 200).await;
    let now = db.store.now_ms().await.expect("clock");
    let Plan::Write { change, then: Some(Call::LockStock) } = plan(&saga, &Observation::Nothing, now, &rules()) else {
        panic!("expected the intent write")
    };
    let paused = db.store.write(&saga, &change, now, 0, "test:c1").await.expect("write").applied().expect("applied");
    assert_eq!(paused.status, Status::WmsRequested);
    // Past the deadline, recovery finds nothing at the WMS and rolls back, leaving a tombstone.
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.store.now_ms().await.expect("clock") <= saga.deadline_ms {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovery = driver(&db.store, client.clone(), "r1");
    assert_eq!(finished(&resume(&recovery, &saga.biz_id).await), Status::RolledBack);
    // The zombie resumes: its late LockStock (same request id) is refused by the tombstone...
    let late = client.call(Call::LockStock, &paused, Duration::from_secs(5)).await;
    assert_eq!(late, Observation::Wms(midflight_model::WmsAnswer::Tombstoned));
    // ...and its next transition is refused by the epoch.
    let next = Change { wms_locked: true, ..Change::to(&[Status::WmsConfirmed], "zombie") };
    assert_eq!(db.store.write(&paused, &next, now, LEASE_MS, "test:c1").await.expect("write"), Cas::Conflict);
    let wms = ledgers(&client).await.0;
    assert_eq!(kinds(&wms), vec![LedgerKind::Tombstone], "no stock was ever deducted: {wms:?}");
}
both_engines!(zombie_late_lock_is_refused_by_tombstone, zombie_late_lock);

async fn legacy_wms_contract(db: &TestDb) {
    // The user's WMS today: deduplicates only on its own key and cannot be asked about ours.
    let mut wms_faults = fault("LockStock", MethodFaults { drop_response: 1.0, ..MethodFaults::default() });
    wms_faults.legacy_mode = true;
    let mocks = MockDownstreams::start(MockOptions { wms_faults, ..MockOptions::default() }).await;
    let legacy_rules = Rules { wms: midflight_model::Contract::LEGACY, ..rules() };
    let consumer = Driver::new(
        db.store.clone(),
        mocks.client(),
        legacy_rules,
        DriverSettings::new(LEASE_MS, 2_000, 500),
        "c1".into(),
        "test:c1".into(),
        CancellationToken::new(),
    );
    let saga = arrive(&db.store, &event("O-1", "CN-ZJ"), "c1", LEASE_MS, 600_000).await;
    assert!(matches!(consumer.drive(saga.clone(), Instant::now()).await, Outcome::HandedOff));
    // The outcome is unknown and nothing can settle it safely: a person decides, nobody resends.
    let recovery = Driver::new(
        db.store.clone(),
        mocks.client(),
        legacy_rules,
        DriverSettings::new(LEASE_MS, 2_000, 500),
        "r1".into(),
        "test:r1".into(),
        CancellationToken::new(),
    );
    assert_eq!(finished(&resume(&recovery, &saga.biz_id).await), Status::ManualReview);
    let tickets = db.store.tickets_of(&saga.biz_id).await.expect("tickets");
    assert_eq!(tickets.len(), 1);
    assert!(tickets[0].reason.contains("neither be queried"), "{}", tickets[0].reason);
    assert_eq!(kinds(&ledgers(&mocks.client()).await.0), vec![LedgerKind::Apply], "one lock, never resent");
}
both_engines!(legacy_wms_unknown_outcome_goes_to_a_person, legacy_wms_contract);
