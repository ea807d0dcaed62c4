//! `sagactl` as an operator runs it: the real binary against a real database file (SQLite) and
//! a MariaDB database, configured through `--set database.url=...`. Human output is checked for
//! what a person looks for; `--json` output is parsed back.

use std::time::Duration;

use midflight_model::{Address, Call, Change, Line, Observation, OrderEvent, Saga, Source, Status, Step, TicketDraft};
use midflight_stack::{MockDownstreams, MockOptions};
use midflight_store::testing::TestDb;
use midflight_store::{Store, TicketState, both_engines};
use serde_json::Value;

/// Exit code of a refused write.
const REFUSED: i32 = 3;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", self.stdout, self.stderr))
    }

    fn ok(self) -> Run {
        assert_eq!(self.code, 0, "sagactl failed:\n{}\n{}", self.stdout, self.stderr);
        self
    }
}

/// Runs the binary with the test database and nothing from this process's MIDFLIGHT_* environment.
async fn sagactl(db: &TestDb, args: &[&str]) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_sagactl"));
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("MIDFLIGHT_")) {
        command.env_remove(name);
    }
    command.arg("--set").arg(format!("database.url={}", db.url)).args(args);
    let output = command.output().await.expect("run sagactl");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn event(order_no: &str) -> OrderEvent {
    OrderEvent {
        order_no: order_no.into(),
        event_type: "PAID".into(),
        lines: vec![Line { sku: "SKU-0001".into(), quantity: 1 }],
        address: Address {
            region: "CN-SH".into(),
            city: String::new(),
            line: String::new(),
            postal_code: String::new(),
        },
        amount_cents: 100,
    }
}

async fn arrive(store: &Store, order_no: &str, offset: i64) -> Saga {
    let now = store.now_ms().await.expect("clock");
    let source = Source { topic: "orders".into(), partition: 0, offset };
    let saga = Saga::received(&event(order_no), source, now, now + 600_000);
    store
        .insert_arrivals(&[saga], "c1", 60_000, "consumer:c1")
        .await
        .expect("insert")
        .remove(0)
        .saga()
        .expect("readable")
        .clone()
}

/// A saga automation gave up on: MANUAL_REVIEW with an open WMS ticket.
async fn in_review(store: &Store, order_no: &str, offset: i64) -> Saga {
    let saga = arrive(store, order_no, offset).await;
    let ticket = TicketDraft {
        step: Step::Wms,
        reason: "wms can no longer reverse the lock".into(),
        evidence: "Irreversible".into(),
    };
    let change = Change {
        record_wms_intent: true,
        ticket: Some(ticket),
        ..Change::to(&[Status::DbWritten, Status::WmsRequested, Status::ManualReview], "test: gave up")
    };
    let now = store.now_ms().await.expect("clock");
    store.write(&saga, &change, now, 60_000, "consumer:c1").await.expect("write").applied().expect("applied")
}

