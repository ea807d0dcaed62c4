//! The downstream client's own bound: a call that waits for one of the client's permits
//! (`concurrency_limit`) still ends by its deadline, because the driver renews a lease for
//! the call's timeout and no more.

use std::time::Duration;

use midflight_api::client::Downstreams;
use midflight_model::{Call, Observation, Saga, Source, Step};
use midflight_stack::{MethodFaults, MockDownstreams, MockOptions, fault};
use midflight_store::testing::order_event;

fn saga(order_no: &str) -> Saga {
    let source = Source { topic: "orders".into(), partition: 0, offset: 1 };
    Saga::received(&order_event(order_no), source, 0, i64::MAX)
}

#[tokio::test]
async fn a_call_waiting_for_a_permit_ends_by_its_deadline() {
    // Every lock takes 1 s; the client sends one call at a time.
    let slow = MethodFaults::with_latency(1_000, 1_000);
    let mocks =
        MockDownstreams::start(MockOptions { wms_faults: fault("LockStock", slow), ..MockOptions::default() }).await;
    let (mut wms, logistics) = mocks.sections();
    wms.concurrency_limit = 1;
    let client = Downstreams::connect_lazy(&wms, &logistics).expect("client");

    let (first, second) = (saga("O-1"), saga("O-2"));
    let holding = client.call(Call::LockStock, &first, Duration::from_secs(10));
    tokio::pin!(holding);
    // The first call takes the only permit before the second asks for it.
    let queued = async {
        tokio::task::yield_now().await;
        client.call(Call::QueryLock, &second, Duration::from_millis(300)).await
    };
    let (queued, first_answer) = tokio::select! {
        biased;
        answer = &mut holding => panic!("the 1 s lock answered before the queued call ended: {answer:?}"),
        queued = queued => (queued, holding.await),
    };
    match queued {
        Observation::Unreachable { step: Step::Wms, error } => {
            assert!(error.contains("within 300 ms"), "{error}");
        }
        other => panic!("the queued call was sent after its deadline: {other:?}"),
    }
    assert_eq!(first_answer.label(), "wms locked");
}
