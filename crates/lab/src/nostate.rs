//! The benchmark's baseline B: midflight's parallel pipeline with the saga table taken out, so
//! the benchmark can price durability.
//!
//! Kept, as midflight does it: up to `in_flight_max` messages at once (the consumer's default
//! bound), the business row (an INSERT before the calls and an UPDATE with the tracking number
//! after them: the statements midflight fuses into its first and last transitions, here each its
//! own autocommit transaction), LockStock and CreateShipment with midflight's deterministic
//! request ids and vouchers, and the notification (published directly).
//!
//! Removed: the saga row (the inbox insert and the three compare-and-set transitions), the
//! transition log, the outbox row and the relay's claim and mark. With them goes everything they
//! buy: nothing says how far a message got, so a crash mid-flight cannot be resumed; there is no
//! lease, no fencing and no per-order ordering (the benchmark's orders are all distinct).
//! Offsets are committed per partition up to the first message not yet finished, so a
//! rebalance redelivers only unfinished messages, and the downstreams absorb a repeat by
//! request id. A message whose calls keep failing is dropped after a few attempts (logged).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use midflight_api::client::Downstreams;
use midflight_config::{Config, DatabaseSection, GrpcClientSection, KafkaSection, RuntimeSection, TelemetrySection};
use midflight_model::{Call, LogisticsAnswer, Observation, OrderEvent, Saga, Source, WmsAnswer};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement, Value};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::membership::RebalanceLog;
use crate::timings::TimingsFile;

/// Attempts at one message's calls before it is dropped (nothing durable remembers it).
const ATTEMPTS_MAX: u32 = 5;
/// Pause between attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How long a notification may wait for room in the producer's queue.
const QUEUE_WAIT: Duration = Duration::from_secs(1);
/// How long shutdown waits for messages in flight before leaving them to redelivery.
const DRAIN_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NoStateConfig {
    pub instance: String,
    pub kafka: KafkaSection,
    pub database: DatabaseSection,
    pub wms: GrpcClientSection,
    pub logistics: GrpcClientSection,
    pub telemetry: TelemetrySection,
    pub runtime: RuntimeSection,
    /// When set, one line per finished message is appended here.
    pub timings_path: Option<std::path::PathBuf>,
    /// Messages in flight at once: midflight's consumer default, so the two pipelines match.
    pub in_flight_max: usize,
    /// How often finished offsets are committed.
    pub commit_interval_ms: u64,
}

impl Default for NoStateConfig {
    fn default() -> Self {
        NoStateConfig {
            instance: "nostate".to_owned(),
            kafka: KafkaSection::default(),
            database: DatabaseSection::default(),
            wms: GrpcClientSection::default(),
            logistics: GrpcClientSection::default(),
            telemetry: TelemetrySection::default(),
            runtime: RuntimeSection::default(),
            timings_path: None,
            in_flight_max: midflight_consumer::ConsumerSection::default().in_flight_max,
            commit_interval_ms: 100,
        }
    }
}

impl Config for NoStateConfig {
    fn problems(&self) -> Vec<String> {
        let mut problems = self.kafka.problems("kafka");
        problems.extend(self.database.problems("database"));
        problems.extend(self.wms.problems("wms"));
        problems.extend(self.logistics.problems("logistics"));
        problems.extend(self.telemetry.problems("telemetry"));
        problems.extend(self.runtime.problems("runtime"));
        if self.in_flight_max == 0 || self.commit_interval_ms == 0 {
            problems.push("in_flight_max and commit_interval_ms must be positive".to_owned());
        }
        problems
    }
}

impl midflight_service::ServiceConfig for NoStateConfig {
    fn telemetry(&self) -> &TelemetrySection {
        &self.telemetry
    }

    fn runtime(&self) -> &RuntimeSection {
        &self.runtime
    }
}

/// What every message task shares.
struct Shared {
    db: DatabaseConnection,
    backend: DbBackend,
    downstreams: Downstreams,
    producer: FutureProducer,
    notification_topic: String,
    timeout: Duration,
    timings: Option<TimingsFile>,
    offsets: std::sync::Mutex<Offsets>,
    write_txns: AtomicU64,
    dropped: AtomicU64,
}

/// Per partition: offsets received and not yet finished, and one past the highest received.
#[derive(Debug, Default)]
struct Offsets {
    partitions: BTreeMap<(String, i32), (BTreeSet<i64>, i64)>,
}

impl Offsets {
    fn received(&mut self, topic: &str, partition: i32, offset: i64) {
        let (pending, high) = self.partitions.entry((topic.to_owned(), partition)).or_default();
        pending.insert(offset);
        *high = (*high).max(offset + 1);
    }

    fn finished(&mut self, topic: &str, partition: i32, offset: i64) {
        if let Some((pending, _)) = self.partitions.get_mut(&(topic.to_owned(), partition)) {
            pending.remove(&offset);
        }
    }

