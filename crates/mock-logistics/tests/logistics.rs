//! The mock logistics provider over real gRPC on loopback: every promise of `logistics.v1` and
//! of issue 3, each shown by a call sequence and by the ledger it leaves behind.
//!
//! Deterministic: injected latency is off, pickup is reached with a manual clock, and the server
//! is stopped through its shutdown future, never by waiting.

use std::sync::Arc;
use std::time::Duration;

use midflight_api::faults::v1 as fpb;
use midflight_api::faults::v1::fault_admin_client::FaultAdminClient;
use midflight_api::logistics::v1 as pb;
use midflight_api::logistics::v1::logistics_client::LogisticsClient;
use midflight_config::DatabaseSection;
use midflight_mock::{FaultPlan, ManualClock, MethodFaults};
use midflight_mock_logistics::LogisticsConfig;
use pb::{CancelResult, LedgerKind, ShipmentState};
use sea_orm::ConnectionTrait;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Request};

/// A SQLite file in the temp directory, removed (with its WAL files) when dropped.
struct TempDb {
    path: std::path::PathBuf,
}

impl TempDb {
    fn new() -> TempDb {
        let name = format!("midflight-mock-logistics-{}-{}.db", std::process::id(), rand::random::<u64>());
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

fn config(db_url: &str) -> LogisticsConfig {
    LogisticsConfig {
        database: DatabaseSection { url: db_url.to_owned(), max_connections: 4, ..DatabaseSection::default() },
        faults: FaultPlan { seed: 1, ..FaultPlan::default() },
        ..LogisticsConfig::default()
    }
}

/// One running mock logistics provider and clients of it.
struct Mock {
    logistics: LogisticsClient<Channel>,
    admin: FaultAdminClient<Channel>,
    clock: Arc<ManualClock>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), midflight_mock_logistics::Error>>,
}

impl Mock {
    async fn start(config: LogisticsConfig) -> Mock {
        Mock::start_with_clock(config, Arc::new(ManualClock::default())).await
    }

    async fn start_with_clock(config: LogisticsConfig, clock: Arc<ManualClock>) -> Mock {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback port 0");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(midflight_mock_logistics::run_with_clock(config, listener, clock.clone(), shutdown));
        let channel = Channel::from_shared(format!("http://{addr}")).expect("uri").connect().await.expect("connect");
        Mock {
            logistics: LogisticsClient::new(channel.clone()),
            admin: FaultAdminClient::new(channel),
            clock,
            stop,
            task,
        }
    }

    async fn stop(self) {
        let Mock { logistics, admin, stop, task, .. } = self;
        drop((logistics, admin));
        stop.send(()).expect("server still running");
        task.await.expect("server task").expect("server ends cleanly");
    }

    async fn create(&mut self, request_id: &str, region: &str) -> Result<pb::ShipmentResponse, tonic::Status> {
        let request = pb::CreateShipmentRequest {
            request_id: request_id.to_owned(),
            order_no: format!("order-of-{request_id}"),
            address: Some(address(region)),
            cancel_voucher: format!("voucher-{request_id}"),
        };
        self.logistics.create_shipment(request).await.map(tonic::Response::into_inner)
    }

    async fn cancel(&mut self, request_id: &str, voucher: &str) -> pb::CancelShipmentResponse {
        let request = pb::CancelShipmentRequest {
            request_id: request_id.to_owned(),
            cancel_voucher: voucher.to_owned(),
            order_no: format!("order-of-{request_id}"),
        };
        self.logistics.cancel_shipment(request).await.expect("cancel answers").into_inner()
    }

    async fn query(&mut self, request_id: &str) -> pb::ShipmentResponse {
        let request = pb::QueryShipmentRequest { request_id: request_id.to_owned() };
        self.logistics.query_shipment(request).await.expect("query answers").into_inner()
    }

    async fn ledger(&mut self) -> Vec<pb::LedgerEntry> {
        let request = pb::ListLedgerRequest { cursor: 0, limit: 0, request_ids: Vec::new() };
        self.logistics.list_ledger(request).await.expect("ledger lists").into_inner().entries
    }

    async fn kinds(&mut self) -> Vec<(LedgerKind, String)> {
        self.ledger().await.into_iter().map(|entry| (entry.kind(), entry.request_id)).collect()
    }

