//! The consumer's main loop: take a batch from Kafka, make it durable in the inbox (one
//! transaction; dead-letter copies delivered first), only then commit its offsets, then hand
//! each row to the scheduler: fresh rows are driven, redelivered rows are left alone unless
//! their lease expired, in which case they go through the same claim as recovery.
//!
//! With `open_in_inbox`, a batch's transaction also writes the first step of each fresh saga
//! that no earlier unfinished saga of its order holds back (`Store::receive`): the planner's
//! business write and WMS intent; that saga's drive then starts with the WMS call.
//!
//! Up to `batches_in_flight` batches are written at once, each as a task of its own, while the
//! loop gathers the next. Their results are taken in the order the batches were read: a batch's
//! offsets are committed, and its sagas scheduled, only after every batch before it, so a
//! commit never passes a message that is not durable, and sagas of one order still reach the
//! scheduler in arrival order. A biz_id is in at most one batch being written and never both
//! there and in the scheduler (a later copy counts as a duplicate in flight). A batch's order
//! check cannot see rows of the batches written beside it; its sagas whose order is also in one
//! of those are neither opened in the inbox nor marked checked: the driver checks when it starts.
//!
//! Flow control: at `in_flight_max` sagas the loop stops taking messages, and takes them again
//! at `resume_below`; what librdkafka has fetched meanwhile waits in its queue. A stop longer
//! than `pause_after_ms` pauses the assigned partitions (fetching stops and the queue is
//! dropped, `recv` serves rebalances again) until the same `resume_below`.
//!
//! Shutdown: stop taking messages, stop the drivers (each stops before its next call and
//! releases its lease), release the leases of queued sagas that never started, wait for running
//! sagas up to `shutdown_deadline_ms`, commit what is durable, leave the group.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use midflight_driver::Downstream;
use midflight_model::{Call, Change, PayloadError, Rules, Saga, Status};
use midflight_store::{Arrival, Received, Store};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use tokio_util::sync::CancellationToken;

use crate::config::ConsumerSection;
use crate::counters::Counters;
use crate::error::Error;
use crate::inbox::{self, CopyFailed, Incoming, Poison};
use crate::kafka::{Client, Partition, Producer, Throttle};
use crate::scheduler::{Ended, Job, JobKind, Scheduler};

/// Attempts at making one batch durable before `run` gives up (and the process restarts from
/// the last committed offsets). Eight attempts with the backoff below wait 9 s in all, so a
/// database that is gone for a few seconds (a failover, a proxy restart) does not stop the
/// process; five (3 s) stopped both consumers of the database-loss scenario when its 5 s cut
/// met a batch being written.
const BATCH_ATTEMPTS_MAX: u32 = 8;
/// A batch takes no more messages once their payloads reach this many bytes. A row keeps at
/// most [`midflight_model::limits::PAYLOAD_BYTES_MAX`] (64 KiB) of its payload, and the inbox
/// insert pads its rows to a power of two by repeating the row with the shortest payload, which
/// adds at most as many bytes again. A payload that is not UTF-8 is kept as text, up to three
/// times its bytes, so one statement carries at most about 8 MiB of payloads (about 4 MiB of
/// text ones), below MariaDB's default `max_allowed_packet` (16 MiB) and MySQL 8's (64 MiB).
const BATCH_PAYLOAD_BYTES_MAX: usize = 2 * 1024 * 1024;
/// First wait between attempts; doubled each time.
const BATCH_BACKOFF_BASE: Duration = Duration::from_millis(200);
/// Longest wait between two attempts.
const BATCH_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Longest a try at the database may go unanswered before it counts as failed and is made
/// again (a batch's try also waits for its dead-letter deliveries, up to `delivery_timeout_ms`
/// more). A statement that never answers (a connection black-holed by the network) would
/// otherwise hold the loop, and with it the group's rebalances, until the kernel gave up.
/// The outcome of a try cut off is unknown, as after a lost commit: the next try finds the
/// rows it may have written.
const DATABASE_TRY_DEADLINE: Duration = Duration::from_secs(30);
/// Leases of never-started sagas released at once during shutdown.
const RELEASE_CONCURRENCY: usize = 16;

