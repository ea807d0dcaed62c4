//! The mock WMS over real gRPC on loopback: every promise of `wms.v1` and of issue 3, each shown
//! by a call sequence and by the ledger and stock it leaves behind.
//!
//! Deterministic: injected latency is off, the reversal window is crossed with a manual clock,
//! and the server is stopped through its shutdown future, never by waiting.

use std::sync::Arc;
use std::time::Duration;

use midflight_api::faults::v1 as fpb;
use midflight_api::faults::v1::fault_admin_client::FaultAdminClient;
use midflight_api::wms::v1 as pb;
use midflight_api::wms::v1::wms_client::WmsClient;
use midflight_config::DatabaseSection;
use midflight_mock::{FaultPlan, ManualClock};
use midflight_mock_wms::WmsConfig;
use midflight_mock_wms::entity::stock;
use pb::{LedgerKind, LockState, ReverseResult};
use sea_orm::{ConnectionTrait, DatabaseConnection, EntityTrait};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Request};

/// Level of the SKUs the tests lock; small so a wrong deduction shows in the numbers.
const LEVEL: i64 = 100;

/// A SQLite file in the temp directory, removed (with its WAL files) when dropped.
struct TempDb {
    path: std::path::PathBuf,
}

impl TempDb {
    fn new() -> TempDb {
        let name = format!("midflight-mock-wms-{}-{}.db", std::process::id(), rand::random::<u64>());
        TempDb { path: std::env::temp_dir().join(name) }
    }

    fn url(&self) -> String {
        format!("sqlite://{}?mode=rwc", self.path.display())
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
        }
    }
}

fn config(db_url: &str) -> WmsConfig {
    let mut config = WmsConfig {
        database: DatabaseSection { url: db_url.to_owned(), max_connections: 4, ..DatabaseSection::default() },
        faults: FaultPlan { seed: 1, ..FaultPlan::default() },
        ..WmsConfig::default()
    };
    config.stock.generated_skus = 3;
    config.stock.generated_quantity = LEVEL;
    config.stock.skus.insert("EMPTY".to_owned(), 0);
    config
}

/// One running mock WMS and clients of it.
struct Mock {
    wms: WmsClient<Channel>,
    admin: FaultAdminClient<Channel>,
    channel: Channel,
    clock: Arc<ManualClock>,
    db: DatabaseConnection,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), midflight_mock_wms::Error>>,
}

impl Mock {
    async fn start(config: WmsConfig) -> Mock {
        Mock::start_with_clock(config, Arc::new(ManualClock::default())).await
    }

    async fn start_with_clock(config: WmsConfig, clock: Arc<ManualClock>) -> Mock {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback port 0");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let db_section = config.database.clone();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(midflight_mock_wms::run_with_clock(config, listener, clock.clone(), shutdown));
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect to the mock");
        // The server creates the tables before serving; a first call waits for that.
        let mut wms = WmsClient::new(channel.clone());
        wms.list_ledger(pb::ListLedgerRequest { cursor: 0, limit: 1, request_ids: Vec::new() })
            .await
            .expect("mock serves");
        let db = midflight_mock::database::connect(&db_section).await.expect("test connection to the ledger");
        Mock { wms, admin: FaultAdminClient::new(channel.clone()), channel, clock, db, stop, task }
    }

    async fn stop(self) {
        let Mock { wms, admin, channel, stop, task, .. } = self;
        drop((wms, admin, channel));
        stop.send(()).expect("server still running");
        task.await.expect("server task").expect("server ends cleanly");
    }

    async fn lock(
        &mut self,
        request_id: &str,
        sku: &str,
        quantity: i64,
    ) -> Result<pb::LockStockResponse, tonic::Status> {
        let request = pb::LockStockRequest {
            request_id: request_id.to_owned(),
            order_no: format!("order-of-{request_id}"),
            lines: vec![pb::SkuLine { sku: sku.to_owned(), quantity }],
            reversal_voucher: format!("voucher-{request_id}"),
        };
        self.wms.lock_stock(request).await.map(tonic::Response::into_inner)
    }

