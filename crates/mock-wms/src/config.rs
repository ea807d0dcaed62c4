//! The mock WMS's configuration: the shared server, database and telemetry sections, its fault
//! plan, and the stock it starts with.

use std::collections::BTreeMap;

use midflight_config::{Config, DatabaseSection, RuntimeSection, ServerSection, TelemetrySection};
use midflight_mock::{FaultPlan, MethodFaults};
use serde::{Deserialize, Serialize};

use crate::METHODS;

/// Most SKUs a WMS may be seeded with: enough for any scenario, small enough to seed in a blink.
pub const SKUS_MAX: usize = 100_000;

/// Everything `mock-wms` reads at start-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WmsConfig {
    pub server: ServerSection,
    pub database: DatabaseSection,
    pub telemetry: TelemetrySection,
    pub runtime: RuntimeSection,
    /// The fault plan in force at start-up; FaultAdmin replaces it at run time.
    pub faults: FaultPlan,
    pub stock: StockSection,
}

/// Stock seeded into a database that does not have it yet. Existing rows are never overwritten,
/// so a restarted mock keeps the levels its locks left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StockSection {
    /// SKUs `SKU-0001` .. `SKU-{generated_skus}` (four digits at least) get `generated_quantity` each.
    pub generated_skus: usize,
    /// A million per SKU: a long scenario never runs out by accident.
    pub generated_quantity: i64,
    /// Further SKUs, or generated ones with another level (e.g. 0, to force a rejection).
    pub skus: BTreeMap<String, i64>,
}

impl Default for WmsConfig {
    fn default() -> Self {
        let mut faults = FaultPlan::default();
        // The user's WMS: P99 about 180 ms; a median of a third of that is typical of such a tail.
        for method in ["LockStock", "QueryLock", "ReverseLock"] {
            faults.methods.insert(method.to_owned(), MethodFaults::with_latency(60, 180));
        }
        WmsConfig {
            server: ServerSection { listen: "127.0.0.1:50061".to_owned(), ..ServerSection::default() },
            database: DatabaseSection { url: "sqlite://mock-wms.db?mode=rwc".to_owned(), ..DatabaseSection::default() },
            telemetry: TelemetrySection::default(),
            runtime: RuntimeSection::default(),
            faults,
            stock: StockSection::default(),
        }
    }
}

impl Default for StockSection {
    fn default() -> Self {
        StockSection { generated_skus: 100, generated_quantity: 1_000_000, skus: BTreeMap::new() }
    }
}

impl StockSection {
    /// The level of every SKU to seed.
    pub fn levels(&self) -> BTreeMap<String, i64> {
        let mut levels: BTreeMap<String, i64> =
            (1..=self.generated_skus).map(|n| (format!("SKU-{n:04}"), self.generated_quantity)).collect();
        levels.extend(self.skus.iter().map(|(sku, level)| (sku.clone(), *level)));
        levels
    }

    fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if self.generated_skus + self.skus.len() > SKUS_MAX {
            problems.push(format!("{at}: at most {SKUS_MAX} skus may be seeded"));
        }
        if self.generated_quantity < 0 {
            problems.push(format!("{at}.generated_quantity must not be negative"));
        }
        for (sku, level) in &self.skus {
            if let Err(status) = midflight_mock::input::required("sku", sku) {
                problems.push(format!("{at}.skus: {}", status.message()));
            }
            if *level < 0 {
                problems.push(format!("{at}.skus.{sku} must not be negative"));
            }
        }
        problems
    }
}

impl Config for WmsConfig {
    fn problems(&self) -> Vec<String> {
        let mut problems = self.server.problems("server");
        problems.extend(self.database.problems("database"));
        problems.extend(self.telemetry.problems("telemetry"));
        problems.extend(self.runtime.problems("runtime"));
        problems.extend(self.faults.problems("faults", METHODS));
        problems.extend(self.stock.problems("stock"));
        problems
    }
}

impl midflight_service::ServiceConfig for WmsConfig {
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
    fn defaults_are_valid_and_shaped_like_the_users_wms() {
        let config = WmsConfig::default();
        assert_eq!(config.problems(), Vec::<String>::new());
        assert_eq!(config.faults.method("LockStock").latency.p99_ms, 180);
        let levels = config.stock.levels();
        assert_eq!((levels.len(), levels.get("SKU-0100")), (100, Some(&1_000_000)));
    }

    #[test]
    fn explicit_skus_override_generated_ones() {
        let mut stock = StockSection::default();
        stock.skus.insert("SKU-0001".to_owned(), 0);
        stock.skus.insert("RARE".to_owned(), 3);
        let levels = stock.levels();
        assert_eq!((levels["SKU-0001"], levels["RARE"], levels.len()), (0, 3, 101));
    }

    #[test]
    fn bad_values_are_reported() {
        let mut config = WmsConfig::default();
        config.stock.skus.insert(String::new(), -1);
        config.faults.methods.insert("Nope".to_owned(), MethodFaults::default());
        assert_eq!(config.problems().len(), 3, "{:#?}", config.problems());
    }
}