/// Everything the loop owns.
pub(crate) struct Pipeline<D> {
    pub consumer: Client,
    pub producer: Producer,
    pub store: Store,
    pub scheduler: Scheduler<D>,
    pub settings: ConsumerSection,
    pub dead_letter_topic: String,
    pub owner: String,
    pub actor: String,
    pub lease_ms: i64,
    pub counters: Arc<Counters>,
    pub paused: bool,
    /// Since when the loop has taken no messages for being at `in_flight_max`; `None` while it
    /// takes them.
    pub full_since: Option<tokio::time::Instant>,
    /// The rebalance generation the pause state was last applied to.
    pub generation: u64,
    pub errors: Throttle,
    /// Batches being written, oldest first.
    pub pending: VecDeque<Pending>,
    /// A batch failed or was interrupted: no later batch is committed or scheduled.
    pub broken: bool,
    /// Fresh rows of batches written after a broken one, whose leases shutdown releases.
    pub orphans: Vec<Saga>,
    /// Cancelled by the relay when the producer (shared with the dead-letter copies) hit a
    /// fatal error: nothing more can be published by this process.
    pub producer_fatal: CancellationToken,
}

enum Event {
    Stop,
    /// The stop at `in_flight_max` has lasted `pause_after_ms`.
    PauseDue,
    ProducerFatal,
    Written(Result<Option<Durable>, Error>),
    Ended(Ended),
    Message(KafkaResult<Incoming>),
}

/// A batch being made durable by a task of its own.
pub(crate) struct Pending {
    write: tokio::task::JoinHandle<Result<Option<Durable>, Error>>,
    /// What to commit once it is durable.
    next: BTreeMap<Partition, i64>,
    /// The assignment each of its partitions was held under when it was read.
    held: BTreeMap<Partition, u64>,
    /// The biz_id and order of each row it writes.
    rows: Vec<(String, String)>,
    /// Its orders that also have rows in a batch written beside it.
    overlapping: HashSet<String>,
    messages: usize,
    started: Instant,
}

/// A batch made durable.
pub(crate) struct Durable {
    arrivals: Vec<Arrival>,
    /// Taken before the first try at writing the batch: no fresh row's lease (nor its opened
    /// intent's clock, read just before the batch was parsed) began much earlier.
    leased_at: Instant,
    /// Database-clock reading taken just before the batch was parsed.
    now_ms: i64,
    parked: HashSet<String>,
    /// Of `parked`, the rows whose dead-letter copy can never be delivered.
    copies_failed: usize,
    /// Fresh rows whose order may have an earlier unfinished saga: their drivers ask again
    /// when they start; the others skip the question (one query for the batch instead).
    maybe_blocked: HashSet<String>,
    /// Fresh rows whose first step the inbox wrote, with the call that step recorded the intent of.
    opened: HashMap<String, Call>,
}

/// A poison message of a batch: its index, the index of the parked row it became, and why.
struct Poisoned {
    message: usize,
    saga: usize,
    error: PayloadError,
}

/// What a batch's write needs, owned: it runs as a task beside the loop.
struct Writer {
    store: Store,
    producer: Producer,
    dead_letter_topic: String,
    owner: String,
    actor: String,
    lease_ms: i64,
    /// The first steps the inbox may write, by biz_id (`midflight_driver::opening`).
    openings: HashMap<String, Opening>,
    /// How long one try may take: its dead-letter deliveries, then its transaction.
    try_deadline: Duration,
}

/// A first step the inbox may write, and the call it records the intent of.
#[derive(Debug, Clone, PartialEq)]
struct Opening {
    change: Change,
    call: Call,
}

impl AsRef<Change> for Opening {
    fn as_ref(&self) -> &Change {
        &self.change
    }
}

impl<D: Downstream> Pipeline<D> {
    /// Runs until `shutdown` is cancelled (`Ok`) or a batch cannot be made durable (`Err`).
    pub(crate) async fn run(&mut self, shutdown: &CancellationToken) -> Result<(), Error> {
        loop {
            self.flow();
            // Paused, `recv` is polled for rebalances. A partition assigned inside it is paused
            // only by the next `flow`, so its first messages can still arrive.
            let taking = self.full_since.is_none() || self.paused;
            let room = self.pending.len() < self.settings.batches_in_flight && taking;
            let pause_at = self.pause_at();
            let event = tokio::select! {
                biased;
                () = shutdown.cancelled() => Event::Stop,
                () = self.producer_fatal.cancelled() => Event::ProducerFatal,
                written = oldest(&mut self.pending) => Event::Written(written),
                Some(ended) = self.scheduler.join_next() => Event::Ended(ended),
                message = recv(&self.consumer), if room => Event::Message(message),
                () = tokio::time::sleep_until(pause_at.unwrap_or_else(tokio::time::Instant::now)),
                    if pause_at.is_some() => Event::PauseDue,
            };
            match event {
                Event::Stop => return Ok(()),
                Event::PauseDue => {}
                Event::ProducerFatal => {
                    let fatal = crate::kafka::fatal_error(rdkafka::producer::Producer::client(&self.producer));
                    let reason = format!("producer: {}", fatal.as_deref().unwrap_or("a fatal error"));
                    return Err(Error::KafkaFatal { reason });
                }
                Event::Written(result) => {
                    if !self.written(result)? {
                        return Ok(());
                    }
                }
                Event::Ended(ended) => self.scheduler.ended(ended),
                Event::Message(Ok(first)) => {
                    let (batch, held) = self.collect(first).await?;
                    self.launch(batch, held, shutdown).await?;
                }
                Event::Message(Err(error)) => self.consumer_error(&error)?,
            }
        }
    }