    async fn reverse(&mut self, request_id: &str, voucher: &str) -> pb::ReverseLockResponse {
        let request = pb::ReverseLockRequest {
            request_id: request_id.to_owned(),
            reversal_voucher: voucher.to_owned(),
            order_no: format!("order-of-{request_id}"),
        };
        self.wms.reverse_lock(request).await.expect("reverse answers").into_inner()
    }

    async fn query(&mut self, request_id: &str) -> pb::QueryLockResponse {
        let request = pb::QueryLockRequest { request_id: request_id.to_owned() };
        self.wms.query_lock(request).await.expect("query answers").into_inner()
    }

    async fn ledger(&mut self) -> Vec<pb::LedgerEntry> {
        let request = pb::ListLedgerRequest { cursor: 0, limit: 0, request_ids: Vec::new() };
        self.wms.list_ledger(request).await.expect("ledger lists").into_inner().entries
    }

    async fn kinds(&mut self) -> Vec<(LedgerKind, String)> {
        self.ledger().await.into_iter().map(|entry| (entry.kind(), entry.request_id)).collect()
    }

    async fn stock(&self, sku: &str) -> i64 {
        let row = stock::Entity::find_by_id(sku.to_owned()).one(&self.db).await.expect("read stock");
        row.expect("sku is seeded").available
    }

    async fn set_faults(&mut self, plan: FaultPlan) -> fpb::FaultPlan {
        self.admin.set_faults(plan.to_proto()).await.expect("plan accepted").into_inner()
    }
}

fn lock_plan(faults: midflight_mock::MethodFaults) -> FaultPlan {
    let mut plan = FaultPlan { seed: 1, ..FaultPlan::default() };
    plan.methods.insert("LockStock".to_owned(), faults);
    plan
}

#[tokio::test]
async fn idempotent_repeat_deducts_once() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    let first = mock.lock("r1", "SKU-0001", 5).await.expect("lock");
    let again = mock.lock("r1", "SKU-0001", 5).await.expect("repeat");
    assert_eq!((first.state(), &first.lock_id), (LockState::Locked, &again.lock_id));
    assert_eq!(again.state(), LockState::Locked);
    assert_eq!(mock.stock("SKU-0001").await, LEVEL - 5);
    assert_eq!(mock.kinds().await, vec![(LedgerKind::Lock, "r1".to_owned())]);
    mock.stop().await;
}

// Two workers, so the repeats really run in parallel against the write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_repeats_deduct_once() {
    let db = TempDb::new();
    let mock = Mock::start(config(&db.url())).await;
    let calls = (0..16).map(|_| {
        let mut wms = mock.wms.clone();
        tokio::spawn(async move {
            let request = pb::LockStockRequest {
                request_id: "same".to_owned(),
                order_no: "o".to_owned(),
                lines: vec![pb::SkuLine { sku: "SKU-0002".to_owned(), quantity: 7 }],
                reversal_voucher: "v".to_owned(),
            };
            wms.lock_stock(request).await.expect("lock").into_inner()
        })
    });
    let answers: Vec<pb::LockStockResponse> =
        futures::future::join_all(calls).await.into_iter().map(|joined| joined.expect("call task")).collect();
    assert!(answers.iter().all(|answer| answer.state() == LockState::Locked && answer.lock_id == answers[0].lock_id));
    assert_eq!(mock.stock("SKU-0002").await, LEVEL - 7);
    let mut mock = mock;
    assert_eq!(mock.ledger().await.len(), 1);
    mock.stop().await;
}

