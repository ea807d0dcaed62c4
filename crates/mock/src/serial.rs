//! One writer at a time, and the ledger's sequence numbers.
//!
//! Each mock applies a call as one short database transaction taken under a tokio mutex. That
//! makes "look up the request id, then insert it" atomic within the process, so two concurrent
//! repeats of one request cannot both apply (the primary key on the request id backs this up at
//! the database), and it lets the mutex also own the next ledger sequence number without a
//! `SELECT MAX` per call. A mock process is the only writer of its ledger database.

use tokio::sync::{Mutex, MutexGuard};

/// The write lock of one ledger, holding the sequence number the next entry gets.
#[derive(Debug)]
pub struct SerialWriter {
    next_seq: Mutex<u64>,
}

impl SerialWriter {
    /// `last_seq` is the highest sequence number already in the ledger (0 when empty).
    pub fn new(last_seq: u64) -> SerialWriter {
        SerialWriter { next_seq: Mutex::new(last_seq + 1) }
    }

    /// Waits for this process's turn to write.
    pub async fn turn(&self) -> WriteTurn<'_> {
        WriteTurn { next_seq: self.next_seq.lock().await, taken: 0 }
    }
}

/// The right to write, until dropped. Sequence numbers taken during a turn count only once the
/// turn is [committed](WriteTurn::committed), so a rolled-back transaction leaves no gap.
#[derive(Debug)]
pub struct WriteTurn<'a> {
    next_seq: MutexGuard<'a, u64>,
    taken: u64,
}

impl WriteTurn<'_> {
    /// The sequence number of the next ledger entry written in this turn.
    pub fn next_seq(&mut self) -> u64 {
        let seq = *self.next_seq + self.taken;
        self.taken += 1;
        seq
    }

    /// Call after the transaction committed.
    pub fn committed(mut self) {
        *self.next_seq += self.taken;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_committed_turns_consume_numbers() {
        let writer = SerialWriter::new(10);
        let mut turn = writer.turn().await;
        assert_eq!((turn.next_seq(), turn.next_seq()), (11, 12));
        drop(turn);
        let mut turn = writer.turn().await;
        assert_eq!(turn.next_seq(), 11);
        turn.committed();
        assert_eq!(writer.turn().await.next_seq(), 12);
    }
}
