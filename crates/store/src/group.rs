//! Group commit: the transitions of many sagas written in one transaction, so one commit (one
//! flush of the database's log) serves them all. On this kind of box a separate transaction
//! per transition caps the whole system at a few thousand transitions a second, which
//! is fewer than the user's peak needs.
//!
//! What does not change for a saga: its write is still one compare-and-set naming its version
//! and lease epoch (fused with the others of its chunk into one UPDATE, whose rows affected,
//! against the chunk's size, decide `Applied` for all or a conflict for some, which then
//! decide one by one); its
//! log rows, business row, outbox row and ticket are written only if it applied, in the same
//! transaction. A group the database rolls back on its own (a deadlock with another group, a
//! lock wait timeout, SQLite busy) is tried again as a whole, a few times; any other failure
//! fails every member with an error, exactly as a failed transaction of its own would: the
//! driver stops and the lease expires.
//!
//! How a group forms: a dispatcher takes the first queued transition, waits for one of
//! `concurrency` transaction slots, then takes whatever else queued meanwhile (up to `max`).
//! With no linger nothing waits on a timer: at low load a group is one transition; under
//! load it is what arrived while the previous groups committed. With a linger, a group also
//! takes what queues until the linger has passed since its first transition was taken (the
//! wait for a slot counts toward it), so at a moderate rate several transitions share one
//! transaction's round trips instead of each paying them alone.
//!
//! Up to 64 members' compare-and-sets share one prepared UPDATE (`transition.rs`
//! `compare_and_set`), each row still matched by its own member's version and epoch; a chunk
//! that applied only in part is redone member by member. On this box that took the store
//! benchmark from about 3,300 to 5,000 sagas/s on MariaDB and from 3,100 to 4,200 on SQLite
//! (BENCHMARKS.md). Sending a group's statements as one multi-statement text request (values
//! written into the text) was measured and dropped twice: for the large groups of the peak, and
//! for groups of one at 300 msg/s (each transition's `BEGIN` ... `COMMIT` as one request, its
//! writes guarded by its compare-and-set's rows affected). Both times MariaDB spent on parsing
//! the text what the round trips had cost (BENCHMARKS.md, "One request per transition").

use std::sync::Arc;
use std::time::Duration;

use midflight_model::Saga;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::error::{Context, Error};
use crate::transition::Member;
use crate::{Cas, Store};

/// Transitions queued beyond this wait for room before they are queued (back pressure; the
/// consumer's in-flight bound keeps far fewer than this waiting).
const QUEUE_CAPACITY: usize = 8_192;

type Reply = oneshot::Sender<Result<Cas<Saga>, Error>>;

/// The queue in front of the group transactions; dropping the last handle stops the dispatcher.
#[derive(Debug)]
pub(crate) struct GroupCommit {
    queue: mpsc::Sender<(Member, Reply)>,
}

impl GroupCommit {
    /// Starts the dispatcher on the current runtime. `store` must not group itself.
    pub(crate) fn start(store: Store, max: usize, concurrency: usize, linger: Duration) -> GroupCommit {
        let (queue, receiver) = mpsc::channel(QUEUE_CAPACITY);
        tokio::spawn(dispatch(store, receiver, max.max(1), concurrency.max(1), linger));
        GroupCommit { queue }
    }

    /// Queues one transition and waits for its group's outcome.
    pub(crate) async fn submit(&self, member: Member) -> Result<Cas<Saga>, Error> {
        let biz_id = member.before.biz_id.clone();
        let (reply, answer) = oneshot::channel();
        if self.queue.send((member, reply)).await.is_err() {
            return Err(Error::Group { biz_id, message: "the group writer has stopped".to_owned() });
        }
        answer.await.unwrap_or_else(|_| {
            Err(Error::Group {
                biz_id,
                message: "the group transaction was abandoned; its outcome is unknown".to_owned(),
            })
        })
    }
}

async fn dispatch(
    store: Store,
    mut queue: mpsc::Receiver<(Member, Reply)>,
    max: usize,
    concurrency: usize,
    linger: Duration,
) {
    let slots = Arc::new(Semaphore::new(concurrency));
    while let Some(first) = queue.recv().await {
        let until = (!linger.is_zero()).then(|| Instant::now() + linger);
        // A free slot first: whatever queues while we wait joins this group.
        let Ok(slot) = slots.clone().acquire_owned().await else { break };
        let group = gather(&mut queue, first, max, until).await;
        let store = store.clone();
        tokio::spawn(async move {
            commit(&store, group).await;
            drop(slot);
        });
    }
}

/// `first` and what follows it in `queue`, up to `max` in all: whatever is queued now and,
/// with `until`, whatever queues before then. Returns early when every sender is gone.
async fn gather<T>(queue: &mut mpsc::Receiver<T>, first: T, max: usize, until: Option<Instant>) -> Vec<T> {
    let mut group = Vec::with_capacity(max.min(64));
    group.push(first);
    while group.len() < max {
        match queue.try_recv() {
            Ok(item) => group.push(item),
            Err(_) => {
                let Some(until) = until else { break };
                match tokio::time::timeout_at(until, queue.recv()).await {
                    Ok(Some(item)) => group.push(item),
                    Ok(None) | Err(_) => break,
                }
            }
        }
    }
    group
}