// Many distinct calls at once land in shared group transactions: each must still be applied as
// if alone (stock never oversold, a repeat answered like its first call, no ledger gaps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_applied_in_groups_keep_stock_and_repeats_exact() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    let calls = (0..40).map(|n| {
        let mut wms = mock.wms.clone();
        tokio::spawn(async move {
            // 20 ids, each sent twice; 10 units each of a SKU holding 100: ten can be locked.
            let id = format!("g{}", n % 20);
            let request = pb::LockStockRequest {
                request_id: id.clone(),
                order_no: format!("o-{id}"),
                lines: vec![pb::SkuLine { sku: "SKU-0003".to_owned(), quantity: 10 }],
                reversal_voucher: format!("v-{id}"),
            };
            (id, wms.lock_stock(request).await.expect("lock").into_inner())
        })
    });
    let answers: Vec<(String, pb::LockStockResponse)> =
        futures::future::join_all(calls).await.into_iter().map(|joined| joined.expect("call task")).collect();
    let mut by_id: std::collections::BTreeMap<String, Vec<pb::LockStockResponse>> = Default::default();
    for (id, answer) in answers {
        by_id.entry(id).or_default().push(answer);
    }
    assert!(by_id.values().all(|pair| pair.len() == 2 && pair[0] == pair[1]), "a repeat got another answer: {by_id:?}");
    let locked = by_id.values().filter(|pair| pair[0].state() == LockState::Locked).count();
    let rejected = by_id.values().filter(|pair| pair[0].state() == LockState::Rejected).count();
    assert_eq!((locked, rejected), (10, 10));
    assert_eq!(mock.stock("SKU-0003").await, 0);
    let ledger = mock.ledger().await;
    let seqs: Vec<u64> = ledger.iter().map(|entry| entry.seq).collect();
    assert_eq!(seqs, (1..=20).collect::<Vec<u64>>(), "one entry per distinct id, numbered without gaps");
    mock.stop().await;
}

#[tokio::test]
async fn query_reflects_every_state() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    let unknown = mock.query("nobody").await;
    assert_eq!(
        (unknown.state(), unknown.reversible, unknown.reversal_voucher.as_str()),
        (LockState::NotFound, false, "")
    );

    mock.lock("locked", "SKU-0001", 1).await.expect("lock");
    let locked = mock.query("locked").await;
    assert_eq!((locked.state(), locked.reversible), (LockState::Locked, true));
    assert_eq!((locked.reversal_voucher.as_str(), locked.lock_id.is_empty()), ("voucher-locked", false));

    mock.lock("rejected", "EMPTY", 1).await.expect("rejection is an answer");
    let rejected = mock.query("rejected").await;
    assert_eq!((rejected.state(), rejected.reversible), (LockState::Rejected, false));
    assert!(rejected.reason.contains("not enough stock of EMPTY"), "{rejected:?}");

    mock.lock("reversed", "SKU-0001", 1).await.expect("lock");
    assert_eq!(mock.reverse("reversed", "voucher-reversed").await.result(), ReverseResult::Reversed);
    let reversed = mock.query("reversed").await;
    assert_eq!((reversed.state(), reversed.reversible), (LockState::Reversed, false));

    assert_eq!(mock.reverse("ghost", "voucher-ghost").await.result(), ReverseResult::Tombstoned);
    let ghost = mock.query("ghost").await;
    assert_eq!((ghost.state(), ghost.reversal_voucher.as_str()), (LockState::Tombstoned, "voucher-ghost"));
    mock.stop().await;
}

#[tokio::test]
async fn rejection_is_final_even_after_restock() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    let rejected = mock.lock("r", "EMPTY", 3).await.expect("answer");
    assert_eq!((rejected.state(), rejected.lock_id.as_str()), (LockState::Rejected, ""));
    assert!(rejected.reason.contains("0 available, 3 requested"), "{rejected:?}");
    mock.db.execute_unprepared("UPDATE wms_stock SET available = 50 WHERE sku = 'EMPTY'").await.expect("restock");
    assert_eq!(mock.lock("r", "EMPTY", 3).await.expect("repeat").state(), LockState::Rejected);
    assert_eq!(mock.stock("EMPTY").await, 50);
    assert_eq!(mock.reverse("r", "voucher-r").await.result(), ReverseResult::NothingToReverse);
    assert_eq!(mock.kinds().await, vec![(LedgerKind::Reject, "r".to_owned())]);
    mock.stop().await;
}

