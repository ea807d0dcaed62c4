//! The `faults.v1.FaultAdmin` service: scenarios read and replace a mock's fault plan at run time.
//!
//! Both mocks serve it on their own port beside their business service, so one endpoint is all
//! a scenario needs to know about each downstream.

use std::sync::Arc;

use midflight_api::faults::v1 as pb;
use midflight_api::faults::v1::fault_admin_server::{FaultAdmin, FaultAdminServer};
use tonic::{Request, Response, Status};

use crate::injector::FaultInjector;
use crate::plan::FaultPlan;

/// FaultAdmin over one mock's injector.
#[derive(Debug, Clone)]
pub struct FaultAdminService {
    injector: Arc<FaultInjector>,
    /// The methods of the mock's business service; a plan naming another one is refused.
    methods: &'static [&'static str],
}

impl FaultAdminService {
    pub fn new(injector: Arc<FaultInjector>, methods: &'static [&'static str]) -> FaultAdminService {
        FaultAdminService { injector, methods }
    }

    /// The generated server, ready to add to the mock's routes.
    pub fn into_server(self) -> FaultAdminServer<FaultAdminService> {
        FaultAdminServer::new(self)
    }
}

#[tonic::async_trait]
impl FaultAdmin for FaultAdminService {
    async fn set_faults(&self, request: Request<pb::FaultPlan>) -> Result<Response<pb::FaultPlan>, Status> {
        let plan = FaultPlan::from_proto(request.into_inner()).map_err(invalid)?;
        let problems = plan.problems("plan", self.methods);
        if !problems.is_empty() {
            return Err(invalid(problems));
        }
        let in_force = self.injector.set_plan(plan);
        tracing::info!(
            legacy_mode = in_force.legacy_mode,
            irreversible_after_ms = in_force.irreversible_after_ms,
            seed = in_force.seed,
            methods = in_force.methods.len(),
            "fault plan replaced"
        );
        Ok(Response::new(in_force.to_proto()))
    }

    async fn get_faults(&self, _: Request<pb::GetFaultsRequest>) -> Result<Response<pb::FaultPlan>, Status> {
        Ok(Response::new(self.injector.plan().to_proto()))
    }
}

fn invalid(problems: Vec<String>) -> Status {
    Status::invalid_argument(format!("fault plan rejected: {}", problems.join("; ")))
}