async fn list_show_resolve_retry(db: &TestDb) {
    let store = &db.store;
    arrive(store, "O-1", 1).await;
    let review = in_review(store, "O-2", 2).await;
    let other = in_review(store, "O-3", 3).await;

    let list = sagactl(db, &["list"]).await.ok();
    let header = list.stdout.lines().next().unwrap_or_default();
    assert!(header.starts_with("BIZ_ID") && header.contains("STATUS") && header.contains("VERSION"), "{header}");
    assert!(list.stdout.contains("O-1:PAID") && list.stdout.contains("MANUAL_REVIEW"), "{}", list.stdout);
    let listed = sagactl(db, &["list", "--status", "manual_review", "--json"]).await.ok().json();
    let statuses: Vec<&str> = listed.as_array().expect("array").iter().filter_map(|s| s["status"].as_str()).collect();
    assert_eq!(statuses, vec!["MANUAL_REVIEW", "MANUAL_REVIEW"]);
    // A listing cut at its limit says so (on stderr; stdout keeps its shape).
    let cut = sagactl(db, &["list", "--status", "manual_review", "--limit", "1", "--json"]).await.ok();
    assert_eq!(cut.json().as_array().map(Vec::len), Some(1));
    assert!(cut.stderr.contains("more exist"), "{}", cut.stderr);
    let whole = sagactl(db, &["list", "--status", "manual_review", "--limit", "2"]).await.ok();
    assert!(!whole.stderr.contains("more exist"), "{}", whole.stderr);
    // A saga waiting for its retry: its lease runs to the retry, and the listing says so.
    let waiting = arrive(store, "O-4", 4).await;
    let now = store.now_ms().await.expect("clock");
    let failure = midflight_model::Failure { error: "wms unreachable".into(), retry_at_ms: now + 600_000 };
    let backoff = Change { failure: Some(failure), release_lease: true, ..Change::default() };
    store.write(&waiting, &backoff, now, 60_000, "consumer:c1").await.expect("write").applied().expect("applied");
    let shown = sagactl(db, &["list", "--status", "received"]).await.ok();
    let row = shown.stdout.lines().find(|line| line.contains("O-4:PAID")).unwrap_or_default();
    assert!(row.contains("released, retry in 9m") || row.contains("released, retry in 10m"), "{}", shown.stdout);

    let show = sagactl(db, &["show", &review.biz_id]).await.ok();
    for needle in
        ["timeline", "WMS_REQUESTED", "MANUAL_REVIEW", "wms can no longer reverse", "--to DONE --tracking-no T|"]
    {
        assert!(show.stdout.contains(needle), "show lacks {needle:?}:\n{}", show.stdout);
    }
    let shown = sagactl(db, &["show", &review.biz_id, "--json"]).await.ok().json();
    assert_eq!(shown["saga"]["version"], review.version);
    assert_eq!(shown["transitions"].as_array().map(Vec::len), Some(4), "{shown}");
    assert_eq!(shown["tickets"][0]["state"], "OPEN");

    // Someone looked at an older version: refused, nothing written.
    let stale = (review.version - 1).to_string();
    let resolve = ["resolve", &review.biz_id, "--to", "DONE", "--operator", "alice", "--note", "locked by hand"];
    let refused = sagactl(db, &[&resolve[..], &["--version", &stale]].concat()).await;
    assert_eq!(refused.code, REFUSED, "{}{}", refused.stdout, refused.stderr);
    assert!(refused.stderr.contains("changed underneath"), "{}", refused.stderr);
    assert_eq!(store.get(&review.biz_id).await.expect("get").expect("row").version, review.version);

    let version = review.version.to_string();
    // DONE needs the shipment's tracking number: the order and the notification carry it.
    let untracked = sagactl(db, &[&resolve[..], &["--version", &version]].concat()).await;
    assert_eq!(untracked.code, REFUSED, "{}{}", untracked.stdout, untracked.stderr);
    assert!(untracked.stderr.contains("needs the shipment's"), "{}", untracked.stderr);
    assert!(untracked.stderr.contains("nothing was written"), "{}", untracked.stderr);
    let spaced = sagactl(db, &[&resolve[..], &["--version", &version, "--tracking-no", "TRK 9"]].concat()).await;
    assert_eq!(spaced.code, 2, "a tracking number has no spaces: {}", spaced.stderr);
    let tracked = [&resolve[..], &["--version", &version, "--tracking-no", "TRK-9", "--json"]].concat();
    let applied = sagactl(db, &tracked).await.ok().json();
    assert_eq!((applied["result"].as_str(), applied["saga"]["status"].as_str()), (Some("applied"), Some("DONE")));
    assert_eq!(applied["saga"]["tracking_no"].as_str(), Some("TRK-9"), "{applied}");
    let order = store.order_row(&review.biz_id).await.expect("read").expect("order row");
    assert_eq!((order.status.as_str(), order.tracking_no.as_deref()), ("SHIPPED", Some("TRK-9")));
    assert_eq!(store.outbox_rows().await.expect("outbox"), vec![(review.biz_id.clone(), false)]);
    let log = store.transitions(&review.biz_id).await.expect("log");
    let last = log.last().expect("log row");
    assert_eq!((last.to, last.actor.as_str()), (Status::Done, "operator:alice"));
    assert_eq!(store.tickets_of(&review.biz_id).await.expect("tickets")[0].state, TicketState::Resolved);

    // Retry sends the other saga back to its intent, for automation to settle by query.
    let retry = |version: String| {
        let id = other.biz_id.clone();
        async move {
            let args = ["retry", &id, "--from", "WMS_REQUESTED", "--version", &version, "--operator", "bob"];
            sagactl(db, &[&args[..], &["--note", "wms console is back"]].concat()).await
        }
    };
    let retried = retry(other.version.to_string()).await.ok();
    assert!(retried.stdout.contains("-> WMS_REQUESTED"), "{}", retried.stdout);
    let row = store.get(&other.biz_id).await.expect("get").expect("row");
    assert_eq!(row.status, Status::WmsRequested);
    let twice = retry(row.version.to_string()).await;
    assert_eq!(twice.code, REFUSED, "only a MANUAL_REVIEW saga can be retried: {}", twice.stderr);
    assert!(twice.stderr.contains("only a MANUAL_REVIEW saga"), "{}", twice.stderr);

    let missing = ["resolve", "NOPE:PAID", "--to", "ROLLED_BACK", "--version", "1", "--operator", "bob", "--note", "x"];
    let missing = sagactl(db, &missing).await;
    assert_eq!(missing.code, 1, "a saga that does not exist is an error, not a refusal: {}", missing.stderr);
    assert!(missing.stderr.contains("no saga NOPE:PAID"), "{}", missing.stderr);

    let no_operator = sagactl(db, &["resolve", &other.biz_id, "--to", "DONE", "--version", "1", "--note", "x"]).await;
    assert_eq!(no_operator.code, 2, "the operator's name is required for writes");
    let to_intent = ["resolve", &other.biz_id, "--to", "WMS_REQUESTED", "--version", "1", "--operator", "alice"];
    let wrong_target = sagactl(db, &[&to_intent[..], &["--note", "x"]].concat()).await;
    assert_eq!(wrong_target.code, 2, "resolve only closes as DONE or ROLLED_BACK: {}", wrong_target.stderr);
}
both_engines!(list_show_resolve_and_retry, list_show_resolve_retry);

