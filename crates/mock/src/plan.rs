//! The fault plan: what each method of a mock does wrong.
//!
//! It is one serde type, read from the service's configuration at start-up, and converted to and
//! from the `faults.v1.FaultPlan` message that scenarios send at run time, so the file format and
//! the admin RPC cannot drift apart. Validation lives here too, for the same reason.

use std::collections::BTreeMap;

use midflight_api::faults::v1 as pb;
use serde::{Deserialize, Serialize};

/// Highest p99 latency a plan may ask for. Above a minute a mock stops being a slow downstream
/// and becomes a hung one, which `unavailable` models more cheaply.
pub const LATENCY_MS_MAX: u32 = 60_000;
/// Highest irreversibility window: one week, so arithmetic on it can never overflow.
pub const IRREVERSIBLE_AFTER_MS_MAX: u64 = 7 * 24 * 3_600_000;

/// Latency drawn from a log-normal distribution fitted to a median and a 99th percentile.
/// A zero median means no injected latency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Latency {
    pub p50_ms: u32,
    pub p99_ms: u32,
}

/// The faults of one method.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MethodFaults {
    pub latency: Latency,
    /// Probability (0..=1) that the effect commits but the caller gets UNAVAILABLE instead.
    pub drop_response: f64,
    /// Probability (0..=1) that the call fails with UNAVAILABLE before anything is applied.
    pub fail_before_apply: f64,
    /// When true every call fails with UNAVAILABLE before anything is applied.
    pub unavailable: bool,
}

/// The whole plan of one mock process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultPlan {
    /// Faults per method, keyed by the method's name in the service (e.g. `LockStock`);
    /// a method not listed has none.
    pub methods: BTreeMap<String, MethodFaults>,
    /// WMS only: LockStock deduplicates on a key it makes up, and QueryLock is unimplemented.
    pub legacy_mode: bool,
    /// After this many milliseconds a lock (or a shipment: time to pickup) can no longer be
    /// reversed; 0 means never.
    pub irreversible_after_ms: u64,
    /// Seed of the random draws; 0 picks one from the clock.
    pub seed: u64,
}

impl MethodFaults {
    /// Latency only, shaped like the user's downstream.
    pub fn with_latency(p50_ms: u32, p99_ms: u32) -> MethodFaults {
        MethodFaults { latency: Latency { p50_ms, p99_ms }, ..MethodFaults::default() }
    }
}

impl FaultPlan {
    /// Every problem of the plan, for a service whose methods are `methods`.
    pub fn problems(&self, at: &str, methods: &[&str]) -> Vec<String> {
        let mut problems = Vec::new();
        for (name, faults) in &self.methods {
            if !methods.contains(&name.as_str()) {
                // An environment variable's path is read in lower case: `lockstock` is LockStock
                // set through one, which only a whole table in JSON can name.
                let hint = match methods.iter().find(|method| method.eq_ignore_ascii_case(name)) {
                    Some(method) => format!(
                        " (method names keep their case; from the environment, give the whole table: \
                         MIDFLIGHT_FAULTS__METHODS='{{\"{method}\": {{...}}}}')"
                    ),
                    None => String::new(),
                };
                problems.push(format!("{at}.methods: unknown method {name:?}; expected one of {methods:?}{hint}"));
            }
            problems.extend(faults.problems(&format!("{at}.methods.{name}")));
        }
        if self.irreversible_after_ms > IRREVERSIBLE_AFTER_MS_MAX {
            problems.push(format!("{at}.irreversible_after_ms must be at most {IRREVERSIBLE_AFTER_MS_MAX}"));
        }
        problems
    }

    /// The faults of `method` (none when it is not listed).
    pub fn method(&self, method: &str) -> MethodFaults {
        self.methods.get(method).copied().unwrap_or_default()
    }

