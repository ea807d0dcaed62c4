//! The order topic's retention, read so that the purge never deletes a saga whose message the
//! topic can still hand out. A saga's row is what turns a redelivered message into a no-op: a
//! message read again after its saga was purged (offsets reset to the earliest, a new group, a
//! committed offset lost) would be processed again, with every external effect.
//!
//! With a `kafka` section, the purge reads the topic's `retention.ms`, `segment.ms`,
//! `cleanup.policy` and timestamp limits (DescribeConfigs) before its first batch and again
//! every `purge.interval_ms`, and purges past the longer of `purge.after_hours` and the
//! topic's bound plus [`RETENTION_MARGIN`]: nothing until a first reading, nothing while the
//! topic keeps messages for ever. A read that fails later leaves the last reading in force,
//! with a warning.

use std::collections::BTreeMap;
use std::time::Duration;

use midflight_config::KafkaSection;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// Added to the topic's own bound: a broker deletes a segment past retention only at its next
/// retention check (`log.retention.check.interval.ms`, 5 minutes by default), and its clock and
/// the database's may differ.
pub const RETENTION_MARGIN: Duration = Duration::from_secs(3_600);

/// How long the order topic keeps a message, as its configuration says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Every message is deleted at most this long after it was written: `retention.ms` plus
    /// `segment.ms` (a segment takes messages for up to `segment.ms`, and is deleted whole once
    /// its newest message is past retention), plus how far ahead a producer may date a message.
    Bounded(Duration),
    /// A message may be kept for ever: `retention.ms` or `segment.ms` is -1 (or over a hundred
    /// years), or the topic is compacted without deletion (the latest message of each key stays).
    Unbounded,
}

impl Retention {
    /// What the topic's configuration entries (name, value) say. `retention.ms` and
    /// `segment.ms` must be there (a Kafka broker reports every setting, its defaults
    /// included); a `cleanup.policy` not reported at all is Kafka's default, `delete`, and one
    /// reported without a value, or with a word other than `delete` and `compact`, is an error.
    /// With `message.timestamp.type` `CreateTime` (Kafka's default; so too when not reported) a
    /// segment is deleted by its newest message's own timestamp, which a producer may set ahead
    /// by up to `message.timestamp.after.max.ms`, or, where that is not reported or unbounded
    /// (before Kafka 3.6, and its default before 4.0, when the broker applies the older
    /// setting), `message.timestamp.difference.max.ms`. A finite limit is added to the bound;
    /// with both unbounded the producers' clocks are left to [`RETENTION_MARGIN`].
    pub fn from_entries<'a>(
        entries: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    ) -> Result<Retention, RetentionError> {
        let entries: BTreeMap<&str, Option<&str>> = entries.into_iter().collect();
        let number = |name: &'static str| match entries.get(name) {
            Some(Some(text)) => {
                let text = text.trim();
                text.parse::<i64>().map_err(|_| RetentionError::Unreadable { name, value: text.to_owned() })
            }
            _ => Err(RetentionError::NotReported(name)),
        };
        let policy = match entries.get("cleanup.policy") {
            None => "delete",
            Some(None) => return Err(RetentionError::NotReported("cleanup.policy")),
            Some(Some(text)) => text.trim(),
        };
        let mut deletes = false;
        for word in policy.split(',').map(str::trim).filter(|word| !word.is_empty()) {
            match word {
                "delete" => deletes = true,
                "compact" => {}
                _ => return Err(RetentionError::Unreadable { name: "cleanup.policy", value: policy.to_owned() }),
            }
        }
        // Compaction alone keeps the latest message of each key; no policy at all (allowed since
        // Kafka 4.1) keeps everything.
        if !deletes {
            return Ok(Retention::Unbounded);
        }
        let (Some(retention), Some(segment)) =
            (limit("retention.ms", number("retention.ms")?)?, limit("segment.ms", number("segment.ms")?)?)
        else {
            return Ok(Retention::Unbounded);
        };
        let log_append_time =
            matches!(entries.get("message.timestamp.type"), Some(Some(kind)) if kind.trim() == "LogAppendTime");
        let ahead_limit = |name: &'static str| match number(name) {
            Err(RetentionError::NotReported(_)) => Ok(None),
            Err(error) => Err(error),
            Ok(ms) => limit(name, ms),
        };
        let ahead = if log_append_time {
            0
        } else {
            match ahead_limit("message.timestamp.after.max.ms")? {
                Some(ms) => ms,
                None => ahead_limit("message.timestamp.difference.max.ms")?.unwrap_or(0),
            }
        };
        Ok(Retention::Bounded(Duration::from_millis(retention + segment + ahead)))
    }

    /// The longest the topic keeps a message, in seconds; -1 for ever.
    pub fn seconds(&self) -> f64 {
        match self {
            Retention::Bounded(bound) => bound.as_secs_f64(),
            Retention::Unbounded => -1.0,
        }
    }

    /// The horizon the purge may use instead of `configured`: the longer of it and the topic's
    /// bound plus [`RETENTION_MARGIN`]; `None` when no horizon is safe.
    pub fn horizon(&self, configured: Duration) -> Option<Duration> {
        match self {
            Retention::Bounded(bound) => Some(configured.max(bound.saturating_add(RETENTION_MARGIN))),
            Retention::Unbounded => None,
        }
    }
}

