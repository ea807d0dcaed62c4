//! The recovery worker end to end: the real service loop ([`midflight_recovery::run`]) against
//! the mock downstreams over loopback gRPC and the real store, on SQLite and MariaDB. The
//! planner's branches themselves are covered by the driver's tests; these show the worker
//! finds abandoned sagas, leaves waiting ones alone without starving the rest, and stops cleanly.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use midflight_api::client::LedgerKind;
use midflight_config::{DatabaseSection, GrpcClientSection, KafkaSection};
use midflight_driver::Outcome;
use midflight_model::{Status, Step, request_id};
use midflight_recovery::retention::{Retention, TopicReader};
use midflight_recovery::{PurgeSection, RecoveryConfig, Worker};
use midflight_stack::{MethodFaults, MockDownstreams, MockOptions, fault};
use midflight_store::both_engines;
use midflight_store::testing::{Engine, TestDb, age, drive_to_done, execute, hold_sagas, required_in_ci, until};
use tokio_util::sync::CancellationToken;

fn config(db: &TestDb, mocks: &MockDownstreams) -> RecoveryConfig {
    RecoveryConfig {
        database: DatabaseSection { url: db.url.clone(), max_connections: 8, ..DatabaseSection::default() },
        wms: GrpcClientSection::with_endpoint(&mocks.wms_endpoint),
        logistics: GrpcClientSection::with_endpoint(&mocks.logistics_endpoint),
        driver: settings(),
        rules: rules(),
        recovery: section("r1"),
        ..RecoveryConfig::default()
    }
}

/// Stops a service started with `run`, which must end within 10 s and without error.
async fn stop(shutdown: CancellationToken, service: tokio::task::JoinHandle<Result<(), midflight_recovery::Error>>) {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), service)
        .await
        .expect("the service stops on shutdown")
        .expect("join")
        .expect("the service ends without error");
}

async fn picks_up_a_saga_left_in_wms_requested(db: &TestDb) {
    let drop_all = MethodFaults { drop_response: 1.0, ..MethodFaults::default() };
    let mocks =
        MockDownstreams::start(MockOptions { wms_faults: fault("LockStock", drop_all), ..MockOptions::default() })
            .await;
    // A consumer sends LockStock, the WMS applies it and the answer is lost; the consumer dies.
    let saga = arrive(&db.store, &[event("O-1", "PAID", "CN-ZJ")], 1, 30_000).await.remove(0);
    let consumer = driver(&db.store, mocks.client(), "dead-consumer", settings());
    assert!(matches!(consumer.drive(saga.clone(), Instant::now()).await, Outcome::HandedOff));
    let left = db.store.get(&saga.biz_id).await.expect("get").expect("row");
    assert_eq!(left.status, Status::WmsRequested);

    let shutdown = CancellationToken::new();
    let service = tokio::spawn(midflight_recovery::run(config(db, &mocks), shutdown.clone()));
    let statuses = all_terminal(&db.store, std::slice::from_ref(&saga.biz_id), Duration::from_secs(20)).await;
    assert_eq!(statuses, vec![Status::Done]);
    stop(shutdown, service).await;

    let (wms, logistics) = ledgers(&mocks.client()).await;
    let kinds: Vec<LedgerKind> = wms.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, vec![LedgerKind::Apply], "found by query, not locked again");
    assert_eq!(in_force(&logistics, &request_id(&saga.biz_id, Step::Logistics)), 1);
    let log = db.store.transitions(&saga.biz_id).await.expect("log");
    let takeover = log.iter().find(|t| t.is_takeover()).expect("a takeover is logged");
    assert!(takeover.actor.starts_with("recovery:r1-"), "{takeover:?}");
    assert_one_holder_per_transition(&db.store, &saga.biz_id).await;
}
both_engines!(run_finishes_an_abandoned_saga, picks_up_a_saga_left_in_wms_requested);