    /// Messages in batches being written.
    fn pending_messages(&self) -> usize {
        self.pending.iter().map(|p| p.messages).sum()
    }

    /// Gathers more messages after `first`, for up to `batch_linger_ms` while an earlier batch
    /// is being written (`batch_linger_idle_ms` while none is; both 0 by default: only what has
    /// already been fetched), up to `batch_max` or the room left below `in_flight_max`, whichever is
    /// less: a batch never carries the in-flight count far past its bound (only the first
    /// messages of a partition assigned while paused can, until the next `flow` pauses it
    /// too; a pause drops what librdkafka had fetched). Nor does it take more once its
    /// payloads reach [`BATCH_PAYLOAD_BYTES_MAX`].
    ///
    /// Also returns, per partition, the assignment its messages were read under (rebalance
    /// callbacks run inside `recv`, so one can come between two messages of a batch): a
    /// partition revoked and given back between two of its messages is marked so that the
    /// batch commits nothing for it ([`crate::kafka::Context::made_durable`]).
    ///
    /// A fatal error of the client while gathering fails the call: the batch is dropped
    /// unwritten and uncommitted, so its messages are read again by whoever takes the
    /// partitions.
    async fn collect(&self, first: Incoming) -> Result<(Vec<Incoming>, BTreeMap<Partition, u64>), Error> {
        let room = self.settings.in_flight_max.saturating_sub(self.scheduler.len() + self.pending_messages());
        let size_max = room.clamp(1, self.settings.batch_max);
        let mut batch = Vec::with_capacity(size_max);
        let mut held = BTreeMap::new();
        let context = self.consumer.context();
        let read_under = |message: &Incoming, held: &mut BTreeMap<Partition, u64>| {
            let partition = (message.topic.clone(), message.partition);
            // Read with no assignment (not expected: a partition is recorded before its first
            // message comes) is as good as read under two.
            let now = context.held_under(&partition).unwrap_or(crate::kafka::Context::MIXED);
            let slot = held.entry(partition).or_insert(now);
            if *slot != now {
                *slot = crate::kafka::Context::MIXED;
            }
        };
        read_under(&first, &mut held);
        let mut bytes = first.payload.len();
        batch.push(first);
        let linger_ms =
            if self.pending.is_empty() { self.settings.batch_linger_idle_ms } else { self.settings.batch_linger_ms };
        // A deadline already reached still takes the messages that are ready: `timeout_at`
        // polls `recv` before it looks at the clock.
        let linger_until = tokio::time::Instant::now() + Duration::from_millis(linger_ms);
        while batch.len() < size_max && bytes < BATCH_PAYLOAD_BYTES_MAX {
            match tokio::time::timeout_at(linger_until, recv(&self.consumer)).await {
                Ok(Ok(message)) => {
                    read_under(&message, &mut held);
                    bytes += message.payload.len();
                    batch.push(message);
                }
                Ok(Err(error)) => self.consumer_error(&error)?,
                Err(_) => break,
            }
        }
        Counters::add(&self.counters.received, batch.len() as u64);
        Ok((batch, held))
    }

