//! Input limits both mocks enforce, and the INVALID_ARGUMENT answers for breaking them.
//!
//! A careful downstream refuses malformed requests before touching its books, with a message
//! that names the field, so a caller's bug is never mistaken for a business answer.

use tonic::Status;

/// Longest identifier or free-text field, in bytes.
pub const FIELD_BYTES_MAX: usize = 128;
/// Largest encoded request a mock accepts. Far above any valid request (100 lines of 128-byte
/// SKUs is about 14 KiB), so only garbage hits it.
pub const MESSAGE_BYTES_MAX: usize = 64 * 1024;
/// Most entries one ListLedger page returns.
pub const LEDGER_PAGE_MAX: u32 = 1_000;

/// Most request ids one ListLedger request may name.
pub const LEDGER_REQUEST_IDS_MAX: usize = 500;

/// Refuses a ListLedger filter naming too many request ids, or an empty or over-long one.
pub fn ledger_request_ids(request_ids: &[String]) -> Result<(), Status> {
    if request_ids.len() > LEDGER_REQUEST_IDS_MAX {
        return Err(Status::invalid_argument(format!(
            "request_ids names {} ids, at most {LEDGER_REQUEST_IDS_MAX} are allowed",
            request_ids.len()
        )));
    }
    for (index, id) in request_ids.iter().enumerate() {
        required(&format!("request_ids[{index}]"), id)?;
    }
    Ok(())
}

/// Refuses an empty or over-long required field.
pub fn required(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} must not be empty")));
    }
    bounded(field, value)
}

/// Refuses an over-long optional field.
pub fn bounded(field: &str, value: &str) -> Result<(), Status> {
    if value.len() > FIELD_BYTES_MAX {
        return Err(Status::invalid_argument(format!(
            "{field} is {} bytes, at most {FIELD_BYTES_MAX} are allowed",
            value.len()
        )));
    }
    Ok(())
}

/// The page size to serve for a requested `limit` (0 asks for the largest page).
pub fn page_limit(limit: u32) -> u64 {
    u64::from(if limit == 0 { LEDGER_PAGE_MAX } else { limit.min(LEDGER_PAGE_MAX) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        assert_eq!(required("request_id", "").expect_err("empty").code(), tonic::Code::InvalidArgument);
        assert!(required("request_id", &"x".repeat(FIELD_BYTES_MAX)).is_ok());
        let long = bounded("order_no", &"x".repeat(FIELD_BYTES_MAX + 1)).expect_err("too long");
        assert!(long.message().contains("order_no is 129 bytes"), "{long:?}");
        assert_eq!((page_limit(0), page_limit(5), page_limit(5_000)), (1_000, 5, 1_000));
    }
}