async fn waiting_sagas_do_not_starve_the_scan(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    // The first saga of order O-9 is held by a live consumer; five later sagas of the same
    // order wait behind it. They expired first, so they head every scan.
    arrive(&db.store, &[event("O-9", "E0", "CN-ZJ")], 1, 60_000).await;
    let waiting: Vec<_> = (1..=5).map(|i| event("O-9", &format!("E{i}"), "CN-ZJ")).collect();
    let waiting = arrive(&db.store, &waiting, 2, 0).await;
    let free = arrive(&db.store, &[event("O-1", "PAID", "CN-ZJ")], 10, 0).await.remove(0);

    let shutdown = CancellationToken::new();
    let section = midflight_recovery::RecoverySection { scan_batch: 2, ..section("r1") };
    let worker = Worker::new(db.store.clone(), mocks.client(), rules(), settings(), section, shutdown.clone());
    let stats = worker.stats();
    let running = tokio::spawn(worker.run());
    let statuses = all_terminal(&db.store, std::slice::from_ref(&free.biz_id), Duration::from_secs(20)).await;
    assert_eq!(statuses, vec![Status::Done], "the saga behind a full page of waiting ones is reached");
    shutdown.cancel();
    let stats_at_end = running.await.expect("join");
    assert!(stats_at_end.skipped_blocked >= 5, "{stats_at_end:?}");
    assert_eq!((stats.snapshot().claimed, stats_at_end.finished), (1, 1), "only the free saga was claimed");
    for saga in &waiting {
        let log = db.store.transitions(&saga.biz_id).await.expect("log");
        assert_eq!(log.len(), 1, "a waiting saga is left alone: {log:?}");
    }
}
both_engines!(blocked_rows_do_not_starve_the_scan, waiting_sagas_do_not_starve_the_scan);

/// A row no one can read (edited by hand into a negative version) heads the scan's order; the
/// sagas behind it, on its page and on the next, are still finished, and it is left as it is.
async fn an_unreadable_row_does_not_stop_the_scan(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let events: Vec<_> = ["O-1", "O-2", "O-3"].iter().map(|order| event(order, "PAID", "CN-ZJ")).collect();
    let sagas = arrive(&db.store, &events, 1, 0).await;
    let broken = &sagas[1].biz_id;
    execute(
        &db.store,
        &format!("UPDATE saga SET version = -1, lease_until_ms = lease_until_ms - 1000 WHERE biz_id = '{broken}'"),
    )
    .await;

    let shutdown = CancellationToken::new();
    let section = midflight_recovery::RecoverySection { scan_batch: 2, ..section("r1") };
    let worker = Worker::new(db.store.clone(), mocks.client(), rules(), settings(), section, shutdown.clone());
    let stats = worker.stats();
    let running = tokio::spawn(worker.run());
    let readable = [sagas[0].biz_id.clone(), sagas[2].biz_id.clone()];
    let statuses = all_terminal(&db.store, &readable, Duration::from_secs(20)).await;
    assert_eq!(statuses, vec![Status::Done, Status::Done], "the sagas behind the unreadable row are finished");
    until("the unreadable row is counted at a second walk", || async { stats.snapshot().unreadable >= 2 }).await;
    shutdown.cancel();
    let stats_at_end = running.await.expect("join");
    assert_eq!((stats_at_end.claimed, stats_at_end.finished), (2, 2), "{stats_at_end:?}");
    execute(&db.store, &format!("UPDATE saga SET version = 1 WHERE biz_id = '{broken}'")).await;
    let left = db.store.get(broken).await.expect("get").expect("row");
    assert_eq!(left.status, Status::Received, "left for a person to repair");
    assert_eq!(db.store.transitions(broken).await.expect("log").len(), 1, "never claimed");
}
both_engines!(unreadable_rows_are_stepped_over, an_unreadable_row_does_not_stop_the_scan);

/// A takeover whose claim statement fails (here a trigger refuses the takeover's log row) is a
/// failed drive, not a claim won, and the saga stays for a later scan; once the claim can be
/// written, the saga is taken over and finished.
async fn a_failed_claim_is_no_claim(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let sagas = arrive(&db.store, &[event("O-1", "PAID", "CN-ZJ")], 1, 0).await;
    let trigger = match db.engine {
        Engine::MySql => "CREATE TRIGGER refuse_takeover BEFORE INSERT ON saga_transition FOR EACH ROW BEGIN \
             IF NEW.reason = 'takeover' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by a test trigger'; \
             END IF; END"
            .to_owned(),
        _ => "CREATE TRIGGER refuse_takeover BEFORE INSERT ON saga_transition WHEN NEW.reason = 'takeover' \
              BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END"
            .to_owned(),
    };
    execute(&db.store, &trigger).await;
    let shutdown = CancellationToken::new();
    let worker = Worker::new(db.store.clone(), mocks.client(), rules(), settings(), section("r1"), shutdown.clone());
    let stats = worker.stats();
    let running = tokio::spawn(worker.run());
    until("a failed takeover", || async { stats.snapshot().failed >= 2 }).await;
    assert_eq!(stats.snapshot().claimed, 0, "{:?}", stats.snapshot());
    execute(&db.store, "DROP TRIGGER refuse_takeover").await;
    let statuses = all_terminal(&db.store, &[sagas[0].biz_id.clone()], Duration::from_secs(20)).await;
    assert_eq!(statuses, vec![Status::Done]);
    shutdown.cancel();
    let at_end = running.await.expect("join");
    assert_eq!((at_end.claimed, at_end.finished), (1, 1), "{at_end:?}");
}
both_engines!(a_takeover_whose_claim_fails_is_not_counted_as_won, a_failed_claim_is_no_claim);

