//! The driver's one dependency on the outside world besides the store: something that makes
//! a [`Call`] for a saga and reports what it learned. Production uses the gRPC clients of
//! `midflight-api`; tests may script answers.

use std::future::Future;
use std::time::Duration;

use midflight_model::{Call, Observation, Saga};

pub trait Downstream: Clone + Send + Sync + 'static {
    /// Makes `call` with the saga's stored request id and voucher, within `timeout`.
    /// Never fails: no answer is [`Observation::Unreachable`].
    fn call(&self, call: Call, saga: &Saga, timeout: Duration) -> impl Future<Output = Observation> + Send;
}

impl Downstream for midflight_api::client::Downstreams {
    fn call(&self, call: Call, saga: &Saga, timeout: Duration) -> impl Future<Output = Observation> + Send {
        midflight_api::client::Downstreams::call(self, call, saga, timeout)
    }
}
