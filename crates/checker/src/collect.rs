//! Gathering a [`Snapshot`] from a live store and live downstreams, a page at a time.

use std::time::Duration;

use midflight_api::client::{Downstreams, LedgerEntry};

use crate::Snapshot;

/// Rows read per round trip.
const PAGE_ROWS: u64 = 1_000;
/// Most rows of any one kind a snapshot holds; a run larger than this is checked in parts.
const SNAPSHOT_ROWS_MAX: usize = 5_000_000;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] midflight_store::Error),
    #[error(transparent)]
    Downstream(#[from] midflight_api::client::Error),
    #[error("snapshot larger than {SNAPSHOT_ROWS_MAX} rows of {0}")]
    TooLarge(&'static str),
    #[error(
        "a ledger page of {entries} entries after cursor {cursor} gave {next} as the next cursor; it must move forward"
    )]
    CursorStuck { entries: usize, cursor: u64, next: u64 },
}

impl Snapshot {
    /// Reads everything but the Kafka topics (the caller adds those if it read them).
    pub async fn collect(
        store: &midflight_store::Store,
        downstreams: &Downstreams,
        timeout: Duration,
    ) -> Result<Snapshot, Error> {
        let mut snapshot = Snapshot::default();
        let mut after = String::new();
        loop {
            let page = store.page(&after, PAGE_ROWS).await?;
            let Some(last) = page.last() else { break };
            after = last.biz_id.clone();
            snapshot.sagas.extend(page);
            bounded(snapshot.sagas.len(), "sagas")?;
        }
        let mut cursor: Option<(String, u64)> = None;
        loop {
            let page = store.transitions_page(cursor.as_ref().map(|(b, v)| (b.as_str(), *v)), PAGE_ROWS).await?;
            let Some(last) = page.last() else { break };
            cursor = Some((last.biz_id.clone(), last.version));
            snapshot.transitions.extend(page);
            bounded(snapshot.transitions.len(), "transitions")?;
        }
        let mut after = String::new();
        loop {
            let page = store.orders_page(&after, PAGE_ROWS).await?;
            let Some(last) = page.last() else { break };
            after = last.biz_id.clone();
            snapshot.orders.extend(page);
            bounded(snapshot.orders.len(), "orders")?;
        }
        snapshot.outbox = store.outbox_rows().await?;
        snapshot.tickets = store.tickets(None, SNAPSHOT_ROWS_MAX as u64).await?;
        (snapshot.wms_ledger, snapshot.logistics_ledger) = Snapshot::collect_ledgers(downstreams, timeout).await?;
        Ok(snapshot)
    }

    /// Both downstream ledgers, whole: (WMS, logistics).
    pub async fn collect_ledgers(
        downstreams: &Downstreams,
        timeout: Duration,
    ) -> Result<(Vec<LedgerEntry>, Vec<LedgerEntry>), Error> {
        let wms = ledger(|cursor| downstreams.wms_ledger(cursor, PAGE_ROWS as u32, timeout)).await?;
        let logistics = ledger(|cursor| downstreams.logistics_ledger(cursor, PAGE_ROWS as u32, timeout)).await?;
        Ok((wms, logistics))
    }
}

async fn ledger<F, Fut>(mut page: F) -> Result<Vec<LedgerEntry>, Error>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<LedgerEntry>, u64), midflight_api::client::Error>>,
{
    let mut entries = Vec::new();
    let mut cursor = 0;
    loop {
        let (batch, next) = page(cursor).await?;
        if batch.is_empty() {
            return Ok(entries);
        }
        // A downstream that does not move its cursor on would have its later entries read as
        // not there: an error, not a shorter ledger.
        if next <= cursor {
            return Err(Error::CursorStuck { entries: batch.len(), cursor, next });
        }
        entries.extend(batch);
        bounded(entries.len(), "ledger entries")?;
        cursor = next;
    }
}

fn bounded(len: usize, what: &'static str) -> Result<(), Error> {
    if len > SNAPSHOT_ROWS_MAX { Err(Error::TooLarge(what)) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use midflight_api::client::LedgerKind;

    use super::*;

    fn entry(seq: u64) -> LedgerEntry {
        LedgerEntry {
            seq,
            kind: LedgerKind::Apply,
            request_id: format!("r{seq}"),
            effect_id: format!("e{seq}"),
            order_no: "o".into(),
            at_ms: 0,
        }
    }

    #[tokio::test]
    async fn a_ledger_is_read_to_its_end_and_a_stuck_cursor_is_an_error() {
        // Two pages, then an empty one.
        let pages = |cursor: u64| async move {
            Ok(match cursor {
                0 => (vec![entry(1), entry(2)], 2),
                2 => (vec![entry(3)], 3),
                _ => (Vec::new(), cursor),
            })
        };
        let seqs: Vec<u64> = ledger(pages).await.expect("ledger").iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        // A page whose next cursor is the protocol's default: not an empty ledger.
        let stuck = ledger(|_| async { Ok((vec![entry(1)], 0)) }).await;
        assert!(matches!(stuck, Err(Error::CursorStuck { entries: 1, cursor: 0, next: 0 })), "{stuck:?}");
    }
}