    /// librdkafka reports fetch and broker trouble through `recv`, and retries by itself. A
    /// fatal error (the group fenced this static member, or refused it for good) leaves the
    /// client with nothing assigned and unusable: it is returned, so the process ends and is
    /// restarted, instead of idling on as if healthy.
    fn consumer_error(&self, error: &rdkafka::error::KafkaError) -> Result<(), Error> {
        Counters::add(&self.counters.kafka_errors, 1);
        let fatal = crate::kafka::fatal_error(self.consumer.client());
        if fatal.is_some() || matches!(error, rdkafka::error::KafkaError::MessageConsumptionFatal(_)) {
            let reason = fatal.unwrap_or_else(|| error.to_string());
            tracing::error!(owner = %self.owner, %reason, "kafka consumer fatal error");
            return Err(Error::KafkaFatal { reason });
        }
        if let Some(held_back) = self.errors.admit() {
            tracing::warn!(owner = %self.owner, %error, held_back, "kafka consumer error");
        }
        Ok(())
    }

    /// Parses `batch` and starts writing it beside the loop. Copies of sagas already in flight
    /// here (in the scheduler or in a batch being written) are counted and left out.
    async fn launch(
        &mut self,
        batch: Vec<Incoming>,
        held: BTreeMap<Partition, u64>,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        let clock = || async { Ok(self.store.now_ms().await?) };
        let Some(now_ms) = retrying(&batch, shutdown, DATABASE_TRY_DEADLINE, clock).await? else {
            return Ok(());
        };
        let in_writes: HashSet<&str> =
            self.pending.iter().flat_map(|p| p.rows.iter().map(|(id, _)| id.as_str())).collect();
        let pending_orders: HashSet<&str> =
            self.pending.iter().flat_map(|p| p.rows.iter().map(|(_, order)| order.as_str())).collect();
        let mut sagas = Vec::with_capacity(batch.len());
        let mut poisoned = Vec::new();
        let mut duplicates = 0;
        for (index, message) in batch.iter().enumerate() {
            let arrived = inbox::arrive(message, now_ms, self.settings.saga_deadline_ms);
            let biz_id = arrived.saga.biz_id.as_str();
            if self.scheduler.contains(biz_id) || in_writes.contains(biz_id) {
                duplicates += 1;
                continue;
            }
            // A repeat inside the batch goes to the inbox too: the insert tells it apart.
            if let Some(error) = arrived.poison {
                poisoned.push(Poisoned { message: index, saga: sagas.len(), error });
            }
            sagas.push(arrived.saga);
        }
        Counters::add(&self.counters.duplicates_in_flight, duplicates);
        let rows: Vec<(String, String)> = sagas.iter().map(|s| (s.biz_id.clone(), s.order_no.clone())).collect();
        let overlapping: HashSet<String> =
            rows.iter().filter(|(_, order)| pending_orders.contains(order.as_str())).map(|(_, o)| o.clone()).collect();
        let openings = if self.settings.open_in_inbox {
            openings(&sagas, &overlapping, now_ms, self.scheduler.driver().rules())
        } else {
            HashMap::new()
        };
        let writer = Writer {
            store: self.store.clone(),
            producer: self.producer.clone(),
            dead_letter_topic: self.dead_letter_topic.clone(),
            owner: self.owner.clone(),
            actor: self.actor.clone(),
            lease_ms: self.lease_ms,
            openings,
            try_deadline: DATABASE_TRY_DEADLINE + Duration::from_millis(self.settings.delivery_timeout_ms),
        };
        let next = inbox::next_offsets(&batch);
        let messages = batch.len();
        let write = tokio::spawn(writer.make_durable(batch, sagas, poisoned, now_ms, shutdown.clone()));
        self.pending.push_back(Pending { write, next, held, rows, overlapping, messages, started: Instant::now() });
        Ok(())
    }

    /// The oldest batch's write ended: commit its offsets and schedule its sagas. `false` if
    /// shutdown interrupted it (nothing after it is taken).
    fn written(&mut self, result: Result<Option<Durable>, Error>) -> Result<bool, Error> {
        let Some(batch) = self.pending.pop_front() else { return Ok(true) };
        if self.broken {
            if let Ok(Some(durable)) = result {
                self.orphans.extend(durable.arrivals.into_iter().filter_map(|arrival| match arrival {
                    Arrival::Fresh(saga) => Some(saga),
                    Arrival::Existing(_) | Arrival::Unreadable { .. } => None,
                }));
            }
            return Ok(false);
        }
        let mut durable = match result {
            Ok(Some(durable)) => durable,
            Ok(None) => {
                self.broken = true;
                return Ok(false);
            }
            Err(error) => {
                self.broken = true;
                return Err(error);
            }
        };
        tracing::debug!(
            messages = batch.messages,
            durable_ms = batch.started.elapsed().as_millis() as u64,
            beside = self.pending.len(),
            "batch made durable"
        );
        self.commit(&batch.next, &batch.held);
        Counters::add(&self.counters.batches, 1);
        Counters::add(&self.counters.parked, durable.parked.len() as u64);
        Counters::add(&self.counters.dead_letter_failed, durable.copies_failed as u64);
        crate::telemetry::arrived(Status::Parked, durable.parked.len());
        for arrival in &durable.arrivals {
            if let Arrival::Fresh(saga) = arrival
                && batch.overlapping.contains(&saga.order_no)
            {
                durable.maybe_blocked.insert(saga.biz_id.clone());
            }
        }
        self.schedule(durable);
        Ok(true)
    }

