//! The user's design at the time of the incident, as a consumer process, so the demo can show
//! the double deduction happening before showing it gone.
//!
//! Faithful to MISSION.md: one message at a time; step 1 writes the business row with
//! status PROCESSING under the unique biz_id; steps 2 and 3 call the WMS and logistics with a
//! key made fresh for each attempt (the WMS deduplicated on its own key anyway); DONE; then the
//! offset is committed. A failed call is retried (fresh key again). A message redelivered after
//! a crash or rebalance finds PROCESSING, cannot tell which steps happened, and runs them all
//! again. Nothing here is midflight: it is the baseline the product is measured against.

use std::time::Duration;

use anyhow::Context;
use midflight_api::client::Downstreams;
use midflight_config::{Config, DatabaseSection, GrpcClientSection, KafkaSection, RuntimeSection, TelemetrySection};
use midflight_model::{Call, Observation, OrderEvent, Saga, Source};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Message};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::membership::RebalanceLog;

/// Attempts at one message before the legacy consumer gives up on it (and leaves it PROCESSING).
const ATTEMPTS_MAX: u32 = 20;
/// Pause between attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Write transactions of this process (each statement autocommits), logged at the end so the
/// benchmark counts them instead of assuming them.
static WRITE_TXNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LegacyConfig {
    pub instance: String,
    pub kafka: KafkaSection,
    pub database: DatabaseSection,
    pub wms: GrpcClientSection,
    pub logistics: GrpcClientSection,
    pub telemetry: TelemetrySection,
    pub runtime: RuntimeSection,
    /// When set, one line per finished message is appended here (the benchmark's latencies).
    pub timings_path: Option<std::path::PathBuf>,
}

impl Config for LegacyConfig {
    fn problems(&self) -> Vec<String> {
        let mut problems = self.kafka.problems("kafka");
        problems.extend(self.database.problems("database"));
        problems.extend(self.wms.problems("wms"));
        problems.extend(self.logistics.problems("logistics"));
        problems.extend(self.telemetry.problems("telemetry"));
        problems.extend(self.runtime.problems("runtime"));
        problems
    }
}

impl midflight_service::ServiceConfig for LegacyConfig {
    fn telemetry(&self) -> &TelemetrySection {
        &self.telemetry
    }

    fn runtime(&self) -> &RuntimeSection {
        &self.runtime
    }
}

/// The old design's business table: the only state it kept. Its consumers create it when they
/// start, and so does the bench before it first counts rows, whichever comes first.
pub(crate) const TABLE: &str =
    "CREATE TABLE IF NOT EXISTS legacy_orders (biz_id VARCHAR(191) NOT NULL PRIMARY KEY, status VARCHAR(16) NOT NULL)";

pub async fn run(config: LegacyConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut options = sea_orm::ConnectOptions::new(config.database.url.clone());
    options.sqlx_logging(false);
    let db = Database::connect(options).await.context("legacy: cannot connect")?;
    db.execute_unprepared(TABLE).await?;
    let downstreams = Downstreams::connect_lazy(&config.wms, &config.logistics)?;
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.kafka.bootstrap_servers)
        .set("group.id", &config.kafka.group_id)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest");
    // librdkafka's default assignor (eager), as the user's consumer had.
    crate::membership::group_membership(&mut client, &config.kafka, None);
    // The same pass-through properties as midflight's consumer (e.g. the lab's fetch wait).
    for (key, value) in &config.kafka.properties {
        client.set(key, value);
    }
    let consumer: StreamConsumer<RebalanceLog> =
        client.create_with_context(RebalanceLog).context("legacy: cannot create the consumer")?;
    let timings = config.timings_path.as_deref().map(crate::timings::TimingsFile::open).transpose()?;
    consumer.subscribe(&[&config.kafka.order_topic])?;
    let timeout = Duration::from_millis(config.wms.request_timeout_ms);
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => break,
            message = consumer.recv() => message?,
        };
        let received_at_ms = crate::timings::now_ms();
        let payload = message.payload().unwrap_or_default().to_vec();
        let source =
            Source { topic: message.topic().to_owned(), partition: message.partition(), offset: message.offset() };
        if let Ok(event) = OrderEvent::parse(&payload) {
            let call_ms = process(&db, &downstreams, &event, source, timeout, &shutdown).await?;
            if let (Some(timings), Some(call_ms)) = (&timings, call_ms) {
                timings.record(&event.biz_id(), received_at_ms, crate::timings::now_ms(), call_ms);
            }
        }
        // The old consumer logged a failed commit and went on; the message comes back later.
        if let Err(error) = consumer.commit_message(&message, CommitMode::Sync) {
            tracing::warn!(%error, "commit failed");
        }
    }
    if let Some(timings) = &timings {
        timings.flush();
    }
    let write_txns = WRITE_TXNS.load(std::sync::atomic::Ordering::Relaxed);
    tracing::info!(instance = %config.instance, write_txns, "legacy consumer stopped");
    Ok(())
}

