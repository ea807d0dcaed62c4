//! Consumer group membership in the lab: the baselines' group settings, their assignment log
//! lines, and how long partitions went without an owner during a run, read back from every
//! consumer's log.
//!
//! midflight's consumer logs each assignment change as `partitions revoked` (field `revoked`)
//! and `partitions assigned` (field `assigned`), partitions written `topic/partition` and
//! separated by commas (`midflight_consumer::kafka`). The baselines log the same lines here, so
//! one reader measures every system.

use std::collections::{BTreeSet, HashMap};

use midflight_config::KafkaSection;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::{ClientConfig, ClientContext, TopicPartitionList};

use crate::system::GroupProtocol;

const REVOKED: &str = "partitions revoked";
const ASSIGNED: &str = "partitions assigned";

/// Group membership settings of a baseline's consumer (midflight's consumer does the same in
/// its own crate): under the classic protocol the assignor, if one is named (`None` keeps
/// librdkafka's default), and the session timeout; under KIP-848 the broker owns both and
/// librdkafka refuses them.
pub fn group_membership(client: &mut ClientConfig, kafka: &KafkaSection, assignor: Option<&str>) {
    client.set("group.protocol", &kafka.group_protocol);
    if kafka.group_protocol == GroupProtocol::Classic.as_str() {
        if let Some(assignor) = assignor {
            client.set("partition.assignment.strategy", assignor);
        }
        client.set("session.timeout.ms", kafka.session_timeout_ms.to_string());
    }
}

/// A baseline consumer's context: logs every assignment change as midflight's consumer does.
pub struct RebalanceLog;

impl ClientContext for RebalanceLog {}

impl ConsumerContext for RebalanceLog {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance {
            tracing::info!(revoked = %describe(list), "partitions revoked");
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            tracing::info!(assigned = %describe(list), "partitions assigned");
        }
    }
}

fn describe(list: &TopicPartitionList) -> String {
    let parts: Vec<String> = list.elements().iter().map(|e| format!("{}/{}", e.topic(), e.partition())).collect();
    parts.join(",")
}

/// One assignment change a consumer logged.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Change {
    at_ms: i64,
    assigned: bool,
    partitions: Vec<String>,
}

/// The longest time a partition went from its revocation by a consumer to its next assignment
/// (to any consumer), over the changes the consumers' `logs` (one text per log file) record
/// from `from_ms` until before `until_ms` (ms since the Unix epoch). A revocation with no
/// assignment before `until_ms` does not count. `None`: no partition was handed over then.
pub fn longest_handover_ms(logs: &[String], from_ms: i64, until_ms: i64) -> Option<i64> {
    let changes = logs
        .iter()
        .flat_map(|text| text.lines().filter_map(parse_change))
        .filter(|c| (from_ms..until_ms).contains(&c.at_ms))
        .collect();
    longest_gap(changes)
}

/// The partitions some consumer holds at the end of its log, over the logs of the consumers
/// still running (one text per log file: one incarnation each). Each log's changes are taken in
/// order: an assignment adds its partitions, a revocation takes its own away. Lines are read in
/// either log format the services write (JSON, or the compact text format).
pub fn held_at_end(logs: &[String]) -> BTreeSet<String> {
    let mut held = BTreeSet::new();
    for text in logs {
        let mut mine: BTreeSet<String> = BTreeSet::new();
        for change in text.lines().filter_map(|line| parse_change(line).or_else(|| parse_compact(line))) {
            for partition in change.partitions {
                if change.assigned {
                    mine.insert(partition);
                } else {
                    mine.remove(&partition);
                }
            }
        }
        held.extend(mine);
    }
    held
}

/// A change from a compact text line (`... INFO partitions assigned owner=c-1 assigned=orders/1,orders/2`).
/// Only the order of lines matters to [`held_at_end`], so the time is not read.
fn parse_compact(line: &str) -> Option<Change> {
    let (assigned, field) = if line.contains(ASSIGNED) {
        (true, " assigned=")
    } else if line.contains(REVOKED) {
        (false, " revoked=")
    } else {
        return None;
    };
    let value = line.split_once(field)?.1.split(' ').next().unwrap_or("");
    let partitions = value.split(',').filter(|p| !p.is_empty()).map(str::to_owned).collect();
    Some(Change { at_ms: 0, assigned, partitions })
}