#[tokio::test]
async fn reverse_before_lock_leaves_a_tombstone_that_refuses_the_late_lock() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    assert_eq!(mock.reverse("late", "voucher-late").await.result(), ReverseResult::Tombstoned);
    let late = mock.lock("late", "SKU-0003", 10).await.expect("late lock answers");
    assert_eq!((late.state(), late.lock_id.as_str()), (LockState::Tombstoned, ""));
    assert_eq!(mock.stock("SKU-0003").await, LEVEL);
    assert_eq!(mock.reverse("late", "voucher-late").await.result(), ReverseResult::Tombstoned);
    assert_eq!(mock.kinds().await, vec![(LedgerKind::Tombstone, "late".to_owned())]);
    mock.stop().await;
}

#[tokio::test]
async fn wrong_voucher_is_refused_and_reversal_is_idempotent() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    mock.lock("r", "SKU-0001", 4).await.expect("lock");
    assert_eq!(mock.reverse("r", "someone-else").await.result(), ReverseResult::VoucherMismatch);
    assert_eq!((mock.query("r").await.state(), mock.stock("SKU-0001").await), (LockState::Locked, LEVEL - 4));
    assert_eq!(mock.reverse("r", "voucher-r").await.result(), ReverseResult::Reversed);
    assert_eq!(mock.reverse("r", "voucher-r").await.result(), ReverseResult::Reversed);
    assert_eq!(mock.stock("SKU-0001").await, LEVEL);
    let kinds = mock.kinds().await;
    assert_eq!(kinds, vec![(LedgerKind::Lock, "r".to_owned()), (LedgerKind::Reverse, "r".to_owned())]);
    let repeat = mock.lock("r", "SKU-0001", 4).await.expect("repeat after reversal");
    assert_eq!((repeat.state(), mock.stock("SKU-0001").await), (LockState::Reversed, LEVEL));
    mock.stop().await;
}

#[tokio::test]
async fn a_lock_becomes_irreversible_after_the_window() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    mock.set_faults(FaultPlan { irreversible_after_ms: 1_000, seed: 1, ..FaultPlan::default() }).await;
    mock.lock("r", "SKU-0001", 2).await.expect("lock");
    mock.clock.advance(Duration::from_millis(999));
    assert!(mock.query("r").await.reversible);
    mock.clock.advance(Duration::from_millis(1));
    assert!(!mock.query("r").await.reversible);
    let answer = mock.reverse("r", "voucher-r").await;
    assert_eq!(answer.result(), ReverseResult::Irreversible, "{answer:?}");
    assert_eq!((mock.query("r").await.state(), mock.stock("SKU-0001").await), (LockState::Locked, LEVEL - 2));
    mock.stop().await;
}

#[tokio::test]
async fn apply_then_drop_really_applies_while_the_client_gets_an_error() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    mock.set_faults(lock_plan(midflight_mock::MethodFaults { drop_response: 1.0, ..Default::default() })).await;
    let lost = mock.lock("r", "SKU-0001", 3).await.expect_err("the response is lost");
    assert_eq!(lost.code(), Code::Unavailable, "{lost:?}");
    assert_eq!(mock.kinds().await, vec![(LedgerKind::Lock, "r".to_owned())]);
    assert_eq!((mock.query("r").await.state(), mock.stock("SKU-0001").await), (LockState::Locked, LEVEL - 3));
    mock.set_faults(FaultPlan { seed: 1, ..FaultPlan::default() }).await;
    assert_eq!(mock.lock("r", "SKU-0001", 3).await.expect("retry").state(), LockState::Locked);
    assert_eq!(mock.stock("SKU-0001").await, LEVEL - 3);
    mock.stop().await;
}