async fn commit(store: &Store, mut group: Vec<(Member, Reply)>) {
    // Every group locks its saga rows in key order, so two groups never wait for each other
    // in a cycle over them.
    group.sort_by(|(a, _), (b, _)| a.before.biz_id.cmp(&b.before.biz_id));
    let (members, replies): (Vec<Member>, Vec<Reply>) = group.into_iter().unzip();
    match store.write_group(&members).await {
        Ok(applied) => {
            for ((member, reply), applied) in members.into_iter().zip(replies).zip(applied) {
                let _ = reply.send(Ok(written(member, applied)));
            }
        }
        Err(error) if members.len() > 1 && error.refused_before_commit() => {
            // One member's statement may be what the server refused (a value its row cannot
            // hold): nothing was written, so each member is written alone, and only a member
            // refused alone fails.
            tracing::warn!(%error, members = members.len(), "a group transaction was refused; writing its members one by one");
            for (member, reply) in members.into_iter().zip(replies) {
                let alone = store.write_group(std::slice::from_ref(&member)).await;
                let outcome = match alone {
                    Ok(applied) => Ok(written(member, applied.first() == Some(&true))),
                    Err(error) => Err(error.for_saga(&member.before.biz_id)),
                };
                let _ = reply.send(outcome);
            }
        }
        Err(error) => {
            for (member, reply) in members.iter().zip(replies) {
                let _ = reply.send(Err(error.for_saga(&member.before.biz_id)));
            }
        }
    }
}

/// What a member's write came to, by whether its compare-and-set applied.
fn written(member: Member, applied: bool) -> Cas<Saga> {
    if applied { Cas::Applied(member.into_written()) } else { Cas::Conflict }
}

impl Store {
    /// One group's transaction, tried again while the database rolls it back on its own
    /// (`Store::retry_rolled_back`); per member, whether its compare-and-set applied.
    async fn write_group(&self, members: &[Member]) -> Result<Vec<bool>, Error> {
        self.retry_rolled_back(|| self.try_write_group(members)).await
    }

    async fn try_write_group(&self, members: &[Member]) -> Result<Vec<bool>, Error> {
        let mut txn = self.begin("begin transition group", None).await?;
        let applied = match self.compare_and_set_chunks(&txn, members).await? {
            Some(applied) => applied,
            None => {
                // A chunk's compare-and-set applied to some of its members only: undo the
                // transaction and let each member's own UPDATE decide in a new one.
                txn.rollback().await.during("roll back transition group", None)?;
                txn = self.begin("begin transition group", None).await?;
                self.compare_and_set_each(&txn, members).await?
            }
        };
        self.write_applied(&txn, members, &applied).await?;
        txn.commit().await.during("commit transition group", None)?;
        self.stats.batch_committed();
        self.stats.transitions_written(applied.iter().filter(|ok| **ok).count() as u64);
        Ok(applied)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::mpsc;
    use tokio::time::{Instant, advance};

    use super::gather;

    #[tokio::test]
    async fn without_linger_a_group_is_what_is_queued() {
        let (tx, mut rx) = mpsc::channel(16);
        tx.send(2).await.expect("queue open");
        tx.send(3).await.expect("queue open");
        assert_eq!(gather(&mut rx, 1, 8, None).await, [1, 2, 3]);
        assert_eq!(gather(&mut rx, 4, 8, None).await, [4], "nothing queued: the group is its first alone");
    }

    #[tokio::test]
    async fn a_group_stops_at_its_max() {
        let (tx, mut rx) = mpsc::channel(16);
        for n in 2..=6 {
            tx.send(n).await.expect("queue open");
        }
        assert_eq!(gather(&mut rx, 1, 3, None).await, [1, 2, 3]);
        assert_eq!(gather(&mut rx, 0, 3, Some(Instant::now() + Duration::from_secs(1))).await, [0, 4, 5]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_linger_takes_what_queues_before_it_passes_and_nothing_after() {
        let (tx, mut rx) = mpsc::channel(16);
        let until = Instant::now() + Duration::from_millis(5);
        let group = tokio::spawn(async move { (gather(&mut rx, 1, 8, Some(until)).await, rx) });
        advance(Duration::from_millis(2)).await;
        tx.send(2).await.expect("queue open");
        advance(Duration::from_millis(2)).await;
        tx.send(3).await.expect("queue open");
        advance(Duration::from_millis(2)).await;
        let (group, mut rx) = group.await.expect("queue open");
        assert_eq!(group, [1, 2, 3], "both queued within the 5 ms");
        tx.send(4).await.expect("queue open");
        assert_eq!(rx.try_recv().ok(), Some(4), "queued after the linger: left for the next group");
    }

    #[tokio::test(start_paused = true)]
    async fn a_linger_ends_early_when_the_senders_are_gone() {
        let (tx, mut rx) = mpsc::channel(16);
        tx.send(2).await.expect("queue open");
        drop(tx);
        let started = Instant::now();
        assert_eq!(gather(&mut rx, 1, 8, Some(started + Duration::from_secs(60))).await, [1, 2]);
        assert_eq!(started.elapsed(), Duration::ZERO, "no wait for a queue nobody can fill");
    }
}
