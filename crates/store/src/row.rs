//! Conversion between stored rows and `midflight_model::Saga`. A row that does not convert
//! (an unknown status string, a negative version) is a typed error naming the biz_id.

use midflight_model::{Lease, Saga, Source, Status};

use crate::entity::saga;
use crate::error::Error;

pub fn to_saga(row: saga::Model) -> Result<Saga, Error> {
    let status = Status::parse(&row.status).ok_or_else(|| {
        Error::Model(midflight_model::Error::UnknownStatus { biz_id: row.biz_id.clone(), text: row.status.clone() })
    })?;
    let corrupt = |message: String| Error::Corrupt { biz_id: row.biz_id.clone(), message };
    let version = u64::try_from(row.version).map_err(|_| corrupt(format!("negative version {}", row.version)))?;
    let epoch =
        u64::try_from(row.lease_epoch).map_err(|_| corrupt(format!("negative lease_epoch {}", row.lease_epoch)))?;
    let attempts = u32::try_from(row.attempts).map_err(|_| corrupt(format!("negative attempts {}", row.attempts)))?;
    Ok(Saga {
        source: Source { topic: row.src_topic, partition: row.src_partition, offset: row.src_offset },
        status,
        version,
        attempts,
        lease: Lease { owner_id: row.owner_id, epoch, until_ms: row.lease_until_ms },
        biz_id: row.biz_id,
        order_no: row.order_no,
        event_type: row.event_type,
        payload: row.payload,
        wms_request_id: row.wms_request_id,
        wms_voucher: row.wms_voucher,
        wms_locked_at_ms: row.wms_locked_at_ms,
        logistics_request_id: row.logistics_request_id,
        logistics_voucher: row.logistics_voucher,
        tracking_no: row.tracking_no,
        intent_at_ms: row.intent_at_ms,
        next_attempt_at_ms: row.next_attempt_at_ms,
        last_error: row.last_error,
        deadline_ms: row.deadline_ms,
        trace_context: row.trace_context,
        created_at_ms: row.created_at_ms,
        updated_at_ms: row.updated_at_ms,
    })
}

/// Versions and epochs are `u64` in the model and `BIGINT` in the table.
pub fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Text columns have a width; errors and reasons are cut to fit rather than failing the write.
pub fn fit(text: &str, bytes_max: usize) -> String {
    if text.len() <= bytes_max {
        return text.to_owned();
    }
    let mut end = bytes_max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}
