//! An estimate of the database clock that does not cost a round trip per read.
//!
//! The estimate is a database reading plus the monotonic time elapsed since it (rounded up to
//! the millisecond), re-read when older than [`REFRESH_AFTER`]; a jump of the worker's wall
//! clock cannot move it. Each reading is anchored at the start of its round trip, so the
//! estimate is never behind the database clock (it may be ahead by one round trip; the two
//! clocks drift apart by far less over five seconds): a row the database stamped with its `now`
//! is in the past of every later estimate. The estimate never goes back: a fresh reading whose
//! round trip was shorter than the last one's would put it behind what was already handed out,
//! so it stays where it was until the clock catches up.
//! One caller refreshes at a time, taking the shortest of up to three round trips; the others
//! go on with the current estimate meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};

use crate::dialect;
use crate::error::{Context, Error};

const REFRESH_AFTER: Duration = Duration::from_secs(5);
/// Readings taken at most at one refresh, looking for a short round trip.
const READS_MAX: usize = 3;
/// A round trip short enough to take its reading at once.
const CLOSE_ENOUGH: Duration = Duration::from_millis(20);

#[derive(Debug, Clone)]
pub struct DbClock {
    backend: DbBackend,
    reading: Arc<Mutex<Reading>>,
    /// One caller refreshes at a time; the others go on with the current estimate meanwhile.
    refreshing: Arc<AtomicBool>,
}

/// Lets the next caller refresh once this one is done, or dropped mid-way.
struct Refreshing<'a>(&'a AtomicBool);

impl Drop for Refreshing<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A database reading, the instant its round trip began, and the latest estimate handed out.
#[derive(Debug, Clone, Copy)]
struct Reading {
    at: Instant,
    db_ms: i64,
    last_ms: i64,
}

impl Reading {
    /// The estimate now, never below one handed out before; notes it as handed out.
    fn estimate(&mut self) -> i64 {
        self.estimate_after(self.at.elapsed())
    }

    /// The estimate `elapsed` after the reading (rounded up to the millisecond).
    fn estimate_after(&mut self, elapsed: Duration) -> i64 {
        let elapsed_ms = i64::try_from(elapsed.as_micros().div_ceil(1000)).unwrap_or(i64::MAX);
        self.last_ms = self.last_ms.max(self.db_ms.saturating_add(elapsed_ms));
        self.last_ms
    }
}

impl DbClock {
    pub async fn measure(db: &DatabaseConnection, backend: DbBackend) -> Result<DbClock, Error> {
        let (at, db_ms) = read_closely(db, backend).await?;
        let reading = Arc::new(Mutex::new(Reading { at, db_ms, last_ms: db_ms }));
        Ok(DbClock { backend, reading, refreshing: Arc::new(AtomicBool::new(false)) })
    }

    /// The reading; a panic while it was held left a plain value behind, still usable.
    fn lock_reading(&self) -> MutexGuard<'_, Reading> {
        self.reading.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub async fn now_ms(&self, db: &DatabaseConnection) -> Result<i64, Error> {
        {
            let mut reading = self.lock_reading();
            if reading.at.elapsed() < REFRESH_AFTER || self.refreshing.swap(true, Ordering::AcqRel) {
                return Ok(reading.estimate());
            }
        }
        let _refreshing = Refreshing(&self.refreshing);
        let (at, db_ms) = match read_closely(db, self.backend).await {
            Ok(fresh) => fresh,
            Err(error) => {
                // The estimate in hand stays good for a while (the two clocks drift apart by
                // parts per million); the next caller tries again.
                tracing::warn!(%error, "cannot read the database clock; going on with the estimate");
                let mut reading = self.lock_reading();
                return Ok(reading.estimate());
            }
        };
        let mut reading = self.lock_reading();
        // The reading was taken somewhere during the round trip; its start is the safe anchor.
        (reading.at, reading.db_ms) = (at, db_ms);
        Ok(reading.estimate())
    }
}

/// A reading anchored at the start of its round trip, which includes any wait for a pooled
/// connection: the estimate runs ahead of the database by that wait until the next refresh (a
/// recovery worker would then see an in-flight window end early). Up to [`READS_MAX`]
/// readings are taken until one's round trip is within [`CLOSE_ENOUGH`]; the closest is kept.
async fn read_closely(db: &DatabaseConnection, backend: DbBackend) -> Result<(Instant, i64), Error> {
    let timed = || async {
        let at = Instant::now();
        let db_ms = read(db, backend).await?;
        Ok::<_, Error>((at.elapsed(), at, db_ms))
    };
    let mut best = timed().await?;
    for _ in 1..READS_MAX {
        if best.0 <= CLOSE_ENOUGH {
            break;
        }
        // A later reading that fails leaves the one in hand.
        match timed().await {
            Ok(next) if next.0 < best.0 => best = next,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    Ok((best.1, best.2))
}

async fn read(db: &DatabaseConnection, backend: DbBackend) -> Result<i64, Error> {
    let sql = format!("SELECT {} AS now_ms", dialect::now_ms(backend));
    let row = db.query_one_raw(Statement::from_string(backend, sql)).await.during("read the database clock", None)?;
    let row = row.ok_or_else(|| Error::Invalid("the database returned no clock reading".to_owned()))?;
    row.try_get::<i64>("", "now_ms").during("read the database clock", None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_estimate_never_goes_back() {
        // A fresh reading 3 ms below what the last one handed out (its round trip was shorter).
        let mut reading = Reading { at: Instant::now(), db_ms: 1_000, last_ms: 1_003 };
        assert_eq!(reading.estimate_after(Duration::ZERO), 1_003);
        assert_eq!(reading.estimate_after(Duration::from_millis(2)), 1_003);
        assert_eq!(reading.estimate_after(Duration::from_millis(5)), 1_005);
        assert_eq!(reading.estimate_after(Duration::from_millis(4)), 1_005, "not back with an earlier instant");
    }

    #[test]
    fn an_estimate_rounds_the_elapsed_time_up() {
        let mut reading = Reading { at: Instant::now(), db_ms: 1_000, last_ms: 1_000 };
        assert_eq!(reading.estimate_after(Duration::from_micros(2_100)), 1_003);
        assert_eq!(reading.estimate_after(Duration::from_micros(3_000)), 1_003);
    }
}