    async fn set_faults(&mut self, plan: FaultPlan) -> fpb::FaultPlan {
        self.admin.set_faults(plan.to_proto()).await.expect("plan accepted").into_inner()
    }
}

fn address(region: &str) -> pb::Address {
    pb::Address {
        region: region.to_owned(),
        city: "Hangzhou".to_owned(),
        line: "1 West Lake Road".to_owned(),
        postal_code: "310000".to_owned(),
    }
}

fn create_plan(faults: MethodFaults) -> FaultPlan {
    let mut plan = FaultPlan { seed: 1, ..FaultPlan::default() };
    plan.methods.insert("CreateShipment".to_owned(), faults);
    plan
}

#[tokio::test]
async fn idempotent_repeat_creates_one_shipment() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    let first = mock.create("s1", "ZJ").await.expect("create");
    let again = mock.create("s1", "ZJ").await.expect("repeat");
    assert_eq!((first.state(), first.tracking_no.as_str()), (ShipmentState::Created, "TRK000000000001"));
    assert_eq!(again, first);
    assert_eq!(mock.kinds().await, vec![(LedgerKind::Create, "s1".to_owned())]);
    mock.stop().await;
}

/// A listing filtered by request ids returns every entry of those ids, in order, and nothing
/// else; a filter naming too many ids is refused.
#[tokio::test]
async fn ledger_lists_the_entries_of_named_request_ids() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    for n in 0..4 {
        mock.create(&format!("s{n}"), "ZJ").await.expect("create");
    }
    assert_eq!(mock.cancel("s2", "voucher-s2").await.result(), pb::CancelResult::Cancelled);
    let request = |ids: Vec<String>| pb::ListLedgerRequest { cursor: 0, limit: 0, request_ids: ids };
    let listed = mock.logistics.list_ledger(request(vec!["s2".into(), "s0".into()])).await.expect("list").into_inner();
    let seen: Vec<(u64, LedgerKind, String)> =
        listed.entries.iter().map(|e| (e.seq, e.kind(), e.request_id.clone())).collect();
    assert_eq!(
        seen,
        vec![
            (1, LedgerKind::Create, "s0".into()),
            (3, LedgerKind::Create, "s2".into()),
            (5, LedgerKind::Cancel, "s2".into())
        ]
    );
    let many: Vec<String> = (0..=500).map(|n| format!("s{n}")).collect();
    let status = mock.logistics.list_ledger(request(many)).await.expect_err("501 ids");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    mock.stop().await;
}

// Two workers, so the repeats really run in parallel against the write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_repeats_create_one_shipment() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    let calls = (0..16).map(|_| {
        let mut logistics = mock.logistics.clone();
        tokio::spawn(async move {
            let request = pb::CreateShipmentRequest {
                request_id: "same".to_owned(),
                order_no: "o".to_owned(),
                address: Some(address("ZJ")),
                cancel_voucher: "v".to_owned(),
            };
            logistics.create_shipment(request).await.expect("create").into_inner()
        })
    });
    let answers: Vec<pb::ShipmentResponse> =
        futures::future::join_all(calls).await.into_iter().map(|joined| joined.expect("call task")).collect();
    assert!(answers.iter().all(|answer| answer == &answers[0] && answer.state() == ShipmentState::Created));
    assert_eq!(mock.ledger().await.len(), 1);
    mock.stop().await;
}