    /// Per partition in `owned`, the first offset not finished: everything below it is done.
    /// The others are forgotten: their new owner commits them, and a commit from here would
    /// move its position back (a classic broker takes a commit for any partition from a member
    /// of the current generation). A partition that comes back starts afresh.
    fn committable(&mut self, owned: &BTreeSet<(String, i32)>) -> TopicPartitionList {
        self.partitions.retain(|key, _| owned.contains(key));
        let mut list = TopicPartitionList::new();
        for ((topic, partition), (pending, high)) in &self.partitions {
            let next = pending.first().copied().unwrap_or(*high);
            let _ = list.add_partition_offset(topic, *partition, Offset::Offset(next));
        }
        list
    }
}

pub async fn run(config: NoStateConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut options = sea_orm::ConnectOptions::new(config.database.url.clone());
    options
        .max_connections(config.database.max_connections)
        .acquire_timeout(Duration::from_millis(config.database.acquire_timeout_ms))
        .idle_timeout(Duration::from_millis(config.database.idle_timeout_ms))
        // The same pool settings as midflight's store (a test per acquire halves the commit
        // rate on this kind of box), so the comparison is of designs, not of pool settings.
        .test_before_acquire(false)
        .sqlx_logging(false);
    let db = Database::connect(options).await.context("nostate: cannot connect")?;
    let backend = db.get_database_backend();
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.kafka.bootstrap_servers)
        .set("group.id", &config.kafka.group_id)
        .set("client.id", &config.instance)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest");
    crate::membership::group_membership(&mut client, &config.kafka, Some("cooperative-sticky"));
    for (key, value) in &config.kafka.properties {
        client.set(key, value);
    }
    let consumer: StreamConsumer<RebalanceLog> =
        client.create_with_context(RebalanceLog).context("nostate: cannot create the consumer")?;
    consumer.subscribe(&[&config.kafka.order_topic])?;
    let mut producer_config = ClientConfig::new();
    producer_config.set("bootstrap.servers", &config.kafka.bootstrap_servers).set("enable.idempotence", "true");
    let producer: FutureProducer = producer_config.create().context("nostate: cannot create the producer")?;
    let shared = Arc::new(Shared {
        db,
        backend,
        downstreams: Downstreams::connect_lazy(&config.wms, &config.logistics)?,
        producer,
        notification_topic: config.kafka.notification_topic.clone(),
        timeout: Duration::from_millis(config.wms.request_timeout_ms),
        timings: config.timings_path.as_deref().map(TimingsFile::open).transpose()?,
        offsets: std::sync::Mutex::default(),
        write_txns: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
    });
    let permits = Arc::new(Semaphore::new(config.in_flight_max));
    let mut tasks = JoinSet::new();
    let mut commits = tokio::time::interval(Duration::from_millis(config.commit_interval_ms));
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            _ = commits.tick() => commit(&consumer, &shared, CommitMode::Async),
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            received = next(&consumer, &permits) => {
                let (message, permit) = received?;
                let received_at_ms = crate::timings::now_ms();
                let (topic, partition, offset) = (message.topic().to_owned(), message.partition(), message.offset());
                let payload = message.payload().unwrap_or_default().to_vec();
                drop(message);
                shared.lock().received(&topic, partition, offset);
                let shared = shared.clone();
                tasks.spawn(async move {
                    let source = Source { topic: topic.clone(), partition, offset };
                    handle(&shared, &payload, source, received_at_ms).await;
                    shared.lock().finished(&topic, partition, offset);
                    drop(permit);
                });
            }
        }
    }
    let drained = tokio::time::timeout(DRAIN_DEADLINE, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(left = tasks.len(), "messages still in flight at shutdown; they are redelivered");
        tasks.shutdown().await;
    }
    commit(&consumer, &shared, CommitMode::Sync);
    if let Some(timings) = &shared.timings {
        timings.flush();
    }
    tracing::info!(
        instance = %config.instance,
        write_txns = shared.write_txns.load(Ordering::Relaxed),
        dropped = shared.dropped.load(Ordering::Relaxed),
        "nostate consumer stopped"
    );
    Ok(())
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Offsets> {
        self.offsets.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A free slot, then a message: at the bound, nothing more is taken from Kafka.
async fn next<'a>(
    consumer: &'a StreamConsumer<RebalanceLog>,
    permits: &Arc<Semaphore>,
) -> anyhow::Result<(rdkafka::message::BorrowedMessage<'a>, tokio::sync::OwnedSemaphorePermit)> {
    let permit = permits.clone().acquire_owned().await.context("nostate: permits closed")?;
    let message = consumer.recv().await?;
    Ok((message, permit))
}

fn commit(consumer: &StreamConsumer<RebalanceLog>, shared: &Shared, mode: CommitMode) {
    let Ok(assignment) = consumer.assignment() else { return };
    let owned: BTreeSet<(String, i32)> =
        assignment.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect();
    let list = shared.lock().committable(&owned);
    if list.count() == 0 {
        return;
    }
    // Refused during a rebalance; the partition's next owner re-reads from the last commit.
    if let Err(error) = consumer.commit(&list, mode) {
        tracing::debug!(%error, "offset commit refused");
    }
}