fn parse_change(line: &str) -> Option<Change> {
    // Only lines that mention a change are parsed: a consumer's log is mostly other lines.
    if !line.contains(REVOKED) && !line.contains(ASSIGNED) {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(line).ok()?;
    let (assigned, field) = match json.get("message")?.as_str()? {
        REVOKED => (false, "revoked"),
        ASSIGNED => (true, "assigned"),
        _ => return None,
    };
    let at_ms = rfc3339_utc_ms(json.get("timestamp")?.as_str()?)?;
    let partitions = json.get(field)?.as_str()?.split(',').filter(|p| !p.is_empty()).map(str::to_owned).collect();
    Some(Change { at_ms, assigned, partitions })
}

fn longest_gap(mut changes: Vec<Change>) -> Option<i64> {
    // Within one millisecond a revocation goes first: it cannot follow an assignment it caused.
    changes.sort_by_key(|c| (c.at_ms, c.assigned));
    let mut unowned_since: HashMap<String, i64> = HashMap::new();
    let mut longest: Option<i64> = None;
    for change in changes {
        for partition in change.partitions {
            if change.assigned {
                if let Some(since) = unowned_since.remove(&partition) {
                    let gap = change.at_ms - since;
                    longest = Some(longest.map_or(gap, |l| l.max(gap)));
                }
            } else {
                unowned_since.entry(partition).or_insert(change.at_ms);
            }
        }
    }
    longest
}

/// Milliseconds since the Unix epoch of a UTC RFC 3339 timestamp as the services' JSON logs
/// write it (`2026-12-02T17:59:25.636415Z`).
fn rfc3339_utc_ms(text: &str) -> Option<i64> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let mut ymd = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (ymd.next()??, ymd.next()??, ymd.next()??);
    let (hms, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut parts = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hour, minute, second) = (parts.next()??, parts.next()??, parts.next()??);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let millis: i64 = format!("{fraction:0<3}").get(..3)?.parse().ok()?;
    Some(days_from_civil(year, month, day) * 86_400_000 + ((hour * 60 + minute) * 60 + second) * 1_000 + millis)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(at: &str, message: &str, field: &str, partitions: &str) -> String {
        serde_json::json!({"timestamp": at, "level": "INFO", "message": message, "owner": "c", field: partitions})
            .to_string()
    }

    #[test]
    fn what_the_running_consumers_hold_at_the_end_in_either_log_format() {
        let json = [
            line("2026-12-02T10:00:00.000Z", ASSIGNED, "assigned", "orders/0,orders/1,orders/2"),
            line("2026-12-02T10:00:05.000Z", REVOKED, "revoked", "orders/0,orders/1,orders/2"),
            line("2026-12-02T10:00:06.000Z", ASSIGNED, "assigned", "orders/1"),
        ]
        .join("\n");
        let compact = [
            "2026-12-02T10:00:00.000000Z  INFO partitions assigned owner=c-2 assigned=orders/3,orders/4",
            "2026-12-02T10:00:01.000000Z  INFO saga finished biz_id=o-1",
            "2026-12-02T10:00:05.000000Z  INFO partitions revoked owner=c-2 revoked=orders/4 lost=false",
            "2026-12-02T10:00:06.000000Z  INFO partitions assigned owner=c-2 assigned=",
        ]
        .join("\n");
        let held: Vec<String> = held_at_end(&[json, compact.clone()]).into_iter().collect();
        assert_eq!(held, ["orders/1", "orders/3"]);
        assert!(held_at_end(&[String::new()]).is_empty(), "a consumer that never got a partition holds none");
        assert_eq!(held_at_end(&[compact]).len(), 1);
    }

    #[test]
    fn timestamps_read_as_milliseconds_since_the_epoch() {
        assert_eq!(rfc3339_utc_ms("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(rfc3339_utc_ms("1970-01-02T00:00:01Z"), Some(86_401_000));
        // date -u -d 2026-12-02T17:59:25 +%s gives 1796234365.
        assert_eq!(rfc3339_utc_ms("2026-12-02T17:59:25.636415Z"), Some(1_796_234_365_636));
        assert_eq!(rfc3339_utc_ms("2024-02-29T00:00:00.5Z"), Some(1_709_164_800_500));
        for bad in ["2026-12-02T17:59:25", "2026-13-02T00:00:00Z", "yesterday", "2026-12-02 17:59:25Z"] {
            assert_eq!(rfc3339_utc_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_partition_handed_over_counts_from_its_revocation_to_its_next_assignment() {
        let logs = [
            line("2026-12-02T10:00:00.000Z", ASSIGNED, "assigned", "orders/0,orders/1,orders/2"),
            // Consumer 1 gives up 1 and 2; consumer 3 gets them 5.1 s and 0.2 s later.
            line("2026-12-02T10:00:20.000Z", REVOKED, "revoked", "orders/1,orders/2"),
            line("2026-12-02T10:00:20.200Z", ASSIGNED, "assigned", "orders/2"),
            line("2026-12-02T10:00:20.300Z", ASSIGNED, "assigned", ""),
            line("2026-12-02T10:00:25.100Z", ASSIGNED, "assigned", "orders/1"),
            // Revoked at the end and never assigned again: not a handover.
            line("2026-12-02T10:01:00.000Z", REVOKED, "revoked", "orders/0"),
            r#"{"timestamp":"2026-12-02T10:00:21.000Z","level":"INFO","message":"resuming partitions"}"#.to_owned(),
            "not json, partitions revoked".to_owned(),
        ];
        let changes: Vec<Change> = logs.iter().filter_map(|l| parse_change(l)).collect();
        assert_eq!(changes.len(), 6);
        assert_eq!(changes[1].partitions, ["orders/1", "orders/2"]);
        assert!(changes[4].assigned);
        assert_eq!(longest_gap(changes), Some(5_100));
        assert_eq!(longest_gap(Vec::new()), None);
    }
}