async fn shutdown_leaves_sagas_at_a_durable_point(db: &TestDb) {
    let slow = MethodFaults::with_latency(150, 300);
    let mocks =
        MockDownstreams::start(MockOptions { wms_faults: fault("LockStock", slow), ..MockOptions::default() }).await;
    let events: Vec<_> = (0..8).map(|i| event(&format!("O-{i}"), "PAID", "CN-ZJ")).collect();
    let sagas = arrive(&db.store, &events, 1, 0).await;
    let shutdown = CancellationToken::new();
    let worker = Worker::new(db.store.clone(), mocks.client(), rules(), settings(), section("r1"), shutdown.clone());
    let running = tokio::spawn(worker.run());
    // Stop while LockStock calls are in flight.
    eventually("a lock to be requested", Duration::from_secs(10), || async {
        let saga = db.store.get(&sagas[0].biz_id).await.expect("get").expect("row");
        (saga.status != midflight_model::Status::Received).then_some(())
    })
    .await;
    shutdown.cancel();
    let stats = tokio::time::timeout(Duration::from_secs(10), running).await.expect("drains in time").expect("join");
    assert!(stats.stopped + stats.finished >= 1, "{stats:?}");
    // The database decides (its clock, in the claim's WHERE clause), not an estimate of it.
    for saga in &sagas {
        let row = db.store.get(&saga.biz_id).await.expect("get").expect("row");
        if row.status.is_terminal() {
            continue;
        }
        let next = db.store.claim(&saga.biz_id, "r2", 1_000, "recovery:r2").await.expect("claim");
        assert!(next.is_applied(), "a stopped drive releases its lease so the next worker resumes at once: {row:?}");
    }
}
both_engines!(shutdown_releases_leases, shutdown_leaves_sagas_at_a_durable_point);

/// With purging on, the service deletes finished sagas past the horizon, batch after batch
/// (seven in batches of two, one right after the other), and keeps the recent one.
async fn purge_runs_through_the_backlog(db: &TestDb) {
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let events: Vec<_> = (0..8).map(|i| event(&format!("O-{i}"), "PAID", "CN-ZJ")).collect();
    let sagas = arrive(&db.store, &events, 1, 60_000).await;
    for (i, saga) in sagas.iter().enumerate() {
        let done = drive_to_done(&db.store, saga.clone(), "consumer:dead-consumer", 60_000).await;
        execute(&db.store, "UPDATE outbox SET published_at_ms = 1").await;
        if i < 7 {
            age(&db.store, &done.biz_id, Status::Done, 25 * HOUR_MS).await;
        }
    }
    let mut config = config(db, &mocks);
    // An hour after a short batch: the test ends only if full batches follow each other at once.
    config.purge =
        PurgeSection { after_hours: 24, batch_rows: 2, pause_ms: 1, interval_ms: 3_600_000, ..PurgeSection::default() };
    let shutdown = CancellationToken::new();
    let service = tokio::spawn(midflight_recovery::run(config, shutdown.clone()));
    until("the old sagas are purged", || async { db.store.page("", 10).await.expect("page").len() == 1 }).await;
    stop(shutdown, service).await;
    let left = db.store.page("", 10).await.expect("page");
    assert_eq!(left[0].biz_id, sagas[7].biz_id, "the recent saga stays");
    assert!(db.store.transitions(&sagas[0].biz_id).await.expect("log").is_empty(), "its log went with it");
    assert!(!db.store.transitions(&sagas[7].biz_id).await.expect("log").is_empty(), "the recent one's log stays");
}
both_engines!(purge_deletes_old_finished_sagas, purge_runs_through_the_backlog);