    /// Commits offsets of a durable batch, asynchronously: a failed commit is superseded by
    /// the next one, and by the synchronous commits on revoke and shutdown.
    fn commit(&self, next: &BTreeMap<Partition, i64>, held: &BTreeMap<Partition, u64>) {
        let list = self.consumer.context().made_durable(next, held);
        if list.count() == 0 {
            return;
        }
        match self.consumer.commit(&list, CommitMode::Async) {
            Ok(()) => Counters::add(&self.counters.commits, 1),
            Err(error) => {
                Counters::add(&self.counters.commit_failures, 1);
                tracing::warn!(owner = %self.owner, %error, "offset commit not sent; the next one carries it");
            }
        }
    }

    fn schedule(&mut self, durable: Durable) {
        let Durable { arrivals, leased_at, now_ms, parked, maybe_blocked, mut opened, .. } = durable;
        for arrival in arrivals {
            match arrival {
                Arrival::Fresh(saga) => {
                    Counters::add(&self.counters.fresh, 1);
                    let opened = opened.remove(&saga.biz_id);
                    Counters::add(&self.counters.opened, u64::from(opened.is_some()));
                    crate::telemetry::arrived(Status::Received, 1);
                    tracing::debug!(biz_id = %saga.biz_id, topic = %saga.source.topic, partition = saga.source.partition,
                        offset = saga.source.offset, "saga received");
                    let (biz_id, order_no) = (saga.biz_id.clone(), saga.order_no.clone());
                    self.scheduler.accept(Job {
                        biz_id,
                        order_no,
                        kind: JobKind::Fresh {
                            order_checked: !maybe_blocked.contains(&saga.biz_id),
                            opened,
                            saga: Box::new(saga),
                            leased_at,
                        },
                    });
                }
                Arrival::Existing(saga) if parked.contains(&saga.biz_id) => {}
                Arrival::Existing(saga) => self.redelivered(saga, now_ms),
                Arrival::Unreadable { biz_id, error } => {
                    Counters::add(&self.counters.unreadable, 1);
                    tracing::error!(%biz_id, %error, "redelivered saga's row cannot be read; left for a person to repair");
                }
            }
        }
    }

    /// A message whose row existed: leave it, or claim it if its owner's lease has expired.
    fn redelivered(&mut self, saga: Saga, now_ms: i64) {
        let busy = saga.status.is_terminal() || saga.lease_live(now_ms);
        if busy || self.scheduler.contains(&saga.biz_id) {
            tracing::debug!(biz_id = %saga.biz_id, status = %saga.status, topic = %saga.source.topic,
                partition = saga.source.partition, offset = saga.source.offset, "redelivered saga left alone");
            let counter = if busy { &self.counters.skipped } else { &self.counters.duplicates_in_flight };
            Counters::add(counter, 1);
            return;
        }
        tracing::info!(biz_id = %saga.biz_id, status = %saga.status, "redelivered saga with an expired lease; claiming");
        Counters::add(&self.counters.claims, 1);
        self.scheduler.accept(Job { biz_id: saga.biz_id, order_no: saga.order_no, kind: JobKind::Claim });
    }

