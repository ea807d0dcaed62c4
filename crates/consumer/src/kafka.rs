//! The consumer's Kafka clients: how the shared [`KafkaSection`] becomes librdkafka settings,
//! and the consumer context that watches rebalances and owns the record of durable offsets.
//!
//! Offsets are committed by hand and only for messages whose rows are durable in the inbox
//! (`enable.auto.commit=false`, `enable.auto.offset.store=false`). The context keeps, per
//! assigned partition, the next offset that is safe to commit; on revoke it commits exactly
//! that, synchronously, before the partition goes. Sagas already running keep running: the
//! row, not the offset, is the record of work.
//!
//! Why a `StreamConsumer`: the pipeline waits on Kafka, on finished sagas and on shutdown at
//! once (`tokio::select!`), without a thread of its own. Rebalance callbacks run inside
//! `recv()`, which the pipeline calls whenever fewer than `consumer.batches_in_flight` batches
//! are being written and it is taking messages (paused, it calls `recv()` again under the same
//! bound), so they are served promptly, and never while a batch is half made durable. They
//! wait while that many batches are being written, or a batch's clock read is being tried
//! again: for as long as the database takes, at most the tries of a batch (the eighth failed
//! try stops the process; design.md, Gaps). They also wait while the pipeline has stopped
//! taking messages at `consumer.in_flight_max` and has not paused yet: at most
//! `consumer.pause_after_ms`, which the config check keeps below `kafka.max_poll_interval_ms`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use midflight_config::KafkaSection;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::counters::Counters;
use crate::error::Error;

/// A partition of a topic.
pub(crate) type Partition = (String, i32);

/// The consumer client the pipeline uses.
pub(crate) type Client = StreamConsumer<Context>;

/// One error line per this interval at most, per source: a broker outage makes librdkafka
/// report the same error many times a second.
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Lets one report through per interval and counts the ones it holds back.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    /// When the last report went through, and how many were held back since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    /// `Some(held back since the last report)` when this report should go through.
    pub(crate) fn admit(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (last, held_back) = &mut *state;
        if last.is_some_and(|at| at.elapsed() < ERROR_LOG_INTERVAL) {
            *held_back += 1;
            return None;
        }
        *last = Some(Instant::now());
        Some(std::mem::take(held_back))
    }
}

/// librdkafka's logs and errors as structured, throttled `tracing` events.
#[derive(Debug)]
pub(crate) struct Logging {
    owner: String,
    errors: Throttle,
}

impl Logging {
    pub(crate) fn new(owner: &str) -> Logging {
        Logging { owner: owner.to_owned(), errors: Throttle::default() }
    }
}

impl ClientContext for Logging {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        log(&self.owner, level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(held_back) = self.errors.admit() {
            tracing::warn!(owner = %self.owner, %error, reason, held_back, "kafka client error");
        }
    }
}

/// The producer of dead-letter copies and notifications.
pub(crate) type Producer = FutureProducer<Logging>;

/// The fatal error `client` hit, as `code: reason`: librdkafka's word that the client can do
/// nothing more (a fenced or refused group member, an idempotent producer out of sequence).
pub(crate) fn fatal_error<C: ClientContext>(client: &rdkafka::client::Client<C>) -> Option<String> {
    client.fatal_error().map(|(code, reason)| format!("{code:?}: {reason}"))
}

/// Watches rebalances and remembers which offsets are safe to commit.
#[derive(Debug)]
pub(crate) struct Context {
    owner: String,
    counters: Arc<Counters>,
    /// How long the metrics keep this client's latest statistics: a few of its intervals.
    statistics_ttl: Duration,
    logging: Logging,
    state: Mutex<State>,
    /// Bumped by every assignment change, so the pipeline can re-apply a pause to new partitions.
    generation: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Each assigned partition with the number of the assignment that gave it: a partition
    /// revoked and given back has a new one.
    assigned: BTreeMap<Partition, u64>,
    /// Assignments so far.
    assignments: u64,
    /// Per assigned partition: one past the last offset whose row is durable.
    durable: BTreeMap<Partition, i64>,
}