// ---------------------------------------------------------------------------------------------
// The purge against the order topic's retention
// ---------------------------------------------------------------------------------------------

const HOUR_MS: i64 = 3_600_000;

/// Three finished sagas with their notifications published: last written 40 and 30 hours ago,
/// and now. Returns their biz_ids in that order.
async fn finished_40_30_and_0_hours_ago(db: &TestDb) -> Vec<String> {
    let events: Vec<_> = ["P-40", "P-30", "P-0"].iter().map(|order| event(order, "PAID", "CN-ZJ")).collect();
    let mut ids = Vec::new();
    for (saga, hours) in arrive(&db.store, &events, 1, 60_000).await.into_iter().zip([40, 30, 0]) {
        let done = drive_to_done(&db.store, saga, "consumer:c", 60_000).await;
        if hours > 0 {
            age(&db.store, &done.biz_id, Status::Done, hours * HOUR_MS).await;
        }
        ids.push(done.biz_id);
    }
    execute(&db.store, "UPDATE outbox SET published_at_ms = 1").await;
    ids
}

/// Two recovery workers purging at once, each on its own pool (the deployed shape): every old
/// saga is purged exactly once. On MySQL no batch is rolled back, and while another
/// transaction holds the four oldest sagas (a batch frozen mid-way) both purges go on around
/// them, then take them once they are let go; before, both waited on those rows.
async fn two_purges_side_by_side(db: &TestDb) {
    let events: Vec<_> = (0..24).map(|n| event(&format!("P-{n:02}"), "PAID", "CN-ZJ")).collect();
    let mut ids = Vec::new();
    for saga in arrive(&db.store, &events, 1, 60_000).await {
        let done = drive_to_done(&db.store, saga, "consumer:c", 60_000).await;
        age(&db.store, &done.biz_id, Status::Done, 40 * HOUR_MS).await;
        ids.push(done.biz_id);
    }
    execute(&db.store, "UPDATE outbox SET published_at_ms = 1").await;
    let mysql = db.engine == Engine::MySql;
    let holder = if mysql { Some(hold_sagas(&db.store, &ids[..4]).await) } else { None };
    let other = db.another_store().await;
    let (first, stop_first, first_running) = purge_in_batches(&db.store, None, false, 20, 4);
    let (second, stop_second, second_running) = purge_in_batches(&other, None, false, 20, 4);
    let purged = || first.snapshot().purged_sagas + second.snapshot().purged_sagas;
    if let Some(holder) = holder {
        until("every saga but the held ones purged", || async { purged() == 20 }).await;
        let left: Vec<String> = kept(&db.store).await;
        assert_eq!(left, ids[..4].to_vec(), "the held sagas stay");
        holder.release().await;
    }
    until("every saga purged", || async { purged() == 24 && kept(&db.store).await.is_empty() }).await;
    for (stop, running) in [(stop_first, first_running), (stop_second, second_running)] {
        stop.cancel();
        running.await.expect("purge task");
    }
    assert_eq!(purged(), 24, "each saga purged once");
    if mysql {
        let rolled_back = first.snapshot().purge_rolled_back + second.snapshot().purge_rolled_back;
        assert_eq!(rolled_back, 0, "no batch rolled back");
    }
}
both_engines!(two_workers_purge_side_by_side, two_purges_side_by_side);

/// A purge goes on at once after a batch that listed a full batch and deleted some of it, even
/// one that came back short because another transaction held the rest of what it listed (on
/// MySQL: the three oldest of twelve old sagas held, batches of two listing four); before, such
/// a batch ended the round, and the purge waited `interval_ms` (an hour here) with the other
/// old sagas still there. A round whose every listed row is held ends it. On SQLite, where
/// nothing is held, full batches go on until the old sagas are gone.
async fn short_batches_beside_held_rows(db: &TestDb) {
    let events: Vec<_> = (0..12).map(|n| event(&format!("H-{n:02}"), "PAID", "CN-ZJ")).collect();
    let mut ids = Vec::new();
    for (n, saga) in arrive(&db.store, &events, 1, 60_000).await.into_iter().enumerate() {
        let done = drive_to_done(&db.store, saga, "consumer:c", 60_000).await;
        // Oldest first, a minute apart: the search lists them in this order.
        let minutes = i64::try_from(12 - n).expect("a dozen");
        age(&db.store, &done.biz_id, Status::Done, 40 * HOUR_MS + minutes * 60_000).await;
        ids.push(done.biz_id);
    }
    execute(&db.store, "UPDATE outbox SET published_at_ms = 1").await;
    let holder = if db.engine == Engine::MySql { Some(hold_sagas(&db.store, &ids[..3]).await) } else { None };
    let held = if holder.is_some() { 3 } else { 0 };
    let (stats, stop, running) = purge_in_batches(&db.store, None, false, HOUR_MS as u64, 2);
    until("every saga not held purged", || async { stats.snapshot().purged_sagas == 12 - held }).await;
    assert_eq!(kept(&db.store).await, ids[..held as usize].to_vec(), "only the held sagas stay");
    stop.cancel();
    running.await.expect("purge task");
    if let Some(holder) = holder {
        holder.release().await;
    }
    assert_eq!(stats.snapshot().purge_rolled_back, 0, "no batch rolled back");
}
both_engines!(short_purge_batches_go_on, short_batches_beside_held_rows);

