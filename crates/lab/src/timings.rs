//! Per-message timings of the designs that keep no transition log (the legacy consumer and the
//! benchmark's baseline B): one CSV line per finished message,
//! `biz_id,received_at_ms,done_at_ms,call_ms`, appended to a file the benchmark reads after the
//! run. Times are the wall clock of this
//! machine, the same clock the databases and the lab read.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;

/// Lines are flushed at least this often, so a graceful stop loses nothing and a crash little.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// One finished message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    pub biz_id: String,
    /// When the consumer had the message (ms since the Unix epoch): taken from Kafka (the
    /// baselines) or inserted in the inbox (midflight, the arrival log row). `None` if unknown.
    pub received_at_ms: Option<i64>,
    /// When the message was finished (ms since the Unix epoch).
    pub done_at_ms: i64,
    /// Time spent in downstream calls for it (ms).
    pub call_ms: u64,
}

/// An append-only timings file shared by a process's tasks.
#[derive(Debug)]
pub struct TimingsFile {
    state: Mutex<(BufWriter<File>, Instant)>,
}

impl TimingsFile {
    /// Opens `path` for appending (a restarted process adds to its predecessor's lines).
    pub fn open(path: &Path) -> anyhow::Result<TimingsFile> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        Ok(TimingsFile { state: Mutex::new((BufWriter::new(file), Instant::now())) })
    }

    pub fn record(&self, biz_id: &str, received_at_ms: i64, done_at_ms: i64, call_ms: u64) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (writer, flushed) = &mut *state;
        // A lost line only makes the benchmark's latency sample smaller; it never stops a consumer.
        let _ = writeln!(writer, "{biz_id},{received_at_ms},{done_at_ms},{call_ms}");
        if flushed.elapsed() >= FLUSH_EVERY {
            let _ = writer.flush();
            *flushed = Instant::now();
        }
    }

    pub fn flush(&self) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = state.0.flush();
    }
}

impl Drop for TimingsFile {
    fn drop(&mut self) {
        self.flush();
    }
}

/// The wall clock in ms since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Every line of every timings file in `dir` (none if the directory does not exist).
pub fn read_dir(dir: &Path) -> anyhow::Result<Vec<Timing>> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(out) };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        let file = File::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
        for line in BufReader::new(file).lines() {
            let line = line?;
            let mut parts = line.rsplitn(4, ',');
            let (Some(call_ms), Some(done_at_ms), Some(received_at_ms), Some(biz_id)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if let (Ok(received_at_ms), Ok(done_at_ms), Ok(call_ms)) =
                (received_at_ms.parse(), done_at_ms.parse(), call_ms.parse())
            {
                out.push(Timing {
                    biz_id: biz_id.to_owned(),
                    received_at_ms: Some(received_at_ms),
                    done_at_ms,
                    call_ms,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_read_back_as_recorded() {
        let dir = std::env::temp_dir().join(format!("midflight-timings-{}", std::process::id()));
        let file = TimingsFile::open(&dir.join("consumer-1.csv")).expect("open");
        file.record("order-7:created", 1_000, 1_250, 180);
        file.record("order-8:created", 1_010, 1_300, 200);
        drop(file);
        std::fs::write(dir.join("torn.csv"), "order-9:created,1_020\n").expect("write");
        let timings = read_dir(&dir).expect("read");
        std::fs::remove_dir_all(&dir).expect("remove the temp dir");
        assert_eq!(
            timings,
            vec![
                Timing {
                    biz_id: "order-7:created".to_owned(),
                    received_at_ms: Some(1_000),
                    done_at_ms: 1_250,
                    call_ms: 180
                },
                Timing {
                    biz_id: "order-8:created".to_owned(),
                    received_at_ms: Some(1_010),
                    done_at_ms: 1_300,
                    call_ms: 200
                },
            ]
        );
    }
}