async fn process(
    db: &DatabaseConnection,
    downstreams: &Downstreams,
    event: &OrderEvent,
    source: Source,
    timeout: Duration,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<u64>> {
    let biz_id = event.biz_id();
    match status(db, &biz_id).await? {
        Some(status) if status == "DONE" => return Ok(None),
        // PROCESSING: a previous attempt got somewhere, nobody knows where. Run everything.
        Some(_) => tracing::warn!(biz_id, "found PROCESSING; re-running all steps"),
        None => {
            let insert = Statement::from_sql_and_values(
                db.get_database_backend(),
                "INSERT INTO legacy_orders (biz_id, status) VALUES (?, 'PROCESSING')",
                [biz_id.clone().into()],
            );
            db.execute_raw(insert).await?;
            WRITE_TXNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let mut saga = Saga::received(event, source, 0, i64::MAX);
    // Time spent in downstream calls, over every attempt (the benchmark's "not ours" time).
    let mut called = Duration::ZERO;
    for attempt in 1..=ATTEMPTS_MAX {
        if shutdown.is_cancelled() {
            return Ok(None);
        }
        // A fresh key per attempt, as the user's consumer did.
        let key = uuid::Uuid::new_v4().simple().to_string();
        saga.wms_request_id = Some(format!("legacy-{key}"));
        saga.logistics_request_id = Some(format!("legacy-{key}"));
        let started = std::time::Instant::now();
        let locked = downstreams.call(Call::LockStock, &saga, timeout).await;
        called += started.elapsed();
        if !matches!(locked, Observation::Wms(midflight_model::WmsAnswer::Locked)) {
            tracing::warn!(biz_id, attempt, answer = %locked.label(), "step 2 failed; retrying the message");
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        }
        let started = std::time::Instant::now();
        let shipped = downstreams.call(Call::CreateShipment, &saga, timeout).await;
        called += started.elapsed();
        if !matches!(shipped, Observation::Logistics(midflight_model::LogisticsAnswer::Created { .. })) {
            tracing::warn!(biz_id, attempt, answer = %shipped.label(), "step 3 failed; retrying the message");
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        }
        let done = Statement::from_sql_and_values(
            db.get_database_backend(),
            "UPDATE legacy_orders SET status = 'DONE' WHERE biz_id = ?",
            [biz_id.clone().into()],
        );
        db.execute_raw(done).await?;
        WRITE_TXNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Ok(Some(u64::try_from(called.as_millis()).unwrap_or(u64::MAX)));
    }
    tracing::error!(biz_id, "giving up; the order stays PROCESSING");
    Ok(None)
}

async fn status(db: &DatabaseConnection, biz_id: &str) -> anyhow::Result<Option<String>> {
    let query = Statement::from_sql_and_values(
        db.get_database_backend(),
        "SELECT status FROM legacy_orders WHERE biz_id = ?",
        [biz_id.into()],
    );
    let row = db.query_one_raw(query).await?;
    Ok(row.map(|r| r.try_get::<String>("", "status")).transpose()?)
}

/// Orders per legacy status, for the report.
pub async fn statuses(url: &str) -> anyhow::Result<Vec<(String, usize)>> {
    let mut options = sea_orm::ConnectOptions::new(url.to_owned());
    options.sqlx_logging(false);
    let db = Database::connect(options).await?;
    db.execute_unprepared(TABLE).await?;
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT status, COUNT(*) AS n FROM legacy_orders GROUP BY status",
        ))
        .await?;
    let mut out = Vec::new();
    for row in rows {
        out.push((row.try_get::<String>("", "status")?, row.try_get::<i64>("", "n")? as usize));
    }
    db.close().await.ok();
    Ok(out)
}
