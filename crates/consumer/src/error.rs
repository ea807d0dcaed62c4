//! The consumer's error: why `run` stopped. A message the consumer cannot use is not an error
//! (it is parked); a lost CAS is not an error (it is an outcome). What is left is what a
//! restart, with the offsets still uncommitted, is the right answer to.

use rdkafka::error::KafkaError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration invalid:\n  - {}", problems.join("\n  - "))]
    Config { problems: Vec<String> },
    #[error("kafka: {operation}: {source}")]
    Kafka { operation: &'static str, source: KafkaError },
    #[error("kafka: the consumer's client hit a fatal error and cannot go on ({reason}); a restart makes a new one")]
    KafkaFatal { reason: String },
    #[error(transparent)]
    Store(#[from] midflight_store::Error),
    #[error(transparent)]
    Downstreams(#[from] midflight_api::client::Error),
    #[error("dead-letter copy of {message} to {dead_letter_topic} not delivered: {source}")]
    DeadLetter { message: Box<MessageRef>, dead_letter_topic: String, source: KafkaError },
    #[error("the task writing a batch failed: {0}")]
    Write(String),
    #[error("batch of {messages} messages starting at {first} not made durable after {attempts} attempts: {last}")]
    Batch { first: Box<MessageRef>, messages: usize, attempts: u32, last: Box<Error> },
}

/// Which message an error is about: where it came from and which saga it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageRef {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub biz_id: String,
}

impl std::fmt::Display for MessageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@{} (saga {})", self.topic, self.partition, self.offset, self.biz_id)
    }
}

impl Error {
    pub(crate) fn kafka(operation: &'static str) -> impl FnOnce(KafkaError) -> Error {
        move |source| Error::Kafka { operation, source }
    }
}