impl Context {
    pub(crate) fn new(owner: &str, counters: Arc<Counters>) -> Context {
        Context {
            owner: owner.to_owned(),
            counters,
            statistics_ttl: crate::telemetry::report_ttl(None),
            logging: Logging::new(owner),
            state: Mutex::default(),
            generation: AtomicU64::new(0),
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// An assignment number no partition is ever held under: a batch whose messages of a
    /// partition were read under two assignments commits nothing for it.
    pub(crate) const MIXED: u64 = u64::MAX;

    /// The assignment `partition` is held under now (`None`: not assigned), for
    /// [`Context::made_durable`] to compare with once the batch read from it is durable.
    pub(crate) fn held_under(&self, partition: &Partition) -> Option<u64> {
        self.state().assigned.get(partition).copied()
    }

    /// Records `next` (last durable offset + 1) for each partition still held under the
    /// assignment its batch was read under (`held`, from [`Context::held_under`]), and returns
    /// those to commit. A partition revoked while its batch was being made durable is left
    /// out, even if it was given back since: its new owner may have committed further
    /// already, and an older commit would move it back.
    pub(crate) fn made_durable(
        &self,
        next: &BTreeMap<Partition, i64>,
        held: &BTreeMap<Partition, u64>,
    ) -> TopicPartitionList {
        let mut state = self.state();
        let mut list = TopicPartitionList::new();
        for (partition, &offset) in next {
            if state.assigned.get(partition).is_none_or(|now| held.get(partition) != Some(now)) {
                tracing::debug!(topic = %partition.0, partition = partition.1, "durable batch of a partition revoked since it was read; not committing");
                continue;
            }
            let slot = state.durable.entry(partition.clone()).or_insert(offset);
            *slot = (*slot).max(offset);
            add(&mut list, partition, *slot);
        }
        list
    }

    /// Every durable offset of the current assignment.
    pub(crate) fn durable(&self) -> TopicPartitionList {
        let state = self.state();
        let mut list = TopicPartitionList::new();
        for (partition, offset) in &state.durable {
            add(&mut list, partition, *offset);
        }
        list
    }

    /// The current assignment as a list (for pause and resume).
    pub(crate) fn assignment(&self) -> TopicPartitionList {
        let state = self.state();
        let mut list = TopicPartitionList::new();
        for (topic, partition) in state.assigned.keys() {
            list.add_partition(topic, *partition);
        }
        list
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves plain maps behind, still usable.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn revoked(&self, consumer: &BaseConsumer<Context>, list: &TopicPartitionList) {
        let partitions = partitions(list);
        let lost = consumer.assignment_lost();
        let commit = self.release(&partitions);
        Counters::add(&self.counters.partitions_revoked, partitions.len() as u64);
        self.generation.fetch_add(1, Ordering::Relaxed);
        // The lab's benchmark reads this line and "partitions assigned" (message and field) to
        // measure how long partitions go without an owner; keep them as they are.
        tracing::info!(owner = %self.owner, revoked = %describe(&partitions), lost, "partitions revoked");
        if lost || commit.count() == 0 {
            // A lost assignment belongs to someone else already: a commit would be refused.
            return;
        }
        let result = consumer.commit(&commit, CommitMode::Sync);
        Counters::add(if result.is_ok() { &self.counters.commits } else { &self.counters.commit_failures }, 1);
        if let Err(error) = result {
            tracing::warn!(owner = %self.owner, %error, "commit on revoke failed; the new owner re-reads from the last commit and skips existing rows");
        }
    }

    /// Forgets `partitions` (revoked) and returns their durable offsets, to commit.
    fn release(&self, partitions: &[Partition]) -> TopicPartitionList {
        let mut state = self.state();
        let mut commit = TopicPartitionList::new();
        for partition in partitions {
            state.assigned.remove(partition);
            if let Some(offset) = state.durable.remove(partition) {
                add(&mut commit, partition, offset);
            }
        }
        Counters::set(&self.counters.partitions_assigned, state.assigned.len() as u64);
        commit
    }

    fn assigned(&self, list: &TopicPartitionList) {
        let partitions = partitions(list);
        self.hold(&partitions);
        self.generation.fetch_add(1, Ordering::Relaxed);
        tracing::info!(owner = %self.owner, assigned = %describe(&partitions), "partitions assigned");
    }

    /// Records `partitions` as held under a new assignment.
    fn hold(&self, partitions: &[Partition]) {
        let mut state = self.state();
        state.assignments += 1;
        let assignment = state.assignments;
        state.assigned.extend(partitions.iter().map(|partition| (partition.clone(), assignment)));
        Counters::set(&self.counters.partitions_assigned, state.assigned.len() as u64);
    }
}

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.logging.log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.logging.error(error, reason);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        crate::telemetry::statistics(&statistics, self.statistics_ttl);
    }
}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(list) => self.revoked(consumer, list),
            Rebalance::Assign(_) => {}
            Rebalance::Error(error) => tracing::warn!(owner = %self.owner, %error, "rebalance failed"),
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            self.assigned(list);
        }
    }
}

/// The consumer of the order topic, not yet subscribed.
pub(crate) fn consumer(section: &KafkaSection, owner: &str, mut context: Context) -> Result<Client, Error> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &section.bootstrap_servers)
        .set("group.id", &section.group_id)
        .set("client.id", owner)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // A new group starts at the beginning: at-least-once means no message is skipped.
        .set("auto.offset.reset", "earliest")
        .set("max.poll.interval.ms", section.max_poll_interval_ms.to_string())
        .set("group.protocol", &section.group_protocol);
    if section.group_protocol == "classic" {
        // Only moved partitions are revoked, so a join does not stop every instance's fetching.
        config
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", section.session_timeout_ms.to_string());
    }
    // Under KIP-848's `consumer` protocol the broker assigns (always incrementally) and owns the
    // session timeout; librdkafka refuses both settings there.
    if section.group_protocol != "classic" && section.session_timeout_ms != KafkaSection::default().session_timeout_ms {
        tracing::warn!(
            session_timeout_ms = section.session_timeout_ms,
            group_protocol = %section.group_protocol,
            "kafka.session_timeout_ms is not used under this group protocol: the broker's group.consumer.session.timeout.ms applies"
        );
    }
    if let Some(instance_id) = &section.group_instance_id {
        config.set("group.instance.id", instance_id);
    }
    // Consumer lag for the metrics; `kafka.properties` may change the interval (0 turns it off).
    config.set("statistics.interval.ms", crate::telemetry::STATISTICS_INTERVAL_MS.to_string());
    for (key, value) in &section.properties {
        config.set(key, value);
    }
    context.statistics_ttl = crate::telemetry::report_ttl(config.get("statistics.interval.ms"));
    config.create_with_context(context).map_err(Error::kafka("create consumer"))
}