#[tokio::test]
async fn legacy_mode_deducts_twice_for_the_same_request_id() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    mock.set_faults(FaultPlan { legacy_mode: true, seed: 1, ..FaultPlan::default() }).await;
    let first = mock.lock("incident", "SKU-0001", 6).await.expect("first");
    let second = mock.lock("incident", "SKU-0001", 6).await.expect("second");
    assert_eq!((first.state(), second.state()), (LockState::Locked, LockState::Locked));
    assert_ne!(first.lock_id, second.lock_id);
    assert_eq!(mock.stock("SKU-0001").await, LEVEL - 12);
    let locks = vec![(LedgerKind::Lock, "incident".to_owned()), (LedgerKind::Lock, "incident".to_owned())];
    assert_eq!(mock.kinds().await, locks);
    let status = mock.wms.query_lock(pb::QueryLockRequest { request_id: "incident".to_owned() }).await;
    assert_eq!(status.expect_err("not queryable").code(), Code::Unimplemented);
    // The caller's id still reaches the latest live lock for a manual-style reversal.
    assert_eq!(mock.reverse("incident", "voucher-incident").await.result(), ReverseResult::Reversed);
    assert_eq!(mock.stock("SKU-0001").await, LEVEL - 6);
    // It keeps no tombstones: reversing an id it never saw records nothing.
    assert_eq!(mock.reverse("never-sent", "voucher-never-sent").await.result(), ReverseResult::NothingToReverse);
    assert_eq!(mock.kinds().await.len(), 3, "a lock, a lock, a reversal");

    // Legacy mode turned off: the lock it left in force answers for its request id, so a
    // repeat deducts nothing, a query finds it, and a reversal undoes it.
    mock.set_faults(FaultPlan { seed: 1, ..FaultPlan::default() }).await;
    let again = mock.lock("incident", "SKU-0001", 6).await.expect("repeat");
    assert_eq!((again.state(), again.lock_id.as_str()), (LockState::Locked, first.lock_id.as_str()));
    assert_eq!(mock.stock("SKU-0001").await, LEVEL - 6);
    assert_eq!(mock.query("incident").await.state(), LockState::Locked);
    assert_eq!(mock.reverse("incident", "voucher-incident").await.result(), ReverseResult::Reversed);
    assert_eq!(mock.stock("SKU-0001").await, LEVEL);

    // A request id tombstoned in careful mode, then locked in legacy mode (which keeps no
    // tombstones): once legacy mode is off, its lock in force is what a query and a reversal see.
    assert_eq!(mock.reverse("late", "voucher-late").await.result(), ReverseResult::Tombstoned);
    mock.set_faults(FaultPlan { legacy_mode: true, seed: 1, ..FaultPlan::default() }).await;
    assert_eq!(mock.lock("late", "SKU-0001", 2).await.expect("legacy lock").state(), LockState::Locked);
    mock.set_faults(FaultPlan { seed: 1, ..FaultPlan::default() }).await;
    assert_eq!(mock.query("late").await.state(), LockState::Locked);
    assert_eq!(mock.reverse("late", "voucher-late").await.result(), ReverseResult::Reversed);
    assert_eq!(mock.stock("SKU-0001").await, LEVEL);
    mock.stop().await;
}

