//! One writer at a time, the ledger's sequence numbers, and group commit.
//!
//! Each mock applies its writes in short database transactions taken under a tokio mutex. That
//! makes "look up the request id, then insert it" atomic within the process, so two concurrent
//! repeats of one request cannot both apply (the primary key on the request id backs this up at
//! the database), and it lets the mutex also own the next ledger sequence number without a
//! `SELECT MAX` per call. A mock process is the only writer of its ledger database.
//!
//! The hot calls (LockStock, CreateShipment) are applied in groups ([`Group`]): a call queues
//! its request, and whoever holds the next write turn applies every request queued by then in
//! one transaction, in queue order, exactly as if they had been applied one by one (a repeat of
//! a request earlier in the same group gets that request's answer). One commit per group
//! instead of one per call is what lets a mock keep up with thousands of calls a second; at low
//! load a group is a single call and waits for nothing.

use std::future::Future;

use tokio::sync::{Mutex, MutexGuard, oneshot};

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
        self.commit_taken();
    }

    /// The transaction that used the numbers taken so far committed; the turn goes on (a group
    /// applied in several transactions).
    pub fn commit_taken(&mut self) {
        *self.next_seq += self.taken;
        self.taken = 0;
    }

    /// The transaction that used the numbers taken so far rolled back: they are given again.
    pub fn return_taken(&mut self) {
        self.taken = 0;
    }
}

/// A queued request and where its answer goes.
#[derive(Debug)]
pub struct Waiting<R, A> {
    pub request: R,
    pub reply: oneshot::Sender<A>,
}

/// Requests waiting for the next group transaction.
#[derive(Debug)]
pub struct Group<R, A> {
    queue: std::sync::Mutex<Vec<Waiting<R, A>>>,
}

/// The group a request was queued in was dropped before answering (its applier was cancelled
/// or panicked): whether it was applied is unknown to this caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abandoned;

impl<R, A> Default for Group<R, A> {
    fn default() -> Self {
        Group { queue: std::sync::Mutex::new(Vec::new()) }
    }
}

impl<R, A> Group<R, A> {
    /// Queues `request` and returns its answer. If this caller gets the write turn before
    /// someone else has applied its request, it applies everything queued (its own request and
    /// any that arrived meanwhile) with `apply`, which must answer every request it is given.
    pub async fn submit<'a, F, Fut>(&'a self, writer: &'a SerialWriter, request: R, apply: F) -> Result<A, Abandoned>
    where
        F: FnOnce(WriteTurn<'a>, Vec<Waiting<R, A>>) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (reply, mut answer) = oneshot::channel();
        self.lock().push(Waiting { request, reply });
        loop {
            let turn = tokio::select! {
                biased;
                answer = &mut answer => return answer.map_err(|_| Abandoned),
                turn = writer.turn() => turn,
            };
            let batch = std::mem::take(&mut *self.lock());
            if batch.is_empty() {
                // An earlier turn took our request; its answer is on the way.
                continue;
            }
            apply(turn, batch).await;
            return answer.await.map_err(|_| Abandoned);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waiting<R, A>>> {
        self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_applies_what_queued_while_the_turn_was_held() {
        let writer = std::sync::Arc::new(SerialWriter::new(0));
        let group = std::sync::Arc::new(Group::<u64, (u64, usize)>::default());
        // Hold the turn so the calls below queue up behind it.
        let held = writer.turn().await;
        let calls: Vec<_> = (0..5_u64)
            .map(|n| {
                let (writer, group) = (writer.clone(), group.clone());
                tokio::spawn(async move {
                    group
                        .submit(&writer, n, |mut turn, batch| async move {
                            let size = batch.len();
                            for waiting in batch {
                                let _ = waiting.reply.send((turn.next_seq(), size));
                            }
                            turn.committed();
                        })
                        .await
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while group.lock().len() < 5 {
            assert!(std::time::Instant::now() < deadline, "five calls did not queue in 30 s");
            tokio::task::yield_now().await;
        }
        drop(held);
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.expect("task").expect("answered"));
        }
        // One group of five, numbered in queue order without gaps.
        assert!(answers.iter().all(|(_, size)| *size == 5), "{answers:?}");
        let mut seqs: Vec<u64> = answers.iter().map(|(seq, _)| *seq).collect();
        seqs.sort_unstable();
        assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
    }

    #[tokio::test]
    async fn a_dropped_group_is_reported_as_abandoned() {
        let writer = SerialWriter::new(0);
        let group = Group::<u64, u64>::default();
        let answer = group.submit(&writer, 1, |_turn, batch| async move { drop(batch) }).await;
        assert_eq!(answer, Err(Abandoned));
    }
}