/// Longer than this is for ever: a hundred years (also the longest `purge.after_hours`).
const FOR_EVER_MS: u64 = 876_000 * 3_600_000;

/// A time limit of the topic's in milliseconds: `None` for none (-1, or past [`FOR_EVER_MS`]).
fn limit(name: &'static str, ms: i64) -> Result<Option<u64>, RetentionError> {
    match ms {
        -1 => Ok(None),
        ms => u64::try_from(ms)
            .map(|ms| (ms <= FOR_EVER_MS).then_some(ms))
            .map_err(|_| RetentionError::Unreadable { name, value: ms.to_string() }),
    }
}

/// Why the order topic's retention could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error("cannot ask the broker: {0}")]
    Kafka(#[from] KafkaError),
    #[error("the broker answered for the topic with {0:?}")]
    Topic(RDKafkaErrorCode),
    #[error("the broker did not report the topic's {0}")]
    NotReported(&'static str),
    #[error("the topic's {name} is {value:?}, which this check does not understand")]
    Unreadable { name: &'static str, value: String },
}

/// Reads the order topic's configuration through the admin API; one client for the process.
pub struct TopicReader {
    admin: AdminClient<DefaultClientContext>,
    topic: String,
    timeout: Duration,
}

impl std::fmt::Debug for TopicReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicReader").field("topic", &self.topic).field("timeout", &self.timeout).finish()
    }
}

