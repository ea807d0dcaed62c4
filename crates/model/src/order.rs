//! The order event carried by a Kafka message, its validation and its idempotency key.
//!
//! Validation lives here, not in the consumer, so the consumer, the recovery worker and the
//! tests agree on what poison input is. Every limit is named; anything over it is rejected
//! with a message that says which field and why.

use serde::{Deserialize, Serialize};

/// Longest order number accepted.
pub const ORDER_NO_LEN_MAX: usize = 64;
/// Longest event type accepted.
pub const EVENT_TYPE_LEN_MAX: usize = 32;
/// Longest SKU accepted.
pub const SKU_LEN_MAX: usize = 64;
/// Most lines in one order event.
pub const LINES_MAX: usize = 100;
/// Largest quantity on one line.
pub const QUANTITY_MAX: i64 = 1_000_000;
/// Longest free-text address field.
pub const ADDRESS_FIELD_LEN_MAX: usize = 128;
/// Largest raw payload accepted, in bytes.
pub const PAYLOAD_BYTES_MAX: usize = 64 * 1024;

/// One order event, as produced to the order topic (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderEvent {
    pub order_no: String,
    /// E.g. `PAID`. Together with the order number it forms the idempotency key.
    pub event_type: String,
    pub lines: Vec<Line>,
    pub address: Address,
    #[serde(default)]
    pub amount_cents: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Line {
    pub sku: String,
    pub quantity: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Address {
    pub region: String,
    #[serde(default)]
    pub city: String,
    #[serde(default)]
    pub line: String,
    #[serde(default)]
    pub postal_code: String,
}

/// Why a payload is poison. The text is what gets stored with the parked row.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("payload is {bytes} bytes, over the limit of {PAYLOAD_BYTES_MAX}")]
    TooLarge { bytes: usize },
    #[error("payload is not a valid order event: {0}")]
    Malformed(String),
    #[error("invalid order event: {0}")]
    Invalid(String),
}

impl OrderEvent {
    /// Parses and validates a raw message payload.
    pub fn parse(payload: &[u8]) -> Result<OrderEvent, PayloadError> {
        if payload.len() > PAYLOAD_BYTES_MAX {
            return Err(PayloadError::TooLarge { bytes: payload.len() });
        }
        let event: OrderEvent = serde_json::from_slice(payload).map_err(|e| PayloadError::Malformed(e.to_string()))?;
        event.validate().map_err(PayloadError::Invalid)?;
        Ok(event)
    }

    /// The idempotency key: order number + event type.
    pub fn biz_id(&self) -> String {
        biz_id(&self.order_no, &self.event_type)
    }

    pub fn to_json(&self) -> String {
        // Serializing plain strings and integers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    fn validate(&self) -> Result<(), String> {
        check_token("order_no", &self.order_no, ORDER_NO_LEN_MAX)?;
        check_token("event_type", &self.event_type, EVENT_TYPE_LEN_MAX)?;
        if self.lines.is_empty() || self.lines.len() > LINES_MAX {
            return Err(format!("lines: need 1..={LINES_MAX} lines, got {}", self.lines.len()));
        }
        for (index, line) in self.lines.iter().enumerate() {
            check_token(&format!("lines[{index}].sku"), &line.sku, SKU_LEN_MAX)?;
            if !(1..=QUANTITY_MAX).contains(&line.quantity) {
                return Err(format!("lines[{index}].quantity: need 1..={QUANTITY_MAX}, got {}", line.quantity));
            }
        }
        if self.address.region.trim().is_empty() {
            return Err("address.region: must not be empty".to_owned());
        }
        for (name, value) in [
            ("address.region", &self.address.region),
            ("address.city", &self.address.city),
            ("address.line", &self.address.line),
            ("address.postal_code", &self.address.postal_code),
        ] {
            if value.len() > ADDRESS_FIELD_LEN_MAX {
                return Err(format!("{name}: longer than {ADDRESS_FIELD_LEN_MAX} bytes"));
            }
        }
        if self.amount_cents < 0 {
            return Err(format!("amount_cents: must not be negative, got {}", self.amount_cents));
        }
        Ok(())
    }
}

/// The idempotency key of an order event.
pub fn biz_id(order_no: &str, event_type: &str) -> String {
    format!("{order_no}:{event_type}")
}

/// Identifiers are restricted to a safe alphabet so they can travel in keys, headers and logs.
fn check_token(name: &str, value: &str, len_max: usize) -> Result<(), String> {
    if value.is_empty() || value.len() > len_max {
        return Err(format!("{name}: need 1..={len_max} characters, got {}", value.len()));
    }
    if let Some(bad) = value.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        return Err(format!("{name}: character {bad:?} not allowed (use A-Z a-z 0-9 - _ .)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> serde_json::Value {
        serde_json::json!({
            "order_no": "O-1", "event_type": "PAID",
            "lines": [{"sku": "SKU-0001", "quantity": 2}],
            "address": {"region": "CN-SH", "city": "Shanghai"},
            "amount_cents": 1999
        })
    }

    fn check(mutate: impl FnOnce(&mut serde_json::Value), expected: &str) {
        let mut value = good();
        mutate(&mut value);
        let bytes = serde_json::to_vec(&value).expect("json");
        let got = match OrderEvent::parse(&bytes) {
            Ok(event) => format!("ok {}", event.biz_id()),
            Err(e) => e.to_string(),
        };
        assert_eq!(got, expected);
    }

    #[test]
    fn validation_names_the_field() {
        check(|_| {}, "ok O-1:PAID");
        check(|v| v["order_no"] = "".into(), "invalid order event: order_no: need 1..=64 characters, got 0");
        check(
            |v| v["order_no"] = "O 1".into(),
            "invalid order event: order_no: character ' ' not allowed (use A-Z a-z 0-9 - _ .)",
        );
        check(|v| v["lines"] = serde_json::json!([]), "invalid order event: lines: need 1..=100 lines, got 0");
        check(
            |v| v["lines"][0]["quantity"] = (-1).into(),
            "invalid order event: lines[0].quantity: need 1..=1000000, got -1",
        );
        check(|v| v["address"]["region"] = " ".into(), "invalid order event: address.region: must not be empty");
        check(|v| v["amount_cents"] = (-5).into(), "invalid order event: amount_cents: must not be negative, got -5");
        check(
            |v| v["extra"] = 1.into(),
            "payload is not a valid order event: unknown field `extra`, expected one of `order_no`, `event_type`, `lines`, `address`, `amount_cents` at line 1 column 95",
        );
    }

    #[test]
    fn garbage_and_oversize_are_poison() {
        assert!(matches!(OrderEvent::parse(b"\xff\x00not json"), Err(PayloadError::Malformed(_))));
        let big = vec![b' '; PAYLOAD_BYTES_MAX + 1];
        assert_eq!(OrderEvent::parse(&big), Err(PayloadError::TooLarge { bytes: PAYLOAD_BYTES_MAX + 1 }));
    }
}
