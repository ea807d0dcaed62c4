//! The orders a run produces: deterministic from a seed, keyed by order number (so one order's
//! events share a partition), with optional shares of unserviceable addresses (definitive
//! logistics rejections), second events of the same order (per-order ordering) and poison.

use midflight_checker::Expected;
use midflight_model::{Address, Line, OrderEvent};
use midflight_stack::kafka::{EmbeddedKafka, Record};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Mixed into the seed for the trace ids, so adding them left every other draw as it was.
const TRACE_SEED: u64 = 0x7472_6163_6570_6172;

/// What to produce.
#[derive(Debug, Clone)]
pub struct Workload {
    pub seed: u64,
    pub orders: usize,
    /// Share (0..1) of orders with an unserviceable address.
    pub unserviceable: f64,
    /// Share (0..1) of orders that get a second event.
    pub second_events: f64,
    /// Poison messages mixed in.
    pub poison: usize,
    /// Prefix of order numbers, so two runs never share one.
    pub prefix: String,
}

impl Workload {
    pub fn orders(seed: u64, orders: usize, prefix: &str) -> Workload {
        Workload { seed, orders, unserviceable: 0.0, second_events: 0.0, poison: 0, prefix: prefix.to_owned() }
    }

    /// The messages, in production order (a second event right after its first).
    pub fn records(&self) -> Vec<Record> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut records = Vec::with_capacity(self.orders * 2 + self.poison);
        let poison_every = self.orders.checked_div(self.poison).map_or(usize::MAX, |every| every.max(1));
        let mut poison_left = self.poison;
        for index in 0..self.orders {
            let order_no = format!("{}-{index:06}", self.prefix);
            let region = if rng.random_bool(self.unserviceable.clamp(0.0, 1.0)) { "XX" } else { "CN-ZJ" };
            let event = order(&mut rng, &order_no, "PAID", region);
            records.push(Record::keyed(&order_no, event.to_json()));
            if rng.random_bool(self.second_events.clamp(0.0, 1.0)) {
                let again = order(&mut rng, &order_no, "REPAID", region);
                records.push(Record::keyed(&order_no, again.to_json()));
            }
            if poison_left > 0 && index % poison_every == poison_every / 2 {
                poison_left -= 1;
                let garbage = format!("{{\"order_no\": \"{order_no}-poison\", \"lines\": \"not a list\"}}");
                records.push(Record::keyed(&format!("{order_no}-poison"), garbage));
            }
        }
        // Each message starts a trace, as a traced order service's would: the consumers, the
        // recovery workers and the mocks add their spans to it.
        let mut ids = StdRng::seed_from_u64(self.seed ^ TRACE_SEED);
        for record in &mut records {
            let traceparent = midflight_service::trace::root_traceparent(ids.random(), ids.random());
            record.headers.push((midflight_service::trace::TRACEPARENT.to_owned(), traceparent));
        }
        records
    }

    /// Produces the workload to `topic`; returns what the checker must find.
    pub async fn produce(&self, kafka: &EmbeddedKafka, topic: &str) -> anyhow::Result<Expected> {
        let records = self.records();
        let positions = kafka.produce(topic, &records).await?;
        let mut expected = Expected::default();
        for (record, (partition, offset)) in records.iter().zip(positions) {
            match OrderEvent::parse(&record.payload) {
                Ok(event) => expected.orders.push(event.biz_id()),
                Err(_) => expected.poison.push(format!("parked:{topic}:{partition}:{offset}")),
            }
        }
        Ok(expected)
    }
}

fn order(rng: &mut StdRng, order_no: &str, event_type: &str, region: &str) -> OrderEvent {
    // Distinct SKUs: the WMS refuses an order that names one SKU on two lines.
    let first = rng.random_range(1..=98);
    let lines = (0..rng.random_range(1..=3))
        .map(|n| Line { sku: format!("SKU-{:04}", first + n), quantity: rng.random_range(1..=3) })
        .collect();
    OrderEvent {
        order_no: order_no.to_owned(),
        event_type: event_type.to_owned(),
        lines,
        address: Address {
            region: region.to_owned(),
            city: "Hangzhou".to_owned(),
            line: format!("{} Wensan Rd", rng.random_range(1..=999)),
            postal_code: "310000".to_owned(),
        },
        amount_cents: rng.random_range(100..=100_000),
    }
}