/// One message: business row, lock, shipment, business row again, notification.
async fn handle(shared: &Shared, payload: &[u8], source: Source, received_at_ms: i64) {
    let Ok(event) = OrderEvent::parse(payload) else {
        tracing::warn!(topic = %source.topic, partition = source.partition, offset = source.offset, "poison message skipped");
        return;
    };
    let saga = Saga::received(&event, source, 0, i64::MAX);
    let started = Instant::now();
    match process(shared, &event, &saga).await {
        Ok(call_ms) => {
            if let Some(timings) = &shared.timings {
                timings.record(&saga.biz_id, received_at_ms, crate::timings::now_ms(), call_ms);
            }
        }
        Err(error) => {
            shared.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::error!(biz_id = %saga.biz_id, elapsed_ms = started.elapsed().as_millis() as u64, %error, "message dropped");
        }
    }
}

/// Returns the time spent in downstream calls.
async fn process(shared: &Shared, event: &OrderEvent, saga: &Saga) -> anyhow::Result<u64> {
    let now_ms = crate::timings::now_ms();
    let insert = format!(
        "INSERT INTO orders (biz_id, order_no, event_type, status, amount_cents, tracking_no, created_at_ms, updated_at_ms) \
         VALUES (?, ?, ?, 'FULFILLING', ?, NULL, ?, ?){}",
        if shared.backend == DbBackend::MySql {
            " ON DUPLICATE KEY UPDATE biz_id = biz_id"
        } else {
            " ON CONFLICT DO NOTHING"
        }
    );
    let values: Vec<Value> = vec![
        saga.biz_id.clone().into(),
        saga.order_no.clone().into(),
        saga.event_type.clone().into(),
        event.amount_cents.into(),
        now_ms.into(),
        now_ms.into(),
    ];
    shared.db.execute_raw(Statement::from_sql_and_values(shared.backend, insert, values)).await?;
    shared.write_txns.fetch_add(1, Ordering::Relaxed);
    let mut called = Duration::ZERO;
    let mut tracking_no = None;
    for call in [Call::LockStock, Call::CreateShipment] {
        for attempt in 1..=ATTEMPTS_MAX {
            let started = Instant::now();
            let answer = shared.downstreams.call(call, saga, shared.timeout).await;
            called += started.elapsed();
            match answer {
                Observation::Wms(WmsAnswer::Locked) => break,
                Observation::Logistics(LogisticsAnswer::Created { tracking_no: number }) => {
                    tracking_no = Some(number);
                    break;
                }
                other if attempt == ATTEMPTS_MAX => anyhow::bail!("{} answered {}", call.name(), other.label()),
                _ => tokio::time::sleep(RETRY_PAUSE).await,
            }
        }
    }
    let update = "UPDATE orders SET status = 'SHIPPED', tracking_no = ?, updated_at_ms = ? WHERE biz_id = ?";
    let values: Vec<Value> =
        vec![tracking_no.clone().into(), crate::timings::now_ms().into(), saga.biz_id.clone().into()];
    shared.db.execute_raw(Statement::from_sql_and_values(shared.backend, update, values)).await?;
    shared.write_txns.fetch_add(1, Ordering::Relaxed);
    let notification = serde_json::json!({
        "kind": "ORDER_SHIPPED",
        "biz_id": saga.biz_id,
        "order_no": saga.order_no,
        "event_type": saga.event_type,
        "tracking_no": tracking_no,
    })
    .to_string();
    let record = FutureRecord::to(&shared.notification_topic).key(&saga.biz_id).payload(&notification);
    shared.producer.send(record, QUEUE_WAIT).await.map_err(|(error, _)| error)?;
    Ok(u64::try_from(called.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(list: &TopicPartitionList) -> Vec<(i32, i64)> {
        list.elements().iter().map(|e| (e.partition(), e.offset().to_raw().unwrap_or(-1))).collect()
    }

    #[test]
    fn only_owned_partitions_are_committed_and_a_revoked_one_is_forgotten() {
        let mut tracked = Offsets::default();
        for offset in 10..13 {
            tracked.received("orders", 0, offset);
            tracked.received("orders", 1, offset);
        }
        tracked.finished("orders", 0, 10);
        tracked.finished("orders", 0, 12);
        for offset in 10..13 {
            tracked.finished("orders", 1, offset);
        }
        let both: BTreeSet<(String, i32)> = [("orders".to_owned(), 0), ("orders".to_owned(), 1)].into();
        // Partition 0 waits for 11; partition 1 is done through 12.
        assert_eq!(offsets(&tracked.committable(&both)), [(0, 11), (1, 13)]);
        // Partition 1 moves away: nothing of it is committed from here any more...
        let only_zero: BTreeSet<(String, i32)> = [("orders".to_owned(), 0)].into();
        assert_eq!(offsets(&tracked.committable(&only_zero)), [(0, 11)]);
        // ...and when it comes back from an earlier commit, it starts from what it receives.
        tracked.received("orders", 1, 5);
        assert_eq!(offsets(&tracked.committable(&both)), [(0, 11), (1, 5)]);
        assert_eq!(tracked.committable(&BTreeSet::new()).count(), 0);
    }
}