/// A purge of 24 hours reading `topic` on `bootstrap`, run beside the test; it purges without
/// waiting for a reconciliation.
fn purge_reading(
    db: &TestDb,
    (bootstrap, topic): (&str, &str),
    interval_ms: u64,
) -> (Arc<midflight_recovery::Stats>, CancellationToken, tokio::task::JoinHandle<()>) {
    let reader = topic_reader(bootstrap, topic, PURGE_TOPIC_CHECK_TIMEOUT);
    purge_beside(&db.store, Some(reader), false, interval_ms)
}

/// A reader of `topic` on the broker at `bootstrap`.
fn topic_reader(bootstrap: &str, topic: &str, timeout: Duration) -> TopicReader {
    let kafka = KafkaSection {
        bootstrap_servers: bootstrap.to_owned(),
        order_topic: topic.to_owned(),
        ..KafkaSection::default()
    };
    TopicReader::new(&kafka, timeout).expect("admin client")
}

fn admin(bootstrap: &str) -> rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> {
    rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin client")
}

async fn delete_topic(bootstrap: &str, topic: &str) {
    let options = rdkafka::admin::AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let deleted = admin(bootstrap).delete_topics(&[topic], &options).await.expect("delete topics");
    assert!(matches!(&deleted[..], [Ok(_)]), "{topic}: {deleted:?}");
}

/// Creates `topic` with `configs` on the broker at `bootstrap` (one partition).
async fn create_topic(bootstrap: &str, topic: &str, configs: &[(&str, &str)]) {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    let mut new = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    for (name, value) in configs {
        new = new.set(name, value);
    }
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let created = admin(bootstrap).create_topics(&[new], &options).await.expect("create topics");
    assert!(matches!(&created[..], [Ok(_)]), "{topic}: {created:?}");
}

