//! An embedded Kafka for tests, benchmarks and the demo: librdkafka's mock cluster (three
//! brokers on loopback TCP), topics created through the mock's own API (it has no admin API),
//! order events produced in bulk, and topics and committed offsets read back for checks.
//!
//! The cluster is hosted by a producer client configured with `test.mock.num.brokers`, so the
//! cluster lives exactly as long as that client, which this type owns; other clients and other
//! processes join it through [`EmbeddedKafka::bootstrap_servers`]. Hosting it this way (rather
//! than `MockCluster::new`) keeps the type `Send + Sync` and gives access to the cluster handle
//! for the one setting rdkafka does not wrap: the group's initial rebalance delay.
//!
//! Reads (`read_topic`, `committed`) use blocking librdkafka calls and run on
//! the blocking pool, so they never stall a test's async workers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use midflight_config::KafkaSection;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{Client, DefaultClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

/// Brokers in the embedded cluster: as many as the user's, so leader moves and replicated
/// topics behave as they do there.
pub const BROKERS: i32 = 3;
/// Replication of the topics created here (one copy per broker).
pub const REPLICATION: i32 = 3;
/// The mock's default wait before the first assignment of a new group is 3 s; a test that
/// starts a consumer needs none of it.
pub const INITIAL_REBALANCE_DELAY_MS: i32 = 100;
/// How long a test-friendly consumer may be silent before the group evicts it. The mock waits
/// `session_timeout_ms - 1000` for members to rejoin on every join and leave, so this also sets
/// how long a rebalance takes in a test (about 2 s).
pub const TEST_SESSION_TIMEOUT_MS: u64 = 3_000;
/// Heartbeats well inside the short session above.
const TEST_HEARTBEAT_INTERVAL_MS: &str = "500";
/// The mock broker answers a fetch that finds no data only after the fetch's full wait
/// (`fetch.wait.max.ms`, 500 ms by default), even if data arrives meanwhile; a real broker
/// answers as soon as data arrives. A short wait keeps latencies measured here realistic.
pub const TEST_FETCH_WAIT_MAX_MS: &str = "10";
/// Deadline of one blocking metadata, watermark or offset request to the mock.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a read of a topic waits for one more message before giving up.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// One message to produce.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// The message key; order events are keyed by order number, so one order stays on one partition.
    pub key: Option<String>,
    pub payload: Vec<u8>,
    /// An explicit partition, or `None` to let the key decide.
    pub partition: Option<i32>,
    pub headers: Vec<(String, String)>,
}

impl Record {
    pub fn keyed(key: &str, payload: impl Into<Vec<u8>>) -> Record {
        Record { key: Some(key.to_owned()), payload: payload.into(), ..Record::default() }
    }
}

/// One message read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
}

/// A running mock cluster. Dropping it stops the brokers.
pub struct EmbeddedKafka {
    /// Hosts the cluster (and produces test input): the cluster dies with this client.
    host: FutureProducer,
    bootstrap: String,
}

impl std::fmt::Debug for EmbeddedKafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedKafka").field("bootstrap", &self.bootstrap).finish_non_exhaustive()
    }
}

impl EmbeddedKafka {
    /// Starts a cluster of [`BROKERS`] brokers with a short initial rebalance delay.
    pub fn start() -> KafkaResult<EmbeddedKafka> {
        let host: FutureProducer = ClientConfig::new()
            .set("test.mock.num.brokers", BROKERS.to_string())
            // Test input is produced in bulk; delivery is awaited together, so batching helps.
            .set("linger.ms", "5")
            .create()?;
        let bootstrap = host
            .client()
            .mock_cluster()
            .map(|cluster| cluster.bootstrap_servers())
            .ok_or_else(|| KafkaError::ClientCreation("the host client has no mock cluster".to_owned()))?;
        set_initial_rebalance_delay(host.client(), INITIAL_REBALANCE_DELAY_MS);
        Ok(EmbeddedKafka { host, bootstrap })
    }