    /// Stops taking messages at `in_flight_max` and takes them again at `resume_below`; pauses
    /// the assignment once a stop has lasted `pause_after_ms` and resumes it at the same
    /// `resume_below`. Re-pauses partitions assigned while paused, and resumes partitions
    /// assigned while not: librdkafka keeps an application's pause on a partition across its
    /// revocation and reassignment (a partition unassigned while paused and assigned again is
    /// not fetched until resumed), and a resume covers only the assignment of its day.
    fn flow(&mut self) {
        let in_flight = self.scheduler.len() + self.pending_messages();
        let generation = self.consumer.context().generation();
        let moved = generation != self.generation;
        self.generation = generation;
        let mut changed = false;
        if self.full_since.is_some() && in_flight <= self.settings.resume_below {
            self.full_since = None;
            if self.paused {
                self.paused = false;
                changed = true;
                tracing::info!(owner = %self.owner, in_flight, "resuming partitions");
            }
        } else if self.full_since.is_none() && in_flight >= self.settings.in_flight_max {
            self.full_since = Some(tokio::time::Instant::now());
            Counters::add(&self.counters.stalls, 1);
            tracing::debug!(owner = %self.owner, in_flight, "in-flight limit reached; taking no messages");
        }
        if self.pause_at().is_some_and(|at| at <= tokio::time::Instant::now()) {
            self.paused = true;
            changed = true;
            Counters::add(&self.counters.pauses, 1);
            tracing::info!(owner = %self.owner, in_flight, "in-flight limit held past pause_after_ms; pausing partitions");
        }
        if changed || moved {
            self.apply(self.paused);
        }
    }

    /// When the current stop at `in_flight_max` pauses the partitions, if they are not paused.
    fn pause_at(&self) -> Option<tokio::time::Instant> {
        let after = Duration::from_millis(self.settings.pause_after_ms);
        self.full_since.filter(|_| !self.paused).map(|since| since + after)
    }

    fn apply(&self, pause: bool) {
        let assignment = self.consumer.context().assignment();
        let result = if pause { self.consumer.pause(&assignment) } else { self.consumer.resume(&assignment) };
        if let Err(error) = result {
            tracing::warn!(owner = %self.owner, pause, %error, "pause or resume failed");
        }
    }

    /// Waits for the batches still being written and takes each in turn as the loop would;
    /// after one that failed or was interrupted, later ones are not committed (Kafka delivers
    /// their messages again) and the leases of their fresh rows are released.
    async fn finish_writes(&mut self) {
        while !self.pending.is_empty() {
            let result = oldest(&mut self.pending).await;
            if let Err(error) = self.written(result) {
                tracing::warn!(owner = %self.owner, %error,
                    "a batch still being written at shutdown failed; it and the batches after it are not committed");
            }
        }
        release(&self.store, std::mem::take(&mut self.orphans)).await;
    }

    /// The graceful stop. `stop` is the drivers' token.
    pub(crate) async fn shutdown(mut self, stop: &CancellationToken) {
        self.finish_writes().await;
        stop.cancel();
        self.apply(true);
        let queued = self.scheduler.drain_queued();
        tracing::info!(owner = %self.owner, running = self.scheduler.running(), queued = queued.len(), "shutting down");
        release(&self.store, queued).await;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.settings.shutdown_deadline_ms);
        while self.scheduler.running() > 0 {
            match tokio::time::timeout_at(deadline, self.scheduler.join_next()).await {
                Ok(Some(ended)) => self.scheduler.ended(ended),
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(owner = %self.owner, abandoned = self.scheduler.running(),
                        "shutdown deadline passed; abandoning running sagas to recovery (their leases expire)");
                    self.scheduler.abort_all().await;
                    break;
                }
            }
        }
        let Pipeline { consumer, owner, counters, .. } = self;
        // Committing synchronously and leaving the group block on the network: not on a worker.
        let left = tokio::task::spawn_blocking(move || {
            let durable = consumer.context().durable();
            if durable.count() > 0 {
                let result = consumer.commit(&durable, CommitMode::Sync);
                Counters::add(if result.is_ok() { &counters.commits } else { &counters.commit_failures }, 1);
                if let Err(error) = result {
                    tracing::warn!(owner = %owner, %error, "final offset commit failed; the next owner re-reads and skips existing rows");
                }
            }
            // Dropping the consumer closes it: the revoke callback commits once more, then it leaves.
            drop(consumer);
            tracing::info!(owner = %owner, "left the consumer group");
        });
        if left.await.is_err() {
            tracing::warn!("leaving the consumer group panicked");
        }
    }
}

impl Writer {
    /// [`Writer::try_once`] with bounded retries; `None` if shutdown interrupted them.
    async fn make_durable(
        self,
        batch: Vec<Incoming>,
        sagas: Vec<Saga>,
        poisoned: Vec<Poisoned>,
        now_ms: i64,
        shutdown: CancellationToken,
    ) -> Result<Option<Durable>, Error> {
        // Taken once: a row an earlier try committed (its answer lost) keeps that try's lease.
        let leased_at = Instant::now();
        let try_once = || self.try_once(&batch, &sagas, &poisoned, now_ms, leased_at);
        retrying(&batch, &shutdown, self.try_deadline, try_once).await
    }

