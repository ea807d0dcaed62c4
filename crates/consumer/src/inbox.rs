//! From Kafka messages to inbox rows: each message is parsed once; a valid one becomes a
//! RECEIVED saga (with its trace context), a poison one a PARKED saga with its error plus a
//! copy on the dead-letter topic. The copies are delivered before the batch is written, so by
//! the time an offset is committed both the row and the copy exist (I6: the partition moves on,
//! nothing is silently dropped). A copy that can never be delivered (too large for the
//! producer, the topic missing or not writable) does not hold the partition: its row is
//! parked all the same, saying so, and counted (`dead_letter_failed`). A parked row keeps at
//! most [`PAYLOAD_BYTES_MAX`] bytes of the payload, so a huge poison message cannot make the
//! inbox statement too large for the database.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use midflight_model::limits::PAYLOAD_BYTES_MAX;
use midflight_model::{OrderEvent, PayloadError, Saga, Source};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Message, OwnedHeaders};
use rdkafka::producer::FutureRecord;

use crate::error::{Error, MessageRef};
use crate::kafka::{Partition, Producer};

/// The W3C header carrying the producer's trace context.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// The same name, as librdkafka looks it up.
const TRACEPARENT_NAME: &std::ffi::CStr = c"traceparent";
/// Header of a dead-letter copy: why the message was parked.
pub const ERROR_HEADER: &str = "midflight-error";
/// Header of a dead-letter copy: `topic/partition@offset` of the original.
pub const SOURCE_HEADER: &str = "midflight-source";
/// Header of a dead-letter copy: the biz_id of the parked row.
pub const BIZ_ID_HEADER: &str = "midflight-biz-id";
/// Longest trace context kept; a `traceparent` is 55 characters, anything far longer is not one.
const TRACEPARENT_LEN_MAX: usize = 128;

/// A message taken from Kafka, detached from the client's buffers.
#[derive(Debug, Clone)]
pub(crate) struct Incoming {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub traceparent: Option<String>,
}

impl Incoming {
    pub(crate) fn detach(message: &BorrowedMessage<'_>) -> Incoming {
        Incoming {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().unwrap_or_default().to_vec(),
            // The row keeps the receive span's context (a child of the producer's), so the
            // saga's spans hang under this delivery in the message's trace.
            traceparent: crate::telemetry::received(
                message.topic(),
                message.partition(),
                message.offset(),
                traceparent_header(message).and_then(trace_context),
            ),
        }
    }

    pub(crate) fn reference(&self, biz_id: &str) -> MessageRef {
        MessageRef {
            topic: self.topic.clone(),
            partition: self.partition,
            offset: self.offset,
            biz_id: biz_id.to_owned(),
        }
    }

    fn source(&self) -> Source {
        Source { topic: self.topic.clone(), partition: self.partition, offset: self.offset }
    }
}

/// A message as a row to insert.
#[derive(Debug)]
pub(crate) struct Arrived {
    pub saga: Saga,
    /// Why the message is poison, if it is.
    pub poison: Option<PayloadError>,
}

/// A poison message, the parked row it became, and why.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Poison<'a> {
    pub message: &'a Incoming,
    pub saga: &'a Saga,
    pub error: &'a PayloadError,
}

/// Parses `message` into the row it becomes.
pub(crate) fn arrive(message: &Incoming, now_ms: i64, saga_deadline_ms: i64) -> Arrived {
    match OrderEvent::parse(&message.payload) {
        Ok(event) => {
            let mut saga = Saga::received(&event, message.source(), now_ms, now_ms.saturating_add(saga_deadline_ms));
            saga.trace_context = message.traceparent.clone();
            Arrived { saga, poison: None }
        }
        Err(error) => {
            let payload = String::from_utf8_lossy(&message.payload);
            let kept = cut(&payload, PAYLOAD_BYTES_MAX);
            let mut saga = Saga::parked(message.source(), kept.to_owned(), &error, now_ms);
            if kept.len() < payload.len() {
                let note = format!(
                    "; the row keeps the first {} bytes of the payload as text ({} bytes as received), the dead-letter copy all of it",
                    kept.len(),
                    message.payload.len()
                );
                saga.last_error.get_or_insert_default().push_str(&note);
            }
            saga.trace_context = message.traceparent.clone();
            Arrived { saga, poison: Some(error) }
        }
    }
}