    /// Reads a plan sent over gRPC; a method named twice is refused rather than silently merged.
    pub fn from_proto(plan: pb::FaultPlan) -> Result<FaultPlan, Vec<String>> {
        let mut methods = BTreeMap::new();
        let mut problems = Vec::new();
        for entry in plan.methods {
            let latency = entry.latency.unwrap_or_default();
            let faults = MethodFaults {
                latency: Latency { p50_ms: latency.p50_ms, p99_ms: latency.p99_ms },
                drop_response: entry.drop_response,
                fail_before_apply: entry.fail_before_apply,
                unavailable: entry.unavailable,
            };
            if methods.insert(entry.method.clone(), faults).is_some() {
                problems.push(format!("methods: {:?} is listed more than once", entry.method));
            }
        }
        let plan = FaultPlan {
            methods,
            legacy_mode: plan.legacy_mode,
            irreversible_after_ms: plan.irreversible_after_ms,
            seed: plan.seed,
        };
        if problems.is_empty() { Ok(plan) } else { Err(problems) }
    }

    /// The plan as the admin RPC reports it, methods in name order.
    pub fn to_proto(&self) -> pb::FaultPlan {
        let methods = self
            .methods
            .iter()
            .map(|(name, faults)| pb::MethodFaults {
                method: name.clone(),
                latency: Some(pb::Latency { p50_ms: faults.latency.p50_ms, p99_ms: faults.latency.p99_ms }),
                drop_response: faults.drop_response,
                fail_before_apply: faults.fail_before_apply,
                unavailable: faults.unavailable,
            })
            .collect();
        pb::FaultPlan {
            methods,
            legacy_mode: self.legacy_mode,
            irreversible_after_ms: self.irreversible_after_ms,
            seed: self.seed,
        }
    }
}

impl MethodFaults {
    fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        for (name, p) in [("drop_response", self.drop_response), ("fail_before_apply", self.fail_before_apply)] {
            if !(0.0..=1.0).contains(&p) {
                problems.push(format!("{at}.{name} must be a probability in 0..=1, got {p}"));
            }
        }
        let Latency { p50_ms, p99_ms } = self.latency;
        if p99_ms < p50_ms {
            problems.push(format!("{at}.latency.p99_ms ({p99_ms}) must not be below p50_ms ({p50_ms})"));
        }
        if p99_ms > LATENCY_MS_MAX {
            problems.push(format!("{at}.latency.p99_ms must be at most {LATENCY_MS_MAX}"));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METHODS: &[&str] = &["LockStock", "QueryLock"];

    fn plan() -> FaultPlan {
        let mut plan = FaultPlan { legacy_mode: true, irreversible_after_ms: 5_000, seed: 7, ..FaultPlan::default() };
        plan.methods
            .insert("LockStock".to_owned(), MethodFaults { drop_response: 0.5, ..MethodFaults::with_latency(60, 180) });
        plan
    }

    #[test]
    fn proto_round_trip_keeps_everything() {
        let plan = plan();
        assert_eq!(FaultPlan::from_proto(plan.to_proto()).expect("valid plan"), plan);
    }

    #[test]
    fn a_method_named_in_lower_case_says_how_to_name_it() {
        let mut plan = FaultPlan::default();
        plan.methods.insert("lockstock".to_owned(), MethodFaults::default());
        let problems = plan.problems("faults", METHODS);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains(r#"MIDFLIGHT_FAULTS__METHODS='{"LockStock": {...}}'"#), "{problems:?}");
    }

    #[test]
    fn a_method_named_twice_is_refused() {
        let mut proto = plan().to_proto();
        proto.methods.push(proto.methods[0].clone());
        let problems = FaultPlan::from_proto(proto).expect_err("duplicate must be refused");
        assert!(problems[0].contains("more than once"), "{problems:?}");
    }

    #[test]
    fn problems_name_every_bad_field() {
        let mut plan = plan();
        plan.methods.insert(
            "Nope".to_owned(),
            MethodFaults { drop_response: 1.5, latency: Latency { p50_ms: 10, p99_ms: 5 }, ..MethodFaults::default() },
        );
        plan.irreversible_after_ms = u64::MAX;
        let problems = plan.problems("faults", METHODS);
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(plan.problems("faults", &["LockStock", "Nope"]).len() == 3);
    }

    #[test]
    fn default_plan_is_valid_and_faultless() {
        let plan = FaultPlan::default();
        assert!(plan.problems("faults", METHODS).is_empty());
        assert_eq!(plan.method("LockStock"), MethodFaults::default());
    }
}