    /// Delivers dead-letter copies, then inserts the rows in one transaction which also asks
    /// which fresh rows may wait for an earlier saga of their order and opens the others.
    async fn try_once(
        &self,
        batch: &[Incoming],
        sagas: &[Saga],
        poisoned: &[Poisoned],
        now_ms: i64,
        leased_at: Instant,
    ) -> Result<Durable, Error> {
        let poison: Vec<Poison<'_>> = poisoned
            .iter()
            .map(|p| Poison { message: &batch[p.message], saga: &sagas[p.saga], error: &p.error })
            .collect();
        let failed = inbox::dead_letter(&self.producer, &self.dead_letter_topic, &poison).await?;
        let parked = poison.iter().map(|p| p.saga.biz_id.clone()).collect();
        // A copy that can never be delivered does not hold the batch: its row says so.
        let noted: Vec<Saga>;
        let sagas = if failed.is_empty() {
            sagas
        } else {
            let mut copy = sagas.to_vec();
            for CopyFailed { poison: n, error } in &failed {
                let note = format!("; its dead-letter copy to {} cannot be delivered: {error}", self.dead_letter_topic);
                copy[poisoned[*n].saga].last_error.get_or_insert_default().push_str(&note);
            }
            noted = copy;
            &noted
        };
        let Received { arrivals, maybe_blocked, opened } =
            self.store.receive(sagas, &self.owner, self.lease_ms, &self.actor, now_ms, &self.openings).await?;
        // Each opened saga with the call its drive starts with; its step counted as a drive's
        // would be (a biz_id twice in a batch is opened once).
        let elapsed = leased_at.elapsed();
        let mut calls = HashMap::with_capacity(opened.len());
        for saga in sagas.iter().filter(|saga| opened.contains(&saga.biz_id)) {
            if let Some(opening) = self.openings.get(&saga.biz_id)
                && calls.insert(saga.biz_id.clone(), opening.call).is_none()
            {
                midflight_driver::telemetry::opened(saga, &opening.change, elapsed);
            }
        }
        let opened = calls;
        Ok(Durable { arrivals, leased_at, now_ms, parked, copies_failed: failed.len(), maybe_blocked, opened })
    }
}

/// The first steps a batch's inbox transaction may write ([`midflight_driver::opening`]), by
/// biz_id, and the call each records the intent of. None for a saga whose order is in
/// `overlapping` (it also has rows in a batch being written beside this one, which this
/// batch's transaction cannot see when it asks about earlier sagas of the order).
fn openings(sagas: &[Saga], overlapping: &HashSet<String>, now_ms: i64, rules: &Rules) -> HashMap<String, Opening> {
    let mut openings = HashMap::new();
    for saga in sagas.iter().filter(|saga| !overlapping.contains(&saga.order_no)) {
        if let Some((change, call)) = midflight_driver::opening(saga, now_ms, rules) {
            openings.insert(saga.biz_id.clone(), Opening { change, call });
        }
    }
    openings
}

/// `attempt` until it succeeds, with bounded retries and a doubling backoff ([`retry_after`]);
/// a try unanswered after `deadline` counts as failed. `None` if shutdown interrupted the wait
/// between two tries. Both steps of making `batch` durable go through this: reading the clock
/// to parse it, and writing it.
async fn retrying<T, F, Fut>(
    batch: &[Incoming],
    shutdown: &CancellationToken,
    deadline: Duration,
    mut attempt: F,
) -> Result<Option<T>, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut tries = 1;
    loop {
        let error = match tokio::time::timeout(deadline, attempt()).await {
            Ok(Ok(value)) => return Ok(Some(value)),
            Ok(Err(error)) => error,
            Err(_) => Error::Write(format!("no answer within {} ms; its outcome is unknown", deadline.as_millis())),
        };
        let backoff = retry_after(batch, tries, error)?;
        tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            () = tokio::time::sleep(backoff) => {}
        }
        tries += 1;
    }
}

/// How long to wait before attempt `attempt + 1` at making `batch` durable, or the error that
/// ends the run once the attempts are spent.
fn retry_after(batch: &[Incoming], attempt: u32, error: Error) -> Result<Duration, Error> {
    let first = &batch[0];
    if attempt >= BATCH_ATTEMPTS_MAX {
        let biz_id = inbox::arrive(first, 0, 0).saga.biz_id;
        return Err(Error::Batch {
            first: Box::new(first.reference(&biz_id)),
            messages: batch.len(),
            attempts: attempt,
            last: Box::new(error),
        });
    }
    tracing::warn!(
        topic = %first.topic, partition = first.partition, offset = first.offset, messages = batch.len(),
        attempt, %error, "batch not made durable; retrying"
    );
    Ok((BATCH_BACKOFF_BASE * 2_u32.pow((attempt - 1).min(8))).min(BATCH_BACKOFF_MAX))
}