    /// The session timeout and heartbeat interval the cluster gives members of
    /// `group.protocol=consumer` (KIP-848) groups, where the broker owns both (the mock's
    /// defaults are 30 s and 3 s). Classic groups take theirs from the client.
    pub fn set_consumer_protocol_session(&self, session_timeout_ms: i32, heartbeat_interval_ms: i32) {
        with_mock_cluster(self.host.client(), |cluster| {
            // SAFETY: `cluster` is the live mock cluster of the host client (see
            // `with_mock_cluster`); the setters take the cluster's own lock.
            #[allow(unsafe_code)]
            unsafe {
                rdkafka::bindings::rd_kafka_mock_set_group_consumer_session_timeout_ms(cluster, session_timeout_ms);
                rdkafka::bindings::rd_kafka_mock_set_group_consumer_heartbeat_interval_ms(
                    cluster,
                    heartbeat_interval_ms,
                );
            }
        });
    }

    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// Creates a topic (replicated on every broker). The mock has no CreateTopics API.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> KafkaResult<()> {
        let cluster = self
            .host
            .client()
            .mock_cluster()
            .ok_or_else(|| KafkaError::ClientCreation("the host client has no mock cluster".to_owned()))?;
        cluster.create_topic(topic, partitions, REPLICATION)
    }

    /// Creates `topics` (name, partitions): through the mock's own API on the embedded cluster
    /// (replicated on every broker), through the admin API (CreateTopics) on a cluster hosted
    /// elsewhere, each with `replication` copies there. A topic that already exists is an error
    /// there (`TopicAlreadyExists`): a run on a shared broker must not read another run's
    /// messages.
    pub async fn create_topics(&self, topics: &[(&str, i32)], replication: i32) -> KafkaResult<()> {
        if self.host.client().mock_cluster().is_some() {
            return topics.iter().try_for_each(|(topic, partitions)| self.create_topic(topic, *partitions));
        }
        let admin: AdminClient<DefaultClientContext> =
            ClientConfig::new().set("bootstrap.servers", &self.bootstrap).create()?;
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|(topic, partitions)| NewTopic::new(topic, *partitions, TopicReplication::Fixed(replication)))
            .collect();
        let options =
            AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT)).request_timeout(Some(REQUEST_TIMEOUT));
        for result in admin.create_topics(&new, &options).await? {
            result.map_err(|(_, code)| KafkaError::AdminOp(code))?;
        }
        Ok(())
    }

    /// Kafka settings for a service under test: this cluster, `group_id`, a short session so
    /// that joins and leaves complete in seconds, and a short fetch wait (see
    /// [`TEST_FETCH_WAIT_MAX_MS`]).
    pub fn section(&self, group_id: &str) -> KafkaSection {
        let mut section = KafkaSection {
            bootstrap_servers: self.bootstrap.clone(),
            group_id: group_id.to_owned(),
            session_timeout_ms: TEST_SESSION_TIMEOUT_MS,
            ..KafkaSection::default()
        };
        section.properties.insert("heartbeat.interval.ms".to_owned(), TEST_HEARTBEAT_INTERVAL_MS.to_owned());
        section.properties.insert("fetch.wait.max.ms".to_owned(), TEST_FETCH_WAIT_MAX_MS.to_owned());
        section
    }

    /// Produces `records` to `topic`, all sent before any is awaited (awaiting one by one is
    /// two orders of magnitude slower), and returns each one's (partition, offset) in order.
    pub async fn produce(&self, topic: &str, records: &[Record]) -> KafkaResult<Vec<(i32, i64)>> {
        let mut deliveries = Vec::with_capacity(records.len());
        for record in records {
            let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
            for (key, value) in &record.headers {
                headers = headers.insert(Header { key, value: Some(value.as_bytes()) });
            }
            let mut future = FutureRecord::<str, [u8]>::to(topic).payload(&record.payload).headers(headers);
            if let Some(key) = &record.key {
                future = future.key(key.as_str());
            }
            if let Some(partition) = record.partition {
                future = future.partition(partition);
            }
            deliveries.push(self.host.send_result(future).map_err(|(error, _)| error)?);
        }
        let mut placed = Vec::with_capacity(deliveries.len());
        for delivery in join_all(deliveries).await {
            let delivered = delivery.map_err(|_| KafkaError::Canceled)?.map_err(|(error, _)| error)?;
            placed.push((delivered.partition, delivered.offset));
        }
        Ok(placed)
    }

    /// The offsets `group` has committed on `topic`, per partition (partitions without a
    /// commit are left out).
    pub async fn committed(&self, group: &str, topic: &str) -> KafkaResult<BTreeMap<i32, i64>> {
        let (bootstrap, group, topic) = (self.bootstrap.clone(), group.to_owned(), topic.to_owned());
        blocking(move || {
            let consumer: BaseConsumer = reader(&bootstrap, &group).create()?;
            let mut list = TopicPartitionList::new();
            for partition in end_offsets(&consumer, &topic)?.keys() {
                list.add_partition(&topic, *partition);
            }
            let committed = consumer.committed_offsets(list, REQUEST_TIMEOUT)?;
            Ok(committed
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(offset) => Some((e.partition(), offset)),
                    _ => None,
                })
                .collect())
        })
        .await
    }

    /// The end offset (high watermark) of each partition of `topic`.
    pub async fn end_offsets(&self, topic: &str) -> KafkaResult<BTreeMap<i32, i64>> {
        let (bootstrap, topic) = (self.bootstrap.clone(), topic.to_owned());
        blocking(move || {
            let consumer: BaseConsumer = reader(&bootstrap, "midflight-end-offsets").create()?;
            end_offsets(&consumer, &topic)
        })
        .await
    }

    /// Every message of `topic` from the beginning up to its end (as both the listed end and
    /// the fetches say; see `read_topic`), in partition and offset order; fails if they cannot
    /// all be read within `timeout`.
    pub async fn read_topic(&self, topic: &str, timeout: Duration) -> KafkaResult<Vec<ReadRecord>> {
        let (bootstrap, topic) = (self.bootstrap.clone(), topic.to_owned());
        blocking(move || read_topic(&bootstrap, &topic, timeout)).await
    }
}

