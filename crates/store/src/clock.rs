//! An estimate of the database clock that does not cost a round trip per read.
//!
//! The estimate is a database reading plus the monotonic time elapsed since it, re-read when
//! older than [`REFRESH_AFTER`]; a jump of the worker's wall clock cannot move it. Each reading
//! is anchored at the start of its round trip, so the estimate is never behind the database
//! clock (it may be ahead by one round trip; the two clocks drift apart by far less over five
//! seconds): a row the database stamped with its `now` is in
//! the past of every later estimate.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};

use crate::dialect;
use crate::error::{Context, Error};

const REFRESH_AFTER: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct DbClock {
    backend: DbBackend,
    reading: Arc<Mutex<(Instant, i64)>>,
}

impl DbClock {
    pub async fn measure(db: &DatabaseConnection, backend: DbBackend) -> Result<DbClock, Error> {
        let before = Instant::now();
        let db_ms = read(db, backend).await?;
        Ok(DbClock { backend, reading: Arc::new(Mutex::new((before, db_ms))) })
    }

    pub async fn now_ms(&self, db: &DatabaseConnection) -> Result<i64, Error> {
        let (at, db_ms) = *self.reading.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if at.elapsed() < REFRESH_AFTER {
            return Ok(db_ms + at.elapsed().as_millis() as i64);
        }
        let before = Instant::now();
        let fresh = read(db, self.backend).await?;
        // The reading was taken somewhere during the round trip; its start is the safe anchor.
        *self.reading.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = (before, fresh);
        Ok(fresh)
    }
}

async fn read(db: &DatabaseConnection, backend: DbBackend) -> Result<i64, Error> {
    let sql = format!("SELECT {} AS now_ms", dialect::now_ms(backend));
    let row = db.query_one_raw(Statement::from_string(backend, sql)).await.during("read the database clock", None)?;
    let row = row.ok_or_else(|| Error::Invalid("the database returned no clock reading".to_owned()))?;
    row.try_get::<i64>("", "now_ms").during("read the database clock", None)
}