// Many distinct calls at once land in shared group transactions: each must still be applied as
// if alone (a repeat answered like its first call, rejections per call, no ledger gaps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_applied_in_groups_keep_repeats_exact() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    let calls = (0..40).map(|n| {
        let mut logistics = mock.logistics.clone();
        tokio::spawn(async move {
            // 20 ids, each sent twice; every fourth goes to a region the provider does not serve.
            let id = format!("g{}", n % 20);
            let region = if n % 4 == 0 { "XX" } else { "ZJ" };
            let request = pb::CreateShipmentRequest {
                request_id: id.clone(),
                order_no: format!("o-{id}"),
                address: Some(address(region)),
                cancel_voucher: format!("v-{id}"),
            };
            (id, logistics.create_shipment(request).await.expect("create").into_inner())
        })
    });
    let answers: Vec<(String, pb::ShipmentResponse)> =
        futures::future::join_all(calls).await.into_iter().map(|joined| joined.expect("call task")).collect();
    let mut by_id: std::collections::BTreeMap<String, Vec<pb::ShipmentResponse>> = Default::default();
    for (id, answer) in answers {
        by_id.entry(id).or_default().push(answer);
    }
    assert!(by_id.values().all(|pair| pair.len() == 2 && pair[0] == pair[1]), "a repeat got another answer: {by_id:?}");
    let created: std::collections::BTreeSet<&str> = by_id
        .values()
        .filter(|pair| pair[0].state() == ShipmentState::Created)
        .map(|pair| pair[0].tracking_no.as_str())
        .collect();
    let rejected = by_id.values().filter(|pair| pair[0].state() == ShipmentState::Rejected).count();
    assert_eq!((created.len(), rejected), (15, 5), "distinct tracking numbers, one rejection per XX id");
    let seqs: Vec<u64> = mock.ledger().await.iter().map(|entry| entry.seq).collect();
    assert_eq!(seqs, (1..=20).collect::<Vec<u64>>(), "one entry per distinct id, numbered without gaps");
    mock.stop().await;
}

#[tokio::test]
async fn query_reflects_every_state() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    let unknown = mock.query("nobody").await;
    assert_eq!(
        (unknown.state(), unknown.cancellable, unknown.cancel_voucher.as_str()),
        (ShipmentState::NotFound, false, "")
    );

    mock.create("created", "ZJ").await.expect("create");
    let created = mock.query("created").await;
    assert_eq!((created.state(), created.cancellable), (ShipmentState::Created, true));
    assert_eq!((created.cancel_voucher.as_str(), created.tracking_no.is_empty()), ("voucher-created", false));

    let rejected = mock.create("rejected", "XX").await.expect("rejection is an answer");
    assert_eq!((rejected.state(), rejected.tracking_no.as_str()), (ShipmentState::Rejected, ""));
    assert!(rejected.reason.contains("not serviceable"), "{rejected:?}");
    assert_eq!(mock.query("rejected").await.state(), ShipmentState::Rejected);

    mock.create("cancelled", "ZJ").await.expect("create");
    assert_eq!(mock.cancel("cancelled", "voucher-cancelled").await.result(), CancelResult::Cancelled);
    let cancelled = mock.query("cancelled").await;
    assert_eq!((cancelled.state(), cancelled.cancellable), (ShipmentState::Cancelled, false));

    assert_eq!(mock.cancel("ghost", "voucher-ghost").await.result(), CancelResult::Tombstoned);
    assert_eq!(mock.query("ghost").await.state(), ShipmentState::Tombstoned);
    mock.stop().await;
}

#[tokio::test]
async fn cancel_before_create_leaves_a_tombstone_that_refuses_the_late_creation() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    assert_eq!(mock.cancel("late", "voucher-late").await.result(), CancelResult::Tombstoned);
    let late = mock.create("late", "ZJ").await.expect("late creation answers");
    assert_eq!((late.state(), late.tracking_no.as_str()), (ShipmentState::Tombstoned, ""));
    assert_eq!(mock.cancel("late", "voucher-late").await.result(), CancelResult::Tombstoned);
    assert_eq!(mock.kinds().await, vec![(LedgerKind::Tombstone, "late".to_owned())]);
    mock.stop().await;
}

#[tokio::test]
async fn wrong_voucher_is_refused_and_cancel_is_idempotent() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    mock.create("s", "ZJ").await.expect("create");
    assert_eq!(mock.cancel("s", "someone-else").await.result(), CancelResult::VoucherMismatch);
    assert_eq!(mock.query("s").await.state(), ShipmentState::Created);
    assert_eq!(mock.cancel("s", "voucher-s").await.result(), CancelResult::Cancelled);
    assert_eq!(mock.cancel("s", "voucher-s").await.result(), CancelResult::Cancelled);
    assert_eq!(mock.kinds().await, vec![(LedgerKind::Create, "s".to_owned()), (LedgerKind::Cancel, "s".to_owned())]);
    let rejected = mock.create("r", "XX").await.expect("rejected");
    assert_eq!(rejected.state(), ShipmentState::Rejected);
    assert_eq!(mock.cancel("r", "voucher-r").await.result(), CancelResult::NothingToCancel);
    mock.stop().await;
}