async fn retry_behind_a_later_saga(db: &TestDb) {
    let store = &db.store;
    let review = in_review(store, "O-4", 4).await;
    let now = store.now_ms().await.expect("clock");
    let source = Source { topic: "orders".into(), partition: 0, offset: 5 };
    let later =
        Saga::received(&OrderEvent { event_type: "AMENDED".into(), ..event("O-4") }, source, now, now + 600_000);
    store.insert_arrivals(&[later], "c1", 60_000, "consumer:c1").await.expect("insert");

    let show = sagactl(db, &["show", &review.biz_id]).await.ok();
    assert!(
        show.stdout.contains("retry:   not possible: a later saga of its order, O-4:AMENDED (RECEIVED)"),
        "{}",
        show.stdout
    );
    assert!(show.stdout.contains("sagactl resolve"), "{}", show.stdout);
    let version = review.version.to_string();
    let retry = ["retry", &review.biz_id, "--from", "WMS_REQUESTED", "--version", &version, "--operator", "bob"];
    let refused = sagactl(db, &[&retry[..], &["--note", "ask again"]].concat()).await;
    assert_eq!(refused.code, REFUSED, "{}{}", refused.stdout, refused.stderr);
    for needle in
        ["a later saga of its order, O-4:AMENDED (RECEIVED)", "nothing was written", "sagactl resolve O-4:PAID"]
    {
        assert!(refused.stderr.contains(needle), "lacks {needle:?}: {}", refused.stderr);
    }
    let json = sagactl(db, &[&retry[..], &["--note", "ask again", "--json"]].concat()).await;
    assert_eq!(json.code, REFUSED);
    assert_eq!(
        (json.json()["result"].as_str(), json.json()["current_status"].as_str()),
        (Some("refused"), Some("MANUAL_REVIEW"))
    );
    let row = store.get(&review.biz_id).await.expect("get").expect("row");
    assert_eq!((row.status, row.version), (Status::ManualReview, review.version), "nothing written");

    let resolve = ["resolve", &review.biz_id, "--to", "ROLLED_BACK", "--version", &version, "--operator", "bob"];
    sagactl(db, &[&resolve[..], &["--note", "undone by hand"]].concat()).await.ok();
    assert_eq!(store.get(&review.biz_id).await.expect("get").expect("row").status, Status::RolledBack);
}
both_engines!(retry_keeps_the_orders_order, retry_behind_a_later_saga);

