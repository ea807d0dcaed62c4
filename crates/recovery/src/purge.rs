//! Deleting finished sagas past the horizon of [`PurgeSection`], a batch (one transaction) at a
//! time: full batches follow each other `pause_ms` apart until one comes back short, then the
//! purge waits `interval_ms`. Several workers may purge at once, but they pick the same oldest
//! candidates: when two take the same batch, one deletes it and the other's is rolled back
//! (it deleted nothing) and waits `interval_ms`, so in effect one worker purges at a time.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use midflight_store::{Purged, Store};
use tokio_util::sync::CancellationToken;

use crate::config::PurgeSection;
use crate::worker::{Stats, bounded};

/// Purges until `shutdown`; returns at once when purging is off. A batch cut off by shutdown
/// is rolled back whole: its rows are deleted by a later one.
pub(crate) async fn purge_periodically(
    store: Store,
    section: PurgeSection,
    stats: Arc<Stats>,
    shutdown: CancellationToken,
) {
    let Some(horizon) = section.horizon() else { return };
    let older_than_ms = i64::try_from(horizon.as_millis()).unwrap_or(i64::MAX);
    tracing::info!(after_hours = section.after_hours, "purging finished sagas past the horizon");
    // The first batch comes soon after start: a backlog is worked off from the start.
    let mut pause = Duration::from_millis(section.pause_ms);
    let mut round = Purged::default();
    loop {
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = shutdown.cancelled() => return,
        }
        let batch = tokio::select! {
            result = bounded("purge finished sagas", store.purge_finished(older_than_ms, section.batch_rows)) => result,
            () = shutdown.cancelled() => return,
        };
        let full = match batch {
            Ok(purged) => {
                stats.purged_sagas.fetch_add(purged.sagas, Ordering::Relaxed);
                stats.purged_transitions.fetch_add(purged.transitions, Ordering::Relaxed);
                stats.purged_outbox.fetch_add(purged.outbox, Ordering::Relaxed);
                stats.purge_rolled_back.fetch_add(purged.rolled_back, Ordering::Relaxed);
                round += purged;
                purged.sagas >= section.batch_rows
            }
            Err(error) => {
                stats.purge_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, "purge batch failed; trying again at the next interval");
                false
            }
        };
        if full {
            pause = Duration::from_millis(section.pause_ms);
            continue;
        }
        if round.sagas > 0 {
            tracing::info!(
                sagas = round.sagas,
                transitions = round.transitions,
                outbox = round.outbox,
                "purged finished sagas past the horizon"
            );
        }
        round = Purged::default();
        pause = Duration::from_millis(section.interval_ms);
    }
}