/// Sets the mock's `group.initial.rebalance.delay.ms`, which rdkafka does not wrap.
fn set_initial_rebalance_delay<C: ClientContext>(client: &Client<C>, delay_ms: i32) {
    with_mock_cluster(client, |cluster| {
        // SAFETY: `cluster` is the live mock cluster of `client` (see `with_mock_cluster`);
        // the setter takes the cluster's own lock.
        #[allow(unsafe_code)]
        unsafe {
            rdkafka::bindings::rd_kafka_mock_group_initial_rebalance_delay_ms(cluster, delay_ms);
        }
    });
}

/// Runs `set` on the mock cluster of `client`, if it has one: for the mock's settings rdkafka
/// does not wrap. The pointer is valid only during the call.
fn with_mock_cluster<C: ClientContext>(
    client: &Client<C>,
    set: impl FnOnce(*mut rdkafka::bindings::rd_kafka_mock_cluster_t),
) {
    // SAFETY: `native_ptr` is the live handle of `client`, borrowed for this whole call; the
    // mock cluster it returns (null if none) is owned by that handle and outlives the call.
    #[allow(unsafe_code)]
    let cluster = unsafe { rdkafka::bindings::rd_kafka_handle_mock_cluster(client.native_ptr()) };
    if !cluster.is_null() {
        set(cluster);
    }
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> KafkaResult<T> + Send + 'static) -> KafkaResult<T> {
    tokio::task::spawn_blocking(work).await.map_err(|_| KafkaError::Canceled)?
}

/// The context of `read_topic`'s consumer: a partition's end is what that read waits for, so it
/// is not logged as an error (rdkafka hands every error event to the context before `poll`
/// returns it); every other error is logged as the default context logs it.
struct EndIsNoError;

impl ClientContext for EndIsNoError {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF) {
            DefaultClientContext.error(error, reason);
        }
    }
}

impl ConsumerContext for EndIsNoError {}

/// The settings of a consumer for checks as `group`: no subscription, nothing committed by it.
fn reader(bootstrap: &str, group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap).set("group.id", group).set("enable.auto.commit", "false");
    config
}

fn end_offsets<C: ConsumerContext>(consumer: &BaseConsumer<C>, topic: &str) -> KafkaResult<BTreeMap<i32, i64>> {
    let metadata = consumer.fetch_metadata(Some(topic), REQUEST_TIMEOUT)?;
    let partitions: Vec<i32> = metadata.topics().iter().flat_map(|t| t.partitions().iter().map(|p| p.id())).collect();
    let mut ends = BTreeMap::new();
    for partition in partitions {
        let (_, high) = consumer.fetch_watermarks(topic, partition, REQUEST_TIMEOUT)?;
        ends.insert(partition, high);
    }
    Ok(ends)
}

