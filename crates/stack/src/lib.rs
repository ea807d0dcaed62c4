//! The system in one process, for tests and benchmarks: the mock WMS and mock logistics served
//! on loopback port 0 with their own SQLite ledgers, handles to change their fault plans, a
//! client of both, and Kafka ([`kafka`]: librdkafka's embedded cluster, or an external broker
//! named by its bootstrap address). Separate OS processes are the demo's business
//! (`cargo xtask demo`); this is the quick, deterministic way for a test to talk to real gRPC
//! downstreams.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use midflight_api::client::Downstreams;
use midflight_api::faults::v1::fault_admin_client::FaultAdminClient;
use midflight_config::{DatabaseSection, GrpcClientSection, ServerSection};
use midflight_mock::{Clock, FaultPlan, SystemClock};
use midflight_mock_logistics::LogisticsConfig;
use midflight_mock_wms::WmsConfig;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

pub use midflight_mock::{FaultPlan as Faults, Latency, ManualClock, MethodFaults};

#[cfg(feature = "kafka")]
pub mod kafka;

/// How to start the mocks. By default: no latency, no faults, generous stock.
#[derive(Debug, Clone, Default)]
pub struct MockOptions {
    pub wms_faults: FaultPlan,
    pub logistics_faults: FaultPlan,
    /// Stock levels to set (e.g. `SKU-0001 = 0` to force a rejection).
    pub stock: BTreeMap<String, i64>,
    /// Regions the logistics mock refuses; default `["XX"]`.
    pub unserviceable_regions: Option<Vec<String>>,
    /// A manual clock for both mocks, to cross reversal windows without waiting.
    pub clock: Option<Arc<ManualClock>>,
}

/// Running mock downstreams. Dropping it stops them and deletes their ledgers.
#[derive(Debug)]
pub struct MockDownstreams {
    pub wms_endpoint: String,
    pub logistics_endpoint: String,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    files: Vec<PathBuf>,
}

impl MockDownstreams {
    /// Starts both mocks and waits until they accept connections.
    pub async fn start(options: MockOptions) -> MockDownstreams {
        let shutdown = CancellationToken::new();
        let clock: Arc<dyn Clock> = match &options.clock {
            Some(clock) => clock.clone(),
            None => Arc::new(SystemClock),
        };
        let wms_db = temp_db("wms");
        let logistics_db = temp_db("logistics");

        let mut wms = WmsConfig {
            faults: options.wms_faults.clone(),
            database: sqlite(&wms_db),
            server: loopback(),
            ..WmsConfig::default()
        };
        wms.stock.skus.extend(options.stock.clone());
        let (wms_listener, wms_endpoint) = bind().await;
        let token = shutdown.clone();
        let wms_clock = clock.clone();
        let wms_task = tokio::spawn(async move {
            let result =
                midflight_mock_wms::run_with_clock(wms, wms_listener, wms_clock, token.cancelled_owned()).await;
            if let Err(error) = result {
                panic!("mock wms stopped: {error}");
            }
        });

        let mut logistics = LogisticsConfig {
            faults: options.logistics_faults.clone(),
            database: sqlite(&logistics_db),
            server: loopback(),
            ..LogisticsConfig::default()
        };
        if let Some(regions) = &options.unserviceable_regions {
            logistics.shipping.unserviceable_regions = regions.clone();
        }
        let (logistics_listener, logistics_endpoint) = bind().await;
        let token = shutdown.clone();
        let logistics_task = tokio::spawn(async move {
            let result =
                midflight_mock_logistics::run_with_clock(logistics, logistics_listener, clock, token.cancelled_owned())
                    .await;
            if let Err(error) = result {
                panic!("mock logistics stopped: {error}");
            }
        });

        let mocks = MockDownstreams {
            wms_endpoint,
            logistics_endpoint,
            shutdown,
            tasks: vec![wms_task, logistics_task],
            files: vec![wms_db, logistics_db],
        };
        mocks.wait_ready().await;
        mocks
    }

    /// Client settings pointing at the mocks.
    pub fn sections(&self) -> (GrpcClientSection, GrpcClientSection) {
        (
            GrpcClientSection::with_endpoint(&self.wms_endpoint),
            GrpcClientSection::with_endpoint(&self.logistics_endpoint),
        )
    }

    /// A client of both mocks, as the driver uses it.
    pub fn client(&self) -> Downstreams {
        let (wms, logistics) = self.sections();
        Downstreams::connect_lazy(&wms, &logistics).expect("loopback endpoints are valid")
    }

    pub async fn set_wms_faults(&self, plan: FaultPlan) {
        set_faults(&self.wms_endpoint, plan).await;
    }

    pub async fn set_logistics_faults(&self, plan: FaultPlan) {
        set_faults(&self.logistics_endpoint, plan).await;
    }

    /// Takes entry `seq` of the WMS ledger out of sight, as a downstream that numbers an entry
    /// when its write begins shows it only once that write commits; [`Self::release_wms_entry`]
    /// shows it again. A ledger whose entries appear out of sequence order, for its readers'
    /// tests.
    pub async fn hold_wms_entry(&self, seq: u64) {
        self.move_wms_entry(seq, true).await;
    }

    /// Shows again an entry taken out of sight by [`Self::hold_wms_entry`].
    pub async fn release_wms_entry(&self, seq: u64) {
        self.move_wms_entry(seq, false).await;
    }

    async fn move_wms_entry(&self, seq: u64, hold: bool) {
        let url = format!("sqlite://{}", self.files[0].display());
        midflight_mock_wms::ledger::hold_entry(&url, seq, hold).await.expect("move the wms ledger entry");
    }

    /// Ledger queries answer once both servers are up (bounded wait, no sleeps beyond polling).
    async fn wait_ready(&self) {
        let client = self.client();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let wms = client.wms_ledger(0, 1, Duration::from_secs(1)).await;
            let logistics = client.logistics_ledger(0, 1, Duration::from_secs(1)).await;
            if wms.is_ok() && logistics.is_ok() {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "mocks did not start: {wms:?} {logistics:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for MockDownstreams {
    fn drop(&mut self) {
        self.shutdown.cancel();
        for task in &self.tasks {
            task.abort();
        }
        for path in &self.files {
            for suffix in ["", "-wal", "-shm"] {
                std::fs::remove_file(format!("{}{suffix}", path.display())).ok();
            }
        }
    }
}

/// A plan whose one method fails the given way (the rest clean).
pub fn fault(method: &str, faults: MethodFaults) -> FaultPlan {
    let mut plan = FaultPlan::default();
    plan.methods.insert(method.to_owned(), faults);
    plan
}

async fn set_faults(endpoint: &str, plan: FaultPlan) {
    let channel =
        Channel::from_shared(endpoint.to_owned()).expect("endpoint").connect().await.expect("connect to mock");
    FaultAdminClient::new(channel).set_faults(plan.to_proto()).await.expect("set faults");
}

async fn bind() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let address = listener.local_addr().expect("local address");
    (listener, format!("http://{address}"))
}

fn loopback() -> ServerSection {
    ServerSection { listen: "127.0.0.1:0".to_owned(), ..ServerSection::default() }
}

fn temp_db(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("midflight-stack-{name}-{}.db", uuid::Uuid::new_v4().simple()))
}

fn sqlite(path: &std::path::Path) -> DatabaseSection {
    DatabaseSection { url: format!("sqlite://{}?mode=rwc", path.display()), ..DatabaseSection::default() }
}