async fn tickets_stuck_and_reconcile(db: &TestDb) {
    let store = &db.store;
    in_review(store, "O-2", 2).await;
    let tickets = sagactl(db, &["tickets", "--state", "open", "--json"]).await.ok().json();
    assert_eq!(tickets.as_array().map(Vec::len), Some(1), "{tickets}");
    let one = sagactl(db, &["ticket", "O-2:PAID"]).await.ok();
    assert!(one.stdout.contains("evidence") && one.stdout.contains("Irreversible"), "{}", one.stdout);
    let missing = sagactl(db, &["ticket", "NOPE:PAID"]).await;
    assert_eq!(missing.code, 1, "{}", missing.stderr);

    arrive(store, "O-1", 1).await;
    // A later event of the same order, held up by the first until it finishes.
    let now = store.now_ms().await.expect("clock");
    let refund = OrderEvent { event_type: "REFUNDED".into(), ..event("O-1") };
    let later = Saga::received(&refund, Source { topic: "orders".into(), partition: 0, offset: 3 }, now, now + 600_000);
    store.insert_arrivals(&[later], "c1", 60_000, "consumer:c1").await.expect("insert");
    let stuck = sagactl(db, &["stuck", "--older-than-ms", "0", "--json"]).await.ok().json();
    let mut waits: Vec<(&str, Option<&str>)> = stuck
        .as_array()
        .expect("array")
        .iter()
        .map(|s| (s["biz_id"].as_str().expect("biz_id"), s["waits_for"].as_str()))
        .collect();
    waits.sort_unstable();
    assert_eq!(
        waits,
        vec![("O-1:PAID", None), ("O-1:REFUNDED", Some("O-1:PAID"))],
        "terminal sagas are not stuck; the later saga names the one it waits for"
    );
    let table = sagactl(db, &["stuck", "--older-than-ms", "0"]).await.ok();
    let refunded = table.stdout.lines().find(|line| line.starts_with("O-1:REFUNDED")).expect("row");
    assert!(table.stdout.contains("WAITS_FOR") && refunded.contains("O-1:PAID"), "{}", table.stdout);

    // Reconcile once against mocks holding an orphan lock.
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let ghost = Saga::received(&event("GHOST"), Source { topic: "orders".into(), partition: 0, offset: 9 }, 0, 0);
    let locked = mocks.client().call(Call::LockStock, &ghost, Duration::from_secs(5)).await;
    assert_eq!(locked, Observation::Wms(midflight_model::WmsAnswer::Locked));
    let endpoints = [
        "--set".to_owned(),
        format!("wms.endpoint={}", mocks.wms_endpoint),
        "--set".to_owned(),
        format!("logistics.endpoint={}", mocks.logistics_endpoint),
    ];
    let args: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    let report = sagactl(db, &[&args[..], &["reconcile", "--json"]].concat()).await.ok().json();
    assert_eq!((report["orphans"].as_u64(), report["tickets_opened"].as_u64()), (Some(1), Some(1)), "{report}");
    let human = sagactl(db, &[&args[..], &["reconcile"]].concat()).await.ok();
    assert!(human.stdout.contains("orphan") && human.stdout.contains("already_open"), "{}", human.stdout);
    let key = report["findings"][0]["request_id"].as_str().map(|id| format!("orphan:{id}")).expect("request id");
    let shown = sagactl(db, &["ticket", &key, "--json"]).await.ok().json();
    let finding = shown[0]["evidence"]["fingerprint"].as_str().expect("the finding's fingerprint").to_owned();
    let close_as = |finding: &str| {
        [
            "close-ticket",
            &key,
            "--step",
            "WMS_LEDGER",
            "--finding",
            finding,
            "--operator",
            "carol",
            "--note",
            "reversed in wms",
        ]
        .map(str::to_owned)
    };
    let other = sagactl(db, &close_as("orphan:L-elsewhere").each_ref().map(String::as_str)).await;
    assert_eq!(other.code, REFUSED, "{}", other.stderr);
    assert!(other.stderr.contains(&finding), "names the finding the ticket holds: {}", other.stderr);
    sagactl(db, &close_as(&finding).each_ref().map(String::as_str)).await.ok();
    let again = sagactl(db, &close_as(&finding).each_ref().map(String::as_str)).await;
    assert_eq!(again.code, REFUSED, "{}", again.stderr);
}
both_engines!(tickets_stuck_and_reconcile_once, tickets_stuck_and_reconcile);

/// Bad usage exits 2 before touching the database, whether clap or the configuration refuses it.
async fn bad_usage(db: &TestDb) {
    let config = sagactl(db, &["--set", "database.max_connections=many", "list"]).await;
    assert_eq!(config.code, 2, "{}", config.stderr);
    assert!(config.stderr.contains("override database.max_connections"), "{}", config.stderr);
    let step = ["close-ticket", "k", "--step", "WMS", "--finding", "f", "--operator", "carol", "--note", "n"];
    let step = sagactl(db, &step).await;
    assert_eq!(step.code, 2, "{}", step.stderr);
    assert!(step.stderr.contains("WMS_LEDGER"), "{}", step.stderr);
    let negative = sagactl(db, &["stuck", "--older-than-ms", "-5"]).await;
    assert_eq!(negative.code, 2, "{}", negative.stderr);
}
both_engines!(bad_usage_exits_2, bad_usage);