/// Reads every partition of `topic` from its start until both ends agree it is done: the end
/// the broker lists (ListOffsets) is reached, and a fetch answered that nothing follows
/// (librdkafka's partition-EOF event, taken from the high watermark of the fetch answer). The
/// listed end alone stops short on some brokers: Tansu 0.6 lists the end of a partition written
/// in multi-record batches as the last batch's first offset plus one.
fn read_topic(bootstrap: &str, topic: &str, timeout: Duration) -> KafkaResult<Vec<ReadRecord>> {
    // librdkafka refuses `assign` without a group id; this one never joins or commits.
    let group = format!("midflight-reader-{}", uuid::Uuid::new_v4().simple());
    let consumer: BaseConsumer<EndIsNoError> =
        reader(bootstrap, &group).set("enable.partition.eof", "true").create_with_context(EndIsNoError)?;
    let listed = end_offsets(&consumer, topic)?;
    let mut list = TopicPartitionList::new();
    for partition in listed.keys() {
        list.add_partition_offset(topic, *partition, Offset::Beginning)?;
    }
    consumer.assign(&list)?;
    // Per partition: the next offset to read, and whether a fetch said the end is there.
    let mut next: BTreeMap<i32, (i64, bool)> = listed.keys().map(|p| (*p, (0, false))).collect();
    let done = |next: &BTreeMap<i32, (i64, bool)>| {
        next.iter().all(|(p, (offset, eof))| *eof && *offset >= listed.get(p).copied().unwrap_or(0))
    };
    let deadline = Instant::now() + timeout;
    let mut records = Vec::new();
    while !done(&next) {
        if Instant::now() >= deadline {
            return Err(KafkaError::MessageConsumption(RDKafkaErrorCode::RequestTimedOut));
        }
        let message = match consumer.poll(POLL_INTERVAL) {
            None => continue,
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                if let Some((_, eof)) = next.get_mut(&partition) {
                    *eof = true;
                }
                continue;
            }
            Some(Err(error)) => return Err(error),
            Some(Ok(message)) => message,
        };
        if let Some(slot) = next.get_mut(&message.partition()) {
            // A message past an end a fetch reported: that end was not the last.
            *slot = (slot.0.max(message.offset() + 1), false);
        }
        let headers = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|h| (h.key.to_owned(), String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned()))
                    .collect()
            })
            .unwrap_or_default();
        records.push(ReadRecord {
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            payload: message.payload().unwrap_or_default().to_vec(),
            headers,
        });
    }
    records.sort_by_key(|r| (r.partition, r.offset));
    Ok(records)
}

/// Faults of the embedded cluster, and a producer-only handle on a cluster another process
/// hosts (the lab's `stack produce`).
impl EmbeddedKafka {
    /// A client of a cluster hosted elsewhere: produce and read work; cluster faults do not.
    pub fn connect(bootstrap_servers: &str) -> KafkaResult<EmbeddedKafka> {
        let host: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_servers)
            .set("enable.idempotence", "true")
            .create()?;
        Ok(EmbeddedKafka { host, bootstrap: bootstrap_servers.to_owned() })
    }

    /// Makes the cluster answer the next `errors.len()` requests of API `api_key` (a Kafka API
    /// number, e.g. 68 for KIP-848's ConsumerGroupHeartbeat) with these errors, in order.
    pub fn fail_requests(&self, api_key: i16, errors: &[rdkafka::types::RDKafkaRespErr]) {
        with_mock_cluster(self.host.client(), |cluster| {
            // SAFETY: `cluster` is the live mock cluster of the host client (see
            // `with_mock_cluster`); the errors are copied under the cluster's own lock.
            #[allow(unsafe_code)]
            unsafe {
                rdkafka::bindings::rd_kafka_mock_push_request_errors_array(
                    cluster,
                    api_key,
                    errors.len(),
                    errors.as_ptr(),
                );
            }
        });
    }

    fn not_hosted() -> KafkaError {
        KafkaError::ClientCreation("this client does not host the cluster".to_owned())
    }

    /// Takes broker `broker` (1..=BROKERS) down: its connections close and it refuses new ones.
    pub fn broker_down(&self, broker: i32) -> KafkaResult<()> {
        self.host.client().mock_cluster().ok_or_else(Self::not_hosted)?.broker_down(broker)
    }

    pub fn broker_up(&self, broker: i32) -> KafkaResult<()> {
        self.host.client().mock_cluster().ok_or_else(Self::not_hosted)?.broker_up(broker)
    }

    /// Moves the leadership of one partition to `broker` (never to "no leader": the mock then
    /// crashes the next producer).
    pub fn set_leader(&self, topic: &str, partition: i32, broker: i32) -> KafkaResult<()> {
        self.host.client().mock_cluster().ok_or_else(Self::not_hosted)?.partition_leader(topic, partition, Some(broker))
    }
}