#[tokio::test]
async fn bad_input_gets_invalid_argument_and_changes_nothing() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    let good = || pb::LockStockRequest {
        request_id: "r".to_owned(),
        order_no: "o".to_owned(),
        lines: vec![pb::SkuLine { sku: "SKU-0001".to_owned(), quantity: 1 }],
        reversal_voucher: "v".to_owned(),
    };
    let line = |sku: &str, quantity| pb::SkuLine { sku: sku.to_owned(), quantity };
    let cases: Vec<(&str, pb::LockStockRequest, &str)> = vec![
        (
            "empty request_id",
            pb::LockStockRequest { request_id: String::new(), ..good() },
            "request_id must not be empty",
        ),
        ("empty order_no", pb::LockStockRequest { order_no: String::new(), ..good() }, "order_no must not be empty"),
        (
            "negative quantity",
            pb::LockStockRequest { lines: vec![line("SKU-0001", -5)], ..good() },
            "quantity must be in",
        ),
        ("zero quantity", pb::LockStockRequest { lines: vec![line("SKU-0001", 0)], ..good() }, "quantity must be in"),
        ("unknown sku", pb::LockStockRequest { lines: vec![line("NOPE", 1)], ..good() }, "unknown sku \"NOPE\""),
        ("no lines", pb::LockStockRequest { lines: vec![], ..good() }, "lines must hold 1 to 100"),
        (
            "too many lines",
            pb::LockStockRequest { lines: (0..101).map(|n| line(&format!("S{n}"), 1)).collect(), ..good() },
            "got 101",
        ),
        ("long request_id", pb::LockStockRequest { request_id: "x".repeat(129), ..good() }, "at most 128"),
        (
            "long voucher",
            pb::LockStockRequest { reversal_voucher: "x".repeat(129), ..good() },
            "reversal_voucher is 129",
        ),
        (
            "duplicate sku",
            pb::LockStockRequest { lines: vec![line("SKU-0001", 1), line("SKU-0001", 1)], ..good() },
            "more than one line",
        ),
    ];
    for (name, request, message) in cases {
        let status = mock.wms.lock_stock(request).await.expect_err(name);
        assert_eq!(status.code(), Code::InvalidArgument, "{name}: {status:?}");
        assert!(status.message().contains(message), "{name}: {:?}", status.message());
    }
    let huge = pb::LockStockRequest { order_no: "x".repeat(100 * 1024), ..good() };
    let status = mock.wms.lock_stock(huge).await.expect_err("oversized message");
    assert_eq!(status.code(), Code::OutOfRange, "the decoder refuses it before any check: {status:?}");
    assert!(mock.ledger().await.is_empty());
    assert_eq!(mock.stock("SKU-0001").await, LEVEL);
    assert_eq!(mock.query("r").await.state(), LockState::NotFound);
    mock.stop().await;
}

#[tokio::test]
async fn bearer_token_is_enforced_when_configured() {
    let db = TempDb::new();
    let mut config = config(&db.url());
    config.server.bearer_token = Some("s3cret".to_owned());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(midflight_mock_wms::run(config, listener, async move {
        let _ = stopped.await;
    }));
    let channel = Channel::from_shared(format!("http://{addr}")).expect("uri").connect().await.expect("connect");
    let mut wms = WmsClient::new(channel.clone());
    let with = |token: Option<&str>| {
        let mut request = Request::new(pb::QueryLockRequest { request_id: "r".to_owned() });
        if let Some(token) = token {
            request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("ascii"));
        }
        request
    };
    assert_eq!(wms.query_lock(with(None)).await.expect_err("no token").code(), Code::Unauthenticated);
    assert_eq!(wms.query_lock(with(Some("guess"))).await.expect_err("wrong").code(), Code::Unauthenticated);
    let answer = wms.query_lock(with(Some("s3cret"))).await.expect("right token").into_inner();
    assert_eq!(answer.state(), LockState::NotFound);
    let mut admin = FaultAdminClient::new(channel.clone());
    let denied = admin.get_faults(fpb::GetFaultsRequest {}).await.expect_err("admin needs the token too");
    assert_eq!(denied.code(), Code::Unauthenticated);
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let check = tonic_health::pb::HealthCheckRequest { service: "wms.v1.Wms".to_owned() };
    let serving = health.check(check).await.expect("health needs no token").into_inner();
    assert_eq!(serving.status(), tonic_health::pb::health_check_response::ServingStatus::Serving);
    drop((wms, admin, health, channel));
    stop.send(()).expect("running");
    task.await.expect("join").expect("clean stop");
}

