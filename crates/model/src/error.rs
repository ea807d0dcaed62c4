//! The state model's error: bad data about one saga, always naming it.

use crate::status::Status;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("saga {biz_id}: illegal transition {from} -> {to}")]
    IllegalTransition { biz_id: String, from: Status, to: Status },
    #[error("saga {biz_id}: unknown status {text:?} in the table")]
    UnknownStatus { biz_id: String, text: String },
}