/// With the order topic's settings read (on an external broker, `MIDFLIGHT_TEST_KAFKA`): the
/// purge holds while the topic cannot be read, and goes on once it can; a topic that keeps
/// messages 37 hours makes a 24-hour purge keep a saga of 30 hours (and delete one of 40 in the
/// same batch, where a 24-hour horizon deletes both), also once the topic can no longer be
/// read; a topic that keeps them for ever holds the purge. What the reader makes of each kind
/// of topic, and of one that does not exist.
async fn purge_keeps_what_the_topic_can_hand_out(db: &TestDb) {
    let Some(bootstrap) =
        required_in_ci("MIDFLIGHT_TEST_KAFKA", "the purge's topic check", "the purge's topic check on a broker")
    else {
        return;
    };
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let (kept_37h, for_ever, compacted) =
        (format!("orders-37h-{unique}"), format!("orders-ever-{unique}"), format!("orders-compact-{unique}"));
    // Timestamps set by the broker: nothing is added for producers' clocks (Kafka 4 bounds
    // them at an hour by default).
    let kept_37h_configs = [
        ("retention.ms", &*(36 * HOUR_MS).to_string()),
        ("segment.ms", "3600000"),
        ("message.timestamp.type", "LogAppendTime"),
    ];
    create_topic(&bootstrap, &for_ever, &[("retention.ms", "-1"), ("segment.ms", "3600000")]).await;
    create_topic(&bootstrap, &compacted, &[("cleanup.policy", "compact")]).await;
    let read = |topic: &str| {
        let reader = topic_reader(&bootstrap, topic, Duration::from_secs(5));
        async move { reader.read().await }
    };
    assert_eq!(read(&for_ever).await.expect("read"), Retention::Unbounded);
    assert_eq!(read(&compacted).await.expect("read"), Retention::Unbounded);
    let missing = read(&kept_37h).await;
    assert!(missing.is_err(), "a topic that does not exist has no retention: {missing:?}");

    let [old, younger, recent] = <[String; 3]>::try_from(finished_40_30_and_0_hours_ago(db).await).expect("three");
    // A round, with a reading, every 20 ms; the topic does not exist yet, so nothing is purged.
    let (stats, shutdown, running) = purge_reading(db, (&bootstrap, &kept_37h), 20);
    until("two rounds held", || async { stats.snapshot().purge_held >= 2 }).await;
    assert_eq!(kept(&db.store).await.len(), 3, "nothing is purged before the topic is read");
    create_topic(&bootstrap, &kept_37h, &kept_37h_configs).await;
    assert_eq!(read(&kept_37h).await.expect("read"), Retention::Bounded(Duration::from_secs(37 * 3_600)));
    // Counted once the batch has returned, a moment after its rows are gone.
    until("the 40-hour saga to be purged", || async {
        stats.snapshot().purged_sagas == 1 && !kept(&db.store).await.contains(&old)
    })
    .await;
    let mut expected = vec![younger.clone(), recent.clone()];
    expected.sort();
    assert_eq!(kept(&db.store).await, expected, "the topic keeps messages 37 hours: the 30-hour saga stays");
    let unread_before = stats.snapshot().purge_topic_unread;
    assert!(unread_before >= 2, "{:?}", stats.snapshot());
    // The topic goes away: its reads fail from now on, and the last reading stays in force
    // (two failed reads: the batch after the first has run).
    delete_topic(&bootstrap, &kept_37h).await;
    until("two failed reads", || async { stats.snapshot().purge_topic_unread >= unread_before + 2 }).await;
    assert_eq!(kept(&db.store).await, expected, "a failed read does not bring back the shorter horizon");
    // Nor does it hold the purge: a saga of 45 hours goes, one of 30 stays.
    age(&db.store, &younger, Status::Done, 45 * HOUR_MS).await;
    age(&db.store, &recent, Status::Done, 30 * HOUR_MS).await;
    until("the 45-hour saga to be purged", || async {
        stats.snapshot().purged_sagas == 2 && !kept(&db.store).await.contains(&younger)
    })
    .await;
    shutdown.cancel();
    running.await.expect("purge task");
    assert_eq!(kept(&db.store).await, vec![recent.clone()], "the 30-hour saga stays");
    assert_eq!(stats.snapshot().purged_sagas, 2);

    let (stats, shutdown, running) = purge_reading(db, (&bootstrap, &for_ever), 20);
    until("two purge rounds held", || async { stats.snapshot().purge_held >= 2 }).await;
    shutdown.cancel();
    running.await.expect("purge task");
    assert_eq!(kept(&db.store).await, vec![recent], "nothing is purged while the topic keeps messages for ever");
    assert_eq!(stats.snapshot().purged_sagas, 0);
}
both_engines!(purge_follows_the_order_topics_retention, purge_keeps_what_the_topic_can_hand_out);

/// A broker that does not answer the topic's settings (the embedded one has no DescribeConfigs)
/// holds the purge until it does: a horizon shorter than the topic keeps would delete sagas
/// whose messages can still be read. The failed reads are counted.
async fn purge_without_a_reading_holds(db: &TestDb) {
    let cluster = rdkafka::mocking::MockCluster::new(1).expect("embedded Kafka");
    cluster.create_topic("orders", 1, 1).expect("topic");
    let mut all = finished_40_30_and_0_hours_ago(db).await;
    all.sort();
    let (stats, shutdown, running) = purge_reading(db, (&cluster.bootstrap_servers(), "orders"), 20);
    until("two rounds held after failed reads", || async {
        let snapshot = stats.snapshot();
        snapshot.purge_held >= 2 && snapshot.purge_topic_unread >= 2
    })
    .await;
    shutdown.cancel();
    running.await.expect("purge task");
    assert_eq!(kept(&db.store).await, all, "nothing is purged before the topic is read");
    assert_eq!(stats.snapshot().purged_sagas, 0);
}
both_engines!(purge_holds_until_the_topic_is_read, purge_without_a_reading_holds);