#[tokio::test]
async fn a_shipment_cannot_be_cancelled_after_pickup() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    mock.set_faults(FaultPlan { irreversible_after_ms: 60_000, seed: 1, ..FaultPlan::default() }).await;
    let created = mock.create("s", "ZJ").await.expect("create");
    mock.clock.advance(Duration::from_millis(59_999));
    assert!(mock.query("s").await.cancellable);
    mock.clock.advance(Duration::from_millis(1));
    assert!(!mock.query("s").await.cancellable);
    let answer = mock.cancel("s", "voucher-s").await;
    assert_eq!((answer.result(), answer.tracking_no), (CancelResult::Irreversible, created.tracking_no));
    assert_eq!(mock.query("s").await.state(), ShipmentState::Created);
    mock.stop().await;
}

#[tokio::test]
async fn apply_then_drop_really_creates_while_the_client_gets_an_error() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    mock.set_faults(create_plan(MethodFaults { drop_response: 1.0, ..Default::default() })).await;
    let lost = mock.create("s", "ZJ").await.expect_err("the response is lost");
    assert_eq!(lost.code(), Code::Unavailable, "{lost:?}");
    assert_eq!(mock.kinds().await, vec![(LedgerKind::Create, "s".to_owned())]);
    let found = mock.query("s").await;
    assert_eq!(found.state(), ShipmentState::Created);
    mock.set_faults(FaultPlan { seed: 1, ..FaultPlan::default() }).await;
    assert_eq!(mock.create("s", "ZJ").await.expect("retry").tracking_no, found.tracking_no);
    assert_eq!(mock.ledger().await.len(), 1);
    mock.stop().await;
}

#[tokio::test]
async fn bad_input_gets_invalid_argument_and_changes_nothing() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    let good = || pb::CreateShipmentRequest {
        request_id: "s".to_owned(),
        order_no: "o".to_owned(),
        address: Some(address("ZJ")),
        cancel_voucher: "v".to_owned(),
    };
    let cases: Vec<(&str, pb::CreateShipmentRequest, &str)> = vec![
        (
            "empty request_id",
            pb::CreateShipmentRequest { request_id: String::new(), ..good() },
            "request_id must not be empty",
        ),
        (
            "empty order_no",
            pb::CreateShipmentRequest { order_no: String::new(), ..good() },
            "order_no must not be empty",
        ),
        ("no address", pb::CreateShipmentRequest { address: None, ..good() }, "address is required"),
        (
            "empty region",
            pb::CreateShipmentRequest { address: Some(address("")), ..good() },
            "address.region must not be empty",
        ),
        (
            "long city",
            pb::CreateShipmentRequest {
                address: Some(pb::Address { city: "x".repeat(129), ..address("ZJ") }),
                ..good()
            },
            "address.city is 129 bytes",
        ),
        ("long request_id", pb::CreateShipmentRequest { request_id: "x".repeat(129), ..good() }, "at most 128"),
    ];
    for (name, request, message) in cases {
        let status = mock.logistics.create_shipment(request).await.expect_err(name);
        assert_eq!(status.code(), Code::InvalidArgument, "{name}: {status:?}");
        assert!(status.message().contains(message), "{name}: {:?}", status.message());
    }
    let huge = pb::CreateShipmentRequest { order_no: "x".repeat(100 * 1024), ..good() };
    let status = mock.logistics.create_shipment(huge).await.expect_err("oversized message");
    assert_eq!(status.code(), Code::OutOfRange, "the decoder refuses it before any check: {status:?}");
    let empty_cancel = pb::CancelShipmentRequest { request_id: String::new(), ..Default::default() };
    let status = mock.logistics.cancel_shipment(empty_cancel).await.expect_err("empty id");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(mock.ledger().await.is_empty());
    assert_eq!(mock.query("s").await.state(), ShipmentState::NotFound);
    mock.stop().await;
}