/// The idempotent producer of dead-letter copies and notifications.
pub(crate) fn producer(section: &KafkaSection, owner: &str, delivery_timeout_ms: u64) -> Result<Producer, Error> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &section.bootstrap_servers)
        .set("client.id", format!("{owner}-producer"))
        // No duplicates or reordering from the producer's own retries.
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", delivery_timeout_ms.to_string());
    for (key, value) in &section.properties {
        config.set(key, value);
    }
    config.create_with_context(Logging::new(owner)).map_err(Error::kafka("create producer"))
}

fn add(list: &mut TopicPartitionList, (topic, partition): &Partition, offset: i64) {
    // Adding a fresh partition with an explicit offset cannot fail.
    let _ = list.add_partition_offset(topic, *partition, Offset::Offset(offset));
}

fn partitions(list: &TopicPartitionList) -> Vec<Partition> {
    list.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect()
}

fn describe(partitions: &[Partition]) -> String {
    let parts: Vec<String> = partitions.iter().map(|(topic, partition)| format!("{topic}/{partition}")).collect();
    parts.join(",")
}

fn log(owner: &str, level: RDKafkaLogLevel, facility: &str, message: &str) {
    match level {
        RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
            tracing::error!(owner, facility, message, "librdkafka")
        }
        RDKafkaLogLevel::Warning => tracing::warn!(owner, facility, message, "librdkafka"),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => tracing::info!(owner, facility, message, "librdkafka"),
        RDKafkaLogLevel::Debug => tracing::debug!(owner, facility, message, "librdkafka"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(list: &TopicPartitionList) -> Vec<(String, i32, i64)> {
        let offset = |e: &rdkafka::topic_partition_list::TopicPartitionListElem<'_>| match e.offset() {
            Offset::Offset(offset) => offset,
            other => panic!("not an offset: {other:?}"),
        };
        list.elements().iter().map(|e| (e.topic().to_owned(), e.partition(), offset(e))).collect()
    }

    /// A batch's offsets are committed only for partitions held under the assignment it was
    /// read under, never lower than one committed before; a partition revoked while its batch
    /// was written, even if given back since, is left to the owner that had it meanwhile.
    #[test]
    fn durable_offsets_are_committed_only_under_the_assignment_read_under() {
        let context = Context::new("c1", Arc::default());
        let (p0, p1) = (("orders".to_owned(), 0), ("orders".to_owned(), 1));
        context.hold(&[p0.clone(), p1.clone()]);
        let holding = |partitions: &[&Partition]| -> BTreeMap<Partition, u64> {
            partitions.iter().filter_map(|p| context.held_under(p).map(|a| ((*p).clone(), a))).collect()
        };
        let first = holding(&[&p0, &p1]);
        let next = BTreeMap::from([(p0.clone(), 10), (p1.clone(), 20)]);
        assert_eq!(offsets(&context.made_durable(&next, &first)), [("orders".into(), 0, 10), ("orders".into(), 1, 20)]);
        // An older batch made durable after a newer one commits the newer offset again.
        let older = BTreeMap::from([(p0.clone(), 5)]);
        assert_eq!(offsets(&context.made_durable(&older, &first)), [("orders".into(), 0, 10)]);

        // p1 is revoked (its durable offset goes with the revoke's commit) and given back.
        assert_eq!(offsets(&context.release(std::slice::from_ref(&p1))), [("orders".into(), 1, 20)]);
        context.hold(std::slice::from_ref(&p1));
        let stale = BTreeMap::from([(p0.clone(), 30), (p1.clone(), 25)]);
        assert_eq!(offsets(&context.made_durable(&stale, &first)), [("orders".into(), 0, 30)], "p1 left out");
        let now = holding(&[&p0, &p1]);
        let fresh = BTreeMap::from([(p1.clone(), 40)]);
        assert_eq!(offsets(&context.made_durable(&fresh, &now)), [("orders".into(), 1, 40)]);

        // Revoked and not given back: nothing to commit for it.
        context.release(std::slice::from_ref(&p0));
        assert_eq!(offsets(&context.made_durable(&BTreeMap::from([(p0.clone(), 50)]), &now)), []);
        assert_eq!(context.held_under(&p0), None);
        // A batch that read a partition under two assignments commits nothing for it.
        let mixed = BTreeMap::from([(p1.clone(), Context::MIXED)]);
        assert_eq!(offsets(&context.made_durable(&BTreeMap::from([(p1.clone(), 60)]), &mixed)), []);
    }
}