/// The result of the oldest batch's write; never ready while no batch is being written.
async fn oldest(pending: &mut VecDeque<Pending>) -> Result<Option<Durable>, Error> {
    match pending.front_mut() {
        Some(batch) => (&mut batch.write).await.unwrap_or_else(|error| Err(Error::Write(error.to_string()))),
        None => std::future::pending().await,
    }
}

async fn recv(consumer: &Client) -> KafkaResult<Incoming> {
    consumer.recv().await.map(|message| Incoming::detach(&message))
}

/// Gives up the leases of sagas that were accepted but never started, so recovery need not
/// wait for them to expire.
async fn release(store: &Store, sagas: Vec<Saga>) {
    futures::stream::iter(sagas)
        .for_each_concurrent(RELEASE_CONCURRENCY, |saga| async move {
            if let Err(error) = store.release(&saga).await {
                tracing::warn!(biz_id = %saga.biz_id, %error, "lease of a queued saga not released; it expires instead");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message of partition 0 of "orders".
    fn message(offset: i64, payload: &str) -> Incoming {
        Incoming {
            topic: "orders".into(),
            partition: 0,
            offset,
            key: None,
            payload: payload.as_bytes().to_vec(),
            traceparent: None,
        }
    }

    fn arrived(order_no: &str, offset: i64, payload: Option<&str>) -> Saga {
        let body = format!(
            r#"{{"order_no":"{order_no}","event_type":"PAID","lines":[{{"sku":"SKU-0001","quantity":1}}],"address":{{"region":"CN-SH"}}}}"#
        );
        inbox::arrive(&message(offset, payload.unwrap_or(&body)), 1_000, 60_000).saga
    }

    #[test]
    fn a_batch_rides_out_nine_seconds_then_gives_up() {
        let batch = [message(7, "{}")];
        let waits: Vec<Duration> = (1..BATCH_ATTEMPTS_MAX)
            .map(|attempt| retry_after(&batch, attempt, Error::Write("down".into())).expect("retried"))
            .collect();
        assert_eq!(waits.iter().sum::<Duration>(), Duration::from_secs(9), "{waits:?}");
        assert_eq!(waits.last(), Some(&BATCH_BACKOFF_MAX));
        let given_up = retry_after(&batch, BATCH_ATTEMPTS_MAX, Error::Write("down".into())).expect_err("gave up");
        assert!(given_up.to_string().contains("after 8 attempts"), "{given_up}");
    }

    /// A try that never answers (a black-holed connection) is cut off at its deadline and
    /// made again, instead of holding the loop.
    #[tokio::test(start_paused = true)]
    async fn a_try_that_never_answers_is_cut_off_and_made_again() {
        let batch = [message(7, "{}")];
        let tries = std::sync::atomic::AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let answer = retrying(&batch, &CancellationToken::new(), Duration::from_secs(30), || async {
            if tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                std::future::pending::<()>().await;
            }
            Ok(42)
        })
        .await
        .expect("the second try answers");
        assert_eq!((answer, tries.into_inner()), (Some(42), 2));
        // The deadline, then the first backoff.
        assert_eq!(started.elapsed(), Duration::from_secs(30) + BATCH_BACKOFF_BASE);
    }

    #[test]
    fn sagas_of_orders_written_beside_are_not_opened() {
        let sagas = [arrived("A", 1, None), arrived("B", 2, None), arrived("C", 3, Some("{not json"))];
        let overlapping = HashSet::from(["A".to_owned()]);
        let openings = openings(&sagas, &overlapping, 1_000, &Rules::default());
        assert_eq!(openings.keys().collect::<Vec<_>>(), [&sagas[1].biz_id], "only B: A overlaps, C is parked");
        let opening = &openings[&sagas[1].biz_id];
        assert_eq!(opening.call, Call::LockStock);
        assert_eq!(opening.change.status_after(Status::Received), Status::WmsRequested);
        let all = super::openings(&sagas, &HashSet::new(), 1_000, &Rules::default());
        assert_eq!(all.len(), 2, "nothing beside: A and B");
    }
}