#[tokio::test]
async fn bearer_token_is_enforced_when_configured() {
    let db = TempDb::new();
    let mut config = config(&db.url());
    config.server.bearer_token = Some("s3cret".to_owned());
    let mut mock = Mock::start(config).await;
    let with = |token: Option<&str>| {
        let mut request = Request::new(pb::QueryShipmentRequest { request_id: "s".to_owned() });
        if let Some(token) = token {
            request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("ascii"));
        }
        request
    };
    assert_eq!(mock.logistics.query_shipment(with(None)).await.expect_err("none").code(), Code::Unauthenticated);
    assert_eq!(mock.logistics.query_shipment(with(Some("x"))).await.expect_err("wrong").code(), Code::Unauthenticated);
    let answer = mock.logistics.query_shipment(with(Some("s3cret"))).await.expect("right token").into_inner();
    assert_eq!(answer.state(), ShipmentState::NotFound);
    mock.stop().await;
}

#[tokio::test]
async fn fault_plan_changed_at_run_time_takes_effect() {
    let db = TempDb::new();
    let mut mock = Mock::start(config(&db.url())).await;
    mock.set_faults(create_plan(MethodFaults { unavailable: true, ..Default::default() })).await;
    assert_eq!(mock.create("s", "ZJ").await.expect_err("unavailable").code(), Code::Unavailable);
    mock.set_faults(create_plan(MethodFaults { fail_before_apply: 1.0, ..Default::default() })).await;
    assert_eq!(mock.create("s", "ZJ").await.expect_err("fails before apply").code(), Code::Unavailable);
    assert!(mock.ledger().await.is_empty(), "nothing applied");
    let legacy_is_a_wms_fault = FaultPlan { legacy_mode: true, seed: 1, ..FaultPlan::default() };
    mock.set_faults(legacy_is_a_wms_fault).await;
    let got = mock.admin.get_faults(fpb::GetFaultsRequest {}).await.expect("get").into_inner();
    assert!(got.methods.is_empty() && got.legacy_mode);
    assert_eq!(mock.create("s", "ZJ").await.expect("healthy again").state(), ShipmentState::Created);
    assert_eq!(mock.create("s", "ZJ").await.expect("repeat").state(), ShipmentState::Created);
    assert_eq!(mock.ledger().await.len(), 1, "legacy mode does not change logistics");
    mock.stop().await;
}

#[tokio::test]
async fn health_reports_serving_without_a_token() {
    let db = TempDb::new();
    let mut config = config(&db.url());
    config.server.bearer_token = Some("s3cret".to_owned());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(midflight_mock_logistics::run(config, listener, async move {
        let _ = stopped.await;
    }));
    let channel = Channel::from_shared(format!("http://{addr}")).expect("uri").connect().await.expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let check = tonic_health::pb::HealthCheckRequest { service: "logistics.v1.Logistics".to_owned() };
    let serving = health.check(check).await.expect("health needs no token").into_inner();
    assert_eq!(serving.status(), tonic_health::pb::health_check_response::ServingStatus::Serving);
    drop(health);
    stop.send(()).expect("running");
    task.await.expect("join").expect("clean stop");
}

/// Creates, rejects, cancels and tombstones; restarts on the same database; and checks that the
/// restarted mock remembers all of it and continues the ledger and the tracking numbers.
async fn restart_keeps_ledger_and_idempotency(db_url: &str) {
    let mut mock = Mock::start(config(db_url)).await;
    let kept = mock.create("kept", "ZJ").await.expect("create");
    mock.create("refused", "XX").await.expect("rejection");
    mock.create("undone", "ZJ").await.expect("create");
    assert_eq!(mock.cancel("undone", "voucher-undone").await.result(), CancelResult::Cancelled);
    assert_eq!(mock.cancel("ghost", "voucher-ghost").await.result(), CancelResult::Tombstoned);
    let before = mock.ledger().await;
    let clock = Arc::clone(&mock.clock);
    mock.stop().await;

    let mut mock = Mock::start_with_clock(config(db_url), clock).await;
    assert_eq!(mock.ledger().await, before);
    assert_eq!(mock.create("kept", "ZJ").await.expect("repeat after restart"), kept);
    assert_eq!(mock.create("refused", "XX").await.expect("repeat").state(), ShipmentState::Rejected);
    assert_eq!(mock.query("undone").await.state(), ShipmentState::Cancelled);
    assert_eq!(mock.create("ghost", "ZJ").await.expect("late").state(), ShipmentState::Tombstoned);
    let fresh = mock.create("fresh", "ZJ").await.expect("new shipment");
    let next = before.len() as u64 + 1;
    assert_eq!(fresh.tracking_no, format!("TRK{next:012}"));
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
