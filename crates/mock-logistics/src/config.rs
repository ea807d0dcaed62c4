//! The mock logistics provider's configuration: the shared server, database and telemetry
//! sections, its fault plan, and which regions it cannot serve.

use midflight_config::{Config, DatabaseSection, RuntimeSection, ServerSection, TelemetrySection};
use midflight_mock::{FaultPlan, MethodFaults};
use serde::{Deserialize, Serialize};

use crate::METHODS;

/// Most unserviceable regions; a list, not a gazetteer.
pub const REGIONS_MAX: usize = 1_000;

/// Everything `mock-logistics` reads at start-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogisticsConfig {
    pub server: ServerSection,
    pub database: DatabaseSection,
    pub telemetry: TelemetrySection,
    pub runtime: RuntimeSection,
    /// The fault plan in force at start-up; FaultAdmin replaces it at run time. `legacy_mode`
    /// is a WMS fault and is ignored here; `irreversible_after_ms` is the time to pickup.
    pub faults: FaultPlan,
    pub shipping: ShippingSection,
}

/// What the provider can deliver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShippingSection {
    /// Address regions that get a definitive REJECTED. `XX` by default, so a scenario can force
    /// a business rejection without configuring anything.
    pub unserviceable_regions: Vec<String>,
}

impl Default for ShippingSection {
    fn default() -> Self {
        ShippingSection { unserviceable_regions: vec!["XX".to_owned()] }
    }
}

impl Default for LogisticsConfig {
    fn default() -> Self {
        let mut faults = FaultPlan::default();
        // The user's logistics provider: P99 about 320 ms, with a median about a third of it.
        for method in ["CreateShipment", "QueryShipment", "CancelShipment"] {
            faults.methods.insert(method.to_owned(), MethodFaults::with_latency(110, 320));
        }
        LogisticsConfig {
            server: ServerSection { listen: "127.0.0.1:50062".to_owned(), ..ServerSection::default() },
            database: DatabaseSection {
                url: "sqlite://mock-logistics.db?mode=rwc".to_owned(),
                ..DatabaseSection::default()
            },
            telemetry: TelemetrySection::default(),
            runtime: RuntimeSection::default(),
            faults,
            shipping: ShippingSection::default(),
        }
    }
}

impl Config for LogisticsConfig {
    fn problems(&self) -> Vec<String> {
        let mut problems = self.server.problems("server");
        problems.extend(self.database.problems("database"));
        problems.extend(self.telemetry.problems("telemetry"));
        problems.extend(self.runtime.problems("runtime"));
        problems.extend(self.faults.problems("faults", METHODS));
        let regions = &self.shipping.unserviceable_regions;
        if regions.len() > REGIONS_MAX {
            problems.push(format!("shipping.unserviceable_regions: at most {REGIONS_MAX} regions"));
        }
        for region in regions {
            if let Err(status) = midflight_mock::input::required("region", region) {
                problems.push(format!("shipping.unserviceable_regions: {}", status.message()));
            }
        }
        problems
    }
}

impl midflight_service::ServiceConfig for LogisticsConfig {
    fn telemetry(&self) -> &TelemetrySection {
        &self.telemetry
    }

    fn runtime(&self) -> &RuntimeSection {
        &self.runtime
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_shaped_like_the_users_provider() {
        let config = LogisticsConfig::default();
        assert_eq!(config.problems(), Vec::<String>::new());
        assert_eq!(config.faults.method("CreateShipment").latency.p99_ms, 320);
        assert_eq!(config.shipping.unserviceable_regions, vec!["XX".to_owned()]);
    }

    #[test]
    fn bad_values_are_reported() {
        let mut config = LogisticsConfig::default();
        config.shipping.unserviceable_regions.push(String::new());
        config.faults.methods.insert("LockStock".to_owned(), MethodFaults::default());
        assert_eq!(config.problems().len(), 2, "{:#?}", config.problems());
    }
}