#[tokio::test]
async fn fault_plan_changed_at_run_time_takes_effect() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    let plan = lock_plan(midflight_mock::MethodFaults { unavailable: true, ..Default::default() });
    let in_force = mock.set_faults(plan.clone()).await;
    assert_eq!(FaultPlan::from_proto(in_force).expect("valid"), plan);
    let refused = mock.lock("r", "SKU-0001", 1).await.expect_err("unavailable");
    assert_eq!(refused.code(), Code::Unavailable);

    mock.set_faults(lock_plan(midflight_mock::MethodFaults { fail_before_apply: 1.0, ..Default::default() })).await;
    let failed = mock.lock("r", "SKU-0001", 1).await.expect_err("fails before apply");
    assert!(failed.message().contains("before apply"), "{failed:?}");
    assert!(mock.ledger().await.is_empty(), "nothing applied");
    assert_eq!(mock.query("r").await.state(), LockState::NotFound);

    let mut bad = FaultPlan::default().to_proto();
    bad.methods.push(fpb::MethodFaults { method: "Teleport".to_owned(), ..Default::default() });
    let rejected = mock.admin.set_faults(bad).await.expect_err("unknown method");
    assert_eq!(rejected.code(), Code::InvalidArgument);
    assert!(rejected.message().contains("Teleport"), "{rejected:?}");

    mock.set_faults(FaultPlan { seed: 0, ..FaultPlan::default() }).await;
    let current = mock.admin.get_faults(fpb::GetFaultsRequest {}).await.expect("get").into_inner();
    assert!(current.methods.is_empty() && current.seed != 0, "clock seed reported: {current:?}");
    assert_eq!(mock.lock("r", "SKU-0001", 1).await.expect("healthy again").state(), LockState::Locked);
    mock.stop().await;
}

#[tokio::test]
async fn ledger_pages_by_cursor() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    for n in 0..5 {
        mock.lock(&format!("r{n}"), "SKU-0001", 1).await.expect("lock");
    }
    let page = |cursor, limit| pb::ListLedgerRequest { cursor, limit, request_ids: Vec::new() };
    let first = mock.wms.list_ledger(page(0, 2)).await.expect("page").into_inner();
    assert_eq!((first.entries.len(), first.next_cursor), (2, 2));
    let rest = mock.wms.list_ledger(page(first.next_cursor, 100)).await.expect("page").into_inner();
    let seqs: Vec<u64> = rest.entries.iter().map(|entry| entry.seq).collect();
    assert_eq!((seqs, rest.next_cursor), (vec![3, 4, 5], 5));
    let end = mock.wms.list_ledger(page(5, 100)).await.expect("page").into_inner();
    assert_eq!((end.entries.len(), end.next_cursor), (0, 5));
    let entry = &first.entries[0];
    assert_eq!((entry.order_no.as_str(), entry.at_ms), ("order-of-r0", ManualClock::START_MS));
    assert_eq!(entry.lines, vec![pb::SkuLine { sku: "SKU-0001".to_owned(), quantity: 1 }]);
    mock.stop().await;
}

/// A listing filtered by request ids returns every entry of those ids (a lock and its later
/// reversal), in order after the cursor, and nothing else; a filter naming too many ids, or an
/// empty one, is refused.
#[tokio::test]
async fn ledger_lists_the_entries_of_named_request_ids() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    for n in 0..5 {
        mock.lock(&format!("r{n}"), "SKU-0001", 1).await.expect("lock");
    }
    assert_eq!(mock.reverse("r1", "voucher-r1").await.result(), ReverseResult::Reversed);
    let of = |ids: &[&str], cursor, limit| pb::ListLedgerRequest {
        cursor,
        limit,
        request_ids: ids.iter().map(|id| (*id).to_owned()).collect(),
    };
    let listed = mock.wms.list_ledger(of(&["r1", "r3", "unknown"], 0, 0)).await.expect("list").into_inner();
    let seen: Vec<(u64, String)> = listed.entries.iter().map(|e| (e.seq, e.request_id.clone())).collect();
    assert_eq!(seen, vec![(2, "r1".into()), (4, "r3".into()), (6, "r1".into())]);
    assert_eq!(listed.entries[2].kind(), pb::LedgerKind::Reverse);
    assert_eq!(listed.next_cursor, 6);
    let paged = mock.wms.list_ledger(of(&["r1", "r3"], 2, 1)).await.expect("list").into_inner();
    assert_eq!((paged.entries.iter().map(|e| e.seq).collect::<Vec<_>>(), paged.next_cursor), (vec![4], 4));

    let many: Vec<String> = (0..=500).map(|n| format!("r{n}")).collect();
    let refused = mock.wms.list_ledger(pb::ListLedgerRequest { cursor: 0, limit: 0, request_ids: many }).await;
    let status = refused.expect_err("501 ids");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("at most 500"), "{}", status.message());
    let status = mock.wms.list_ledger(of(&["r1", ""], 0, 0)).await.expect_err("an empty id");
    assert!(status.message().contains("request_ids[1] must not be empty"), "{}", status.message());
    mock.stop().await;
}