impl TopicReader {
    /// A reader of `section.order_topic` on `section.bootstrap_servers` (with
    /// `section.properties`, e.g. the security settings); no request is made yet.
    pub fn new(section: &KafkaSection, timeout: Duration) -> Result<TopicReader, KafkaError> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &section.bootstrap_servers).set("client.id", "midflight-purge-topic-check");
        for (key, value) in &section.properties {
            config.set(key, value);
        }
        Ok(TopicReader { admin: config.create()?, topic: section.order_topic.clone(), timeout })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The topic's retention now; waits at most the reader's timeout.
    pub async fn read(&self) -> Result<Retention, RetentionError> {
        let options = AdminOptions::new().request_timeout(Some(self.timeout));
        let resources = [ResourceSpecifier::Topic(&self.topic)];
        let asked = self.admin.describe_configs(&resources, &options);
        let answers = match tokio::time::timeout(self.timeout.saturating_add(Duration::from_secs(1)), asked).await {
            Ok(answers) => answers?,
            Err(_) => return Err(KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut).into()),
        };
        let resource = answers
            .into_iter()
            .next()
            .ok_or(RetentionError::NotReported("configuration"))?
            .map_err(RetentionError::Topic)?;
        Retention::from_entries(resource.entries.iter().map(|entry| (entry.name.as_str(), entry.value.as_deref())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3_600);

    fn of(entries: &[(&'static str, &'static str)]) -> Result<Retention, RetentionError> {
        Retention::from_entries(entries.iter().map(|(name, value)| (*name, Some(*value))))
    }

    #[test]
    fn a_deleting_topic_keeps_a_message_for_retention_plus_a_segment() {
        let kafka_defaults = [("retention.ms", "604800000"), ("segment.ms", "604800000"), ("cleanup.policy", "delete")];
        assert_eq!(of(&kafka_defaults).expect("readable"), Retention::Bounded(14 * 24 * HOUR));
        // retention.ms 0: deleted at the broker's next retention check.
        assert_eq!(
            of(&[("retention.ms", "0"), ("segment.ms", "1000")]).expect("readable"),
            Retention::Bounded(Duration::from_secs(1))
        );
        let no_policy = [("retention.ms", "3600000"), ("segment.ms", "600000")];
        assert_eq!(of(&no_policy).expect("readable"), Retention::Bounded(Duration::from_secs(4_200)));
        let both = [("retention.ms", "3600000"), ("segment.ms", "3600000"), ("cleanup.policy", "compact, delete")];
        assert_eq!(of(&both).expect("readable"), Retention::Bounded(2 * HOUR));
    }

    #[test]
    fn a_topic_that_keeps_messages_for_ever_is_unbounded() {
        let for_ever: [&[(&'static str, &'static str)]; 6] = [
            &[("retention.ms", "-1"), ("segment.ms", "1000")],
            &[("retention.ms", "1000"), ("segment.ms", "-1")],
            &[("retention.ms", "9223372036854775807"), ("segment.ms", "1000")],
            &[("cleanup.policy", "compact")],
            // No policy at all (Kafka 4.1 and later).
            &[("cleanup.policy", ""), ("retention.ms", "1000"), ("segment.ms", "1000")],
            &[("cleanup.policy", "compact"), ("retention.ms", "1000"), ("segment.ms", "1000")],
        ];
        for entries in for_ever {
            assert_eq!(of(entries).expect("readable"), Retention::Unbounded, "{entries:?}");
        }
        assert_eq!(Retention::Unbounded.seconds(), -1.0);
        assert_eq!(Retention::Unbounded.horizon(HOUR * 1_000), None);
    }

    #[test]
    fn a_producers_clock_ahead_counts_as_far_as_the_topic_bounds_it() {
        let base = [("retention.ms", "3600000"), ("segment.ms", "3600000")];
        let with = |more: &[(&'static str, &'static str)]| {
            of(&base.iter().chain(more).copied().collect::<Vec<_>>()).expect("readable")
        };
        assert_eq!(with(&[("message.timestamp.after.max.ms", "3600000")]), Retention::Bounded(3 * HOUR));
        assert_eq!(
            with(&[("message.timestamp.difference.max.ms", "1800000")]),
            Retention::Bounded(2 * HOUR + HOUR / 2)
        );
        // Kafka 3.6 to 3.9 report both, the after limit unbounded by default: the older one applies.
        let older_applies = [
            ("message.timestamp.after.max.ms", "9223372036854775807"),
            ("message.timestamp.difference.max.ms", "1800000"),
        ];
        assert_eq!(with(&older_applies), Retention::Bounded(2 * HOUR + HOUR / 2));
        // A finite after limit is the one in force.
        let both = [("message.timestamp.after.max.ms", "0"), ("message.timestamp.difference.max.ms", "3600000")];
        assert_eq!(with(&both), Retention::Bounded(2 * HOUR));
        // Unbounded (Kafka's default before 4.0): the margin stands for the producers' clocks.
        assert_eq!(
            with(&[("message.timestamp.difference.max.ms", "9223372036854775807")]),
            Retention::Bounded(2 * HOUR)
        );
        let log_append = [("message.timestamp.type", "LogAppendTime"), ("message.timestamp.after.max.ms", "3600000")];
        assert_eq!(with(&log_append), Retention::Bounded(2 * HOUR));
        let create = [("message.timestamp.type", "CreateTime"), ("message.timestamp.after.max.ms", "3600000")];
        assert_eq!(with(&create), Retention::Bounded(3 * HOUR));
    }

    #[test]
    fn what_is_missing_or_unreadable_is_named() {
        let missing = of(&[("segment.ms", "1000")]).expect_err("unreadable").to_string();
        assert!(missing.contains("did not report the topic's retention.ms"), "{missing}");
        let missing = of(&[("retention.ms", "1000")]).expect_err("unreadable").to_string();
        assert!(missing.contains("segment.ms"), "{missing}");
        let unset =
            Retention::from_entries([("retention.ms", None), ("segment.ms", Some("1"))]).expect_err("unreadable");
        assert!(matches!(unset, RetentionError::NotReported("retention.ms")), "{unset}");
        for (retention, segment) in [("a week", "1000"), ("-2", "1000"), ("1000", "-5")] {
            let error = of(&[("retention.ms", retention), ("segment.ms", segment)]).expect_err("unreadable");
            assert!(matches!(error, RetentionError::Unreadable { .. }), "{retention}/{segment}: {error}");
        }
        // Only Kafka's own words count as a policy: anything else might keep messages for ever.
        for policy in ["Compact", "[compact]", "none", "delete,forever"] {
            let error = of(&[("cleanup.policy", policy), ("retention.ms", "1000"), ("segment.ms", "1000")])
                .expect_err("unreadable");
            assert!(matches!(error, RetentionError::Unreadable { name: "cleanup.policy", .. }), "{policy}: {error}");
        }
        let no_value =
            Retention::from_entries([("cleanup.policy", None), ("retention.ms", Some("1")), ("segment.ms", Some("1"))]);
        assert!(matches!(no_value, Err(RetentionError::NotReported("cleanup.policy"))), "{no_value:?}");
        let ahead = [("retention.ms", "1000"), ("segment.ms", "1000"), ("message.timestamp.after.max.ms", "-5")];
        assert!(matches!(of(&ahead), Err(RetentionError::Unreadable { .. })), "{:?}", of(&ahead));
    }

    #[test]
    fn the_horizon_is_the_longer_of_the_configured_and_the_topics_with_its_margin() {
        let topic = Retention::Bounded(36 * HOUR);
        assert_eq!(topic.horizon(24 * HOUR), Some(37 * HOUR));
        assert_eq!(topic.horizon(48 * HOUR), Some(48 * HOUR));
        assert_eq!(topic.seconds(), 36.0 * 3_600.0);
    }
}