/// The longest prefix of `text` of at most `bytes` bytes that ends on a character boundary.
fn cut(text: &str, bytes: usize) -> &str {
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A dead-letter copy that cannot be delivered however often it is tried.
#[derive(Debug, Clone)]
pub(crate) struct CopyFailed {
    /// Index of the poison message in the slice given to [`dead_letter`].
    pub poison: usize,
    pub error: KafkaError,
}

/// Whether `error` refuses a copy as too large, which the broker may say of a whole record
/// batch for one record in it.
fn too_large(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
    )
}

/// Whether `error`, failing a dead-letter copy, would fail it again until a person changes
/// something: the copy is too large for the producer or the topic, the topic does not exist
/// or may not be written, or the broker refuses the record as it is. Anything else
/// (timeouts, brokers down, a corrupt request) may pass by itself later. A copy judged so is
/// not made later, when the topic has been created or the permission given: its row is.
pub(crate) fn undeliverable(error: &KafkaError) -> bool {
    use RDKafkaErrorCode::{
        ClusterAuthorizationFailed, InvalidRecord, InvalidTopic, PolicyViolation, TopicAuthorizationFailed,
        UnknownTopic, UnknownTopicOrPartition,
    };
    too_large(error)
        || matches!(
            error.rdkafka_error_code(),
            Some(
                InvalidRecord
                    | UnknownTopic
                    | UnknownTopicOrPartition
                    | InvalidTopic
                    | TopicAuthorizationFailed
                    | ClusterAuthorizationFailed
                    | PolicyViolation
            )
        )
}

/// One past the highest offset of each partition in `batch`: what to commit once it is durable.
pub(crate) fn next_offsets(batch: &[Incoming]) -> BTreeMap<Partition, i64> {
    let mut next = BTreeMap::new();
    for message in batch {
        let slot = next.entry((message.topic.clone(), message.partition)).or_insert(0);
        *slot = (*slot).max(message.offset + 1);
    }
    next
}