/// Locks, rejects, reverses and tombstones; restarts on the same database; and checks that the
/// restarted mock remembers all of it and continues the ledger.
async fn restart_keeps_ledger_and_idempotency(db_url: &str) {
    let mut mock = Mock::start(config(db_url)).await;
    let locked = mock.lock("kept", "SKU-0001", 10).await.expect("lock");
    mock.lock("refused", "EMPTY", 1).await.expect("rejection");
    mock.lock("undone", "SKU-0002", 5).await.expect("lock");
    assert_eq!(mock.reverse("undone", "voucher-undone").await.result(), ReverseResult::Reversed);
    assert_eq!(mock.reverse("ghost", "voucher-ghost").await.result(), ReverseResult::Tombstoned);
    let before = mock.ledger().await;
    let clock = Arc::clone(&mock.clock);
    mock.stop().await;

    let mut mock = Mock::start_with_clock(config(db_url), clock).await;
    assert_eq!(mock.ledger().await, before);
    let repeat = mock.lock("kept", "SKU-0001", 10).await.expect("repeat after restart");
    assert_eq!((repeat.state(), repeat.lock_id), (LockState::Locked, locked.lock_id));
    assert_eq!(mock.stock("SKU-0001").await, LEVEL - 10);
    assert_eq!(mock.stock("SKU-0002").await, LEVEL);
    assert_eq!(mock.lock("refused", "EMPTY", 1).await.expect("repeat").state(), LockState::Rejected);
    assert_eq!(mock.lock("ghost", "SKU-0003", 1).await.expect("late lock").state(), LockState::Tombstoned);
    mock.lock("fresh", "SKU-0003", 1).await.expect("new lock");
    let after = mock.ledger().await;
    assert_eq!(after.len(), before.len() + 1);
    assert_eq!(after.last().map(|entry| entry.seq), Some(before.len() as u64 + 1));
    mock.stop().await;
}

#[tokio::test]
async fn restart_on_sqlite_keeps_ledger_and_idempotency() {
    let db = TempDb::new();
    restart_keeps_ledger_and_idempotency(&db.url()).await;
}

#[tokio::test]
async fn restart_on_mysql_keeps_ledger_and_idempotency() {
    let Some(base) = mysql_url() else { return };
    let name = format!("mock_{}", rand::random::<u32>());
    let server = sea_orm::Database::connect(base.as_str()).await.expect("connect to MIDFLIGHT_TEST_MYSQL_URL");
    server.execute_unprepared(&format!("CREATE DATABASE {name}")).await.expect("create a fresh database");
    let url = match base.rsplit_once('/') {
        Some((server_part, _)) => format!("{server_part}/{name}"),
        None => panic!("MIDFLIGHT_TEST_MYSQL_URL must end in /database: {base}"),
    };
    let outcome = tokio::spawn(async move { restart_keeps_ledger_and_idempotency(&url).await }).await;
    server.execute_unprepared(&format!("DROP DATABASE {name}")).await.expect("drop the test database");
    outcome.expect("restart body on mysql");
}

/// The MySQL/MariaDB URL for database tests; in CI its absence is a failure, not a skip.
fn mysql_url() -> Option<String> {
    match std::env::var("MIDFLIGHT_TEST_MYSQL_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
            panic!("CI=true but MIDFLIGHT_TEST_MYSQL_URL is not set: the MySQL tests must run in CI")
        }
        _ => {
            eprintln!("MIDFLIGHT_TEST_MYSQL_URL not set: MySQL restart test not run");
            None
        }
    }
}