/// Delivers a copy of each poison message to `topic`, with its error in a header, and waits
/// for every acknowledgement. Copies are keyed like the original, so a replay tool can put the
/// repaired message back on the same partition. Returns the copies that can never be
/// delivered ([`undeliverable`]); any other failure fails the call, and the batch is tried again.
pub(crate) async fn dead_letter(
    producer: &Producer,
    topic: &str,
    poison: &[Poison<'_>],
) -> Result<Vec<CopyFailed>, Error> {
    // `send` waits for room in a full queue instead of failing at once; the delivery itself
    // is bounded by the producer's `message.timeout.ms`.
    let deliveries = poison.iter().map(|p| producer.send(copy(topic, p), Duration::from_secs(1)));
    let mut failed = Vec::new();
    for (n, (p, delivery)) in poison.iter().zip(join_all(deliveries).await).enumerate() {
        let Poison { message, saga, error } = p;
        let delivery = match delivery {
            // A broker refuses a partition's whole record batch for one record too large, so a
            // copy refused so is sent again, alone unless another batch's copy shares its
            // record batch again, before it is judged.
            Err((source, _)) if too_large(&source) => {
                producer.send(copy(topic, p), Duration::from_secs(1)).await.map(|_| ()).map_err(|(e, _)| e)
            }
            other => other.map(|_| ()).map_err(|(e, _)| e),
        };
        match delivery {
            Ok(()) => tracing::warn!(
                topic = %message.topic,
                partition = message.partition,
                offset = message.offset,
                biz_id = %saga.biz_id,
                %error,
                "poison message parked and copied to the dead-letter topic"
            ),
            Err(source) if undeliverable(&source) => {
                tracing::error!(
                    topic = %message.topic,
                    partition = message.partition,
                    offset = message.offset,
                    biz_id = %saga.biz_id,
                    dead_letter_topic = topic,
                    %error,
                    copy_error = %source,
                    "poison message parked without its dead-letter copy, which cannot be delivered"
                );
                failed.push(CopyFailed { poison: n, error: source });
            }
            Err(source) => {
                let message = Box::new(message.reference(&saga.biz_id));
                return Err(Error::DeadLetter { message, dead_letter_topic: topic.to_owned(), source });
            }
        }
    }
    Ok(failed)
}

/// The dead-letter copy of `poison`: the original key and payload, with the error, the
/// source and the parked row's biz_id (and the trace context) in headers.
fn copy<'a>(topic: &'a str, poison: &Poison<'a>) -> FutureRecord<'a, [u8], [u8]> {
    let Poison { message, saga, error } = poison;
    let error = error.to_string();
    let source = format!("{}/{}@{}", message.topic, message.partition, message.offset);
    let mut headers = OwnedHeaders::new_with_capacity(4)
        .insert(Header { key: ERROR_HEADER, value: Some(error.as_str()) })
        .insert(Header { key: SOURCE_HEADER, value: Some(source.as_str()) })
        .insert(Header { key: BIZ_ID_HEADER, value: Some(saga.biz_id.as_str()) });
    if let Some(trace) = &message.traceparent {
        headers = headers.insert(Header { key: TRACEPARENT_HEADER, value: Some(trace.as_str()) });
    }
    let mut record = FutureRecord::<[u8], [u8]>::to(topic).payload(&message.payload).headers(headers);
    if let Some(key) = &message.key {
        record = record.key(key.as_slice());
    }
    record
}

/// The header's value as a trace context, if it plausibly is one.
/// The value of the message's `traceparent` header (the last, if it has several), looked up
/// by name in librdkafka. The binding's header iterator turns each header's name into text and
/// panics on a name that is not UTF-8 (rdkafka 0.39), which any producer may send: that panic
/// would stop every consumer that reads the message, at every try, and hold its partition.
fn traceparent_header<'m>(message: &'m BorrowedMessage<'_>) -> Option<&'m [u8]> {
    use rdkafka::bindings::{rd_kafka_header_get_last, rd_kafka_headers_t, rd_kafka_message_headers};
    use rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR;
    let mut headers: *mut rd_kafka_headers_t = std::ptr::null_mut();
    let mut value: *const std::ffi::c_void = std::ptr::null();
    let mut size = 0_usize;
    // SAFETY: the message pointer is valid while `message` is borrowed; librdkafka returns
    // the headers it owns, or an error and no headers. The name is a NUL-terminated constant.
    // The value points into the headers, which live as long as the message, and has `size`
    // bytes (a null value is a header without one).
    #[allow(unsafe_code)]
    unsafe {
        if rd_kafka_message_headers(message.ptr(), &mut headers) != RD_KAFKA_RESP_ERR_NO_ERROR || headers.is_null() {
            return None;
        }
        if rd_kafka_header_get_last(headers, TRACEPARENT_NAME.as_ptr(), &mut value, &mut size)
            != RD_KAFKA_RESP_ERR_NO_ERROR
            || value.is_null()
        {
            return None;
        }
        Some(std::slice::from_raw_parts(value.cast::<u8>(), size))
    }
}

fn trace_context(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let plausible = !text.is_empty() && text.len() <= TRACEPARENT_LEN_MAX && text.bytes().all(|b| b.is_ascii_graphic());
    plausible.then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_looked_up_by_its_name() {
        assert_eq!(TRACEPARENT_NAME.to_str(), Ok(TRACEPARENT_HEADER));
    }

    fn message(offset: i64, payload: &str) -> Incoming {
        Incoming {
            topic: "orders".into(),
            partition: 3,
            offset,
            key: None,
            payload: payload.as_bytes().to_vec(),
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
        }
    }

    #[test]
    fn valid_messages_are_received_and_poison_is_parked() {
        let good = r#"{"order_no":"O-1","event_type":"PAID","lines":[{"sku":"SKU-0001","quantity":1}],"address":{"region":"CN-SH"}}"#;
        let received = arrive(&message(7, good), 1_000, 60_000);
        assert_eq!((received.saga.biz_id.as_str(), received.saga.status.as_str()), ("O-1:PAID", "RECEIVED"));
        assert_eq!(received.saga.deadline_ms, 61_000);
        assert!(received.saga.trace_context.is_some());
        let poison = arrive(&message(8, "{not json"), 1_000, 60_000);
        assert_eq!((poison.saga.biz_id.as_str(), poison.saga.status.as_str()), ("parked:orders:3:8", "PARKED"));
        assert!(poison.saga.last_error.as_deref().is_some_and(|e| e.contains("not a valid order event")));
    }

    #[test]
    fn a_parked_row_keeps_at_most_a_payloads_limit() {
        let small = arrive(&message(8, "{not json"), 1_000, 60_000);
        assert_eq!(small.saga.payload, "{not json");
        assert!(!small.saga.last_error.as_deref().unwrap_or_default().contains("keeps the first"));
        // Two-byte characters straddle the limit: the row ends on a whole one.
        let text = format!("a{}", "é".repeat(PAYLOAD_BYTES_MAX));
        let big = arrive(&message(9, &text), 1_000, 60_000);
        assert_eq!(big.saga.payload, format!("a{}", "é".repeat(PAYLOAD_BYTES_MAX / 2 - 1)));
        let error = big.saga.last_error.unwrap_or_default();
        assert!(error.contains("over the limit") && error.contains("keeps the first 65535 bytes"), "{error}");
        assert_eq!(cut("aé", 2), "a");
        assert_eq!(cut("aé", 3), "aé");
        assert_eq!(cut("", 5), "");
    }

    #[test]
    fn only_copies_that_cannot_pass_later_are_undeliverable() {
        use rdkafka::types::RDKafkaErrorCode as Code;
        let produce = |code| KafkaError::MessageProduction(code);
        for code in [
            Code::MessageSizeTooLarge,
            Code::MessageBatchTooLarge,
            Code::InvalidRecord,
            Code::PolicyViolation,
            Code::UnknownTopic,
            Code::UnknownTopicOrPartition,
            Code::TopicAuthorizationFailed,
        ] {
            assert!(undeliverable(&produce(code)), "{code:?}");
        }
        for code in [
            Code::MessageTimedOut,
            Code::AllBrokersDown,
            Code::RequestTimedOut,
            Code::NotEnoughReplicas,
            Code::InvalidMessage,
        ] {
            assert!(!undeliverable(&produce(code)), "{code:?}");
        }
        assert!(!undeliverable(&KafkaError::Canceled));
    }

    #[test]
    fn next_offsets_are_one_past_the_highest_per_partition() {
        let batch = [message(7, ""), message(9, ""), message(8, "")];
        assert_eq!(next_offsets(&batch), BTreeMap::from([(("orders".to_owned(), 3), 10)]));
    }

    #[test]
    fn only_plausible_trace_contexts_are_kept() {
        assert_eq!(trace_context(b" 00-ab-cd-01 "), Some("00-ab-cd-01".to_owned()));
        assert_eq!(trace_context(b"has space"), None);
        assert_eq!(trace_context(&[b'a'; 200]), None);
        assert_eq!(trace_context(b"\xff"), None);
    }
}
