//! The one telemetry setup of every service, driven by its `telemetry` section:
//!
//! - logs: `tracing` events, pretty or JSON, filtered by `log_filter`;
//! - traces: when `otlp_endpoint` is set, spans of midflight's crates go to an OpenTelemetry
//!   collector over OTLP/gRPC (batched, bounded queue);
//! - metrics: when `otlp_endpoint` is set, exported over OTLP every [`METRICS_EXPORT_INTERVAL`];
//!   when `metrics_listen` is set, scraped from `/metrics` on that address, which also serves
//!   `/healthz` and `/readyz`.
//!
//! With neither key set (the default) no OpenTelemetry layer or provider is installed: spans are
//! disabled callsites, instruments are the global no-op ones, and nothing needs a collector.
//!
//! Spans never reach the log output (the log layer sees events only), so turning tracing on
//! does not change what the logs look like.

use std::net::SocketAddr;
use std::time::Duration;

use midflight_config::TelemetrySection;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanExporter};
use tracing::{Level, Metadata};
use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

use crate::Error;
use crate::endpoint::Endpoint;
use crate::health::readiness;

/// How often metrics are pushed to the collector. Prometheus scrapes every 15 s by default;
/// pushing at 10 s keeps the collector's view as fresh as a scrape.
pub const METRICS_EXPORT_INTERVAL: Duration = Duration::from_secs(10);
/// Deadline of one OTLP export; a missing collector costs at most this per batch, off the hot path.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Spans waiting for export; beyond this new spans are dropped (and counted by the SDK) rather
/// than buffered without bound. About two seconds of a busy consumer's spans.
pub const SPAN_QUEUE_MAX: usize = 16_384;
/// How long shutdown waits for the last export.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// The tracer every span is recorded with.
const TRACER: &str = "midflight";

/// Keeps telemetry running. [`Telemetry::shutdown`] flushes what is buffered; dropping it does
/// the same, blocking, as a fallback.
#[derive(Debug)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
    endpoint: Option<Endpoint>,
}

impl Telemetry {
    /// Where `/metrics`, `/healthz` and `/readyz` are served, if they are.
    pub fn endpoint_address(&self) -> Option<SocketAddr> {
        self.endpoint.as_ref().map(Endpoint::address)
    }

    /// Stops the endpoint and flushes the last spans and metrics.
    pub async fn shutdown(mut self) {
        if let Some(endpoint) = self.endpoint.take() {
            endpoint.shutdown().await;
        }
        let (tracer, meter) = (self.tracer.take(), self.meter.take());
        // Flushing blocks on the exporters; a blocking thread keeps the runtime's workers free to
        // drive the gRPC connection the export goes over.
        tokio::task::spawn_blocking(move || flush(tracer, meter)).await.ok();
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        let (tracer, meter) = (self.tracer.take(), self.meter.take());
        if tracer.is_some() || meter.is_some() {
            // Off the runtime's thread, for the same reason as in `shutdown`.
            std::thread::spawn(move || flush(tracer, meter)).join().ok();
        }
    }
}

fn flush(tracer: Option<SdkTracerProvider>, meter: Option<SdkMeterProvider>) {
    if let Some(tracer) = tracer
        && let Err(error) = tracer.shutdown_with_timeout(FLUSH_TIMEOUT)
    {
        eprintln!("telemetry: flushing spans failed: {error}");
    }
    if let Some(meter) = meter
        && let Err(error) = meter.shutdown_with_timeout(FLUSH_TIMEOUT)
    {
        eprintln!("telemetry: flushing metrics failed: {error}");
    }
}

/// Installs the global subscriber and providers for `service`. Call once, early, inside the
/// tokio runtime (the OTLP client and the endpoint run on it).
pub fn init_telemetry(service: &'static str, section: &TelemetrySection) -> Result<Telemetry, Error> {
    let tracer = match &section.otlp_endpoint {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .with_timeout(EXPORT_TIMEOUT)
                .build()
                .map_err(|e| Error::Telemetry(format!("telemetry.otlp_endpoint {endpoint:?}: {e}")))?;
            let batch = BatchConfigBuilder::default().with_max_queue_size(SPAN_QUEUE_MAX).build();
            let processor = BatchSpanProcessor::builder(exporter).with_batch_config(batch).build();
            Some(SdkTracerProvider::builder().with_resource(resource(service)).with_span_processor(processor).build())
        }
        None => None,
    };
    install(service, section, tracer)
}

/// [`init_telemetry`] with spans going to `exporter` as each one ends (tests pass an in-memory
/// exporter), whatever `otlp_endpoint` says. Metrics follow the section as usual.
pub fn init_telemetry_with_exporter<E>(
    service: &'static str,
    section: &TelemetrySection,
    exporter: E,
) -> Result<Telemetry, Error>
where
    E: SpanExporter + 'static,
{
    let tracer = SdkTracerProvider::builder().with_resource(resource(service)).with_simple_exporter(exporter).build();
    install(service, section, Some(tracer))
}

/// `telemetry.log_filter` as the logging library reads it, or why it cannot.
pub(crate) fn check_log_filter(section: &TelemetrySection) -> Result<EnvFilter, Error> {
    EnvFilter::try_new(&section.log_filter)
        .map_err(|e| Error::Telemetry(format!("telemetry.log_filter {:?}: {e}", section.log_filter)))
}

fn install(
    service: &'static str,
    section: &TelemetrySection,
    tracer: Option<SdkTracerProvider>,
) -> Result<Telemetry, Error> {
    let filter = check_log_filter(section)?;
    let mut layers = vec![log_layer(section, filter)];
    if let Some(provider) = &tracer {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        opentelemetry::global::set_tracer_provider(provider.clone());
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(TRACER))
            .with_location(false)
            .with_threads(false)
            .with_filter(filter_fn(exported));
        layers.push(layer.boxed());
    }
    tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .map_err(|e| Error::Telemetry(format!("cannot install the log subscriber: {e}")))?;
    let (meter, registry) = meter_provider(service, section)?;
    let endpoint = match &section.metrics_listen {
        Some(listen) => Some(serve_endpoint(listen, registry)?),
        None => None,
    };
    tracing::debug!(service, traces = tracer.is_some(), metrics = meter.is_some(), "telemetry ready");
    Ok(Telemetry { tracer, meter, endpoint })
}

/// Log lines: events only, so spans (exported or not) never change what a log line looks like.
fn log_layer(section: &TelemetrySection, filter: EnvFilter) -> Box<dyn Layer<Registry> + Send + Sync> {
    // Colours only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let events = filter.and(filter_fn(|metadata: &Metadata<'_>| metadata.is_event()));
    let layer = tracing_subscriber::fmt::layer().with_target(false).with_ansi(ansi);
    if section.log_format == "json" {
        layer.json().flatten_event(true).with_filter(events).boxed()
    } else {
        layer.compact().with_filter(events).boxed()
    }
}

/// What goes to the trace exporter: midflight's own spans at INFO and above (not those of
/// h2, hyper or sqlx), and warnings and errors raised inside them as span events.
fn exported(metadata: &Metadata<'_>) -> bool {
    if metadata.is_span() {
        metadata.target().starts_with("midflight") && *metadata.level() <= Level::INFO
    } else {
        *metadata.level() <= Level::WARN
    }
}

/// The meter provider with a Prometheus reader (when scraped) and an OTLP reader (when pushed);
/// `None` when neither is configured, leaving the global no-op provider in place.
fn meter_provider(
    service: &'static str,
    section: &TelemetrySection,
) -> Result<(Option<SdkMeterProvider>, Option<prometheus::Registry>), Error> {
    if section.metrics_listen.is_none() && section.otlp_endpoint.is_none() {
        return Ok((None, None));
    }
    let mut builder = SdkMeterProvider::builder().with_resource(resource(service));
    let mut registry = None;
    if section.metrics_listen.is_some() {
        let scraped = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(scraped.clone())
            // One meter, so the scope label would repeat the same value on every series.
            .scope_info_enabled(false)
            .build()
            .map_err(|e| Error::Telemetry(format!("cannot set up the prometheus exporter: {e}")))?;
        builder = builder.with_reader(exporter);
        registry = Some(scraped);
    }
    if let Some(endpoint) = &section.otlp_endpoint {
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| Error::Telemetry(format!("telemetry.otlp_endpoint {endpoint:?}: {e}")))?;
        builder = builder.with_reader(PeriodicReader::builder(exporter).with_interval(METRICS_EXPORT_INTERVAL).build());
    }
    let provider = builder.build();
    opentelemetry::global::set_meter_provider(provider.clone());
    Ok((Some(provider), registry))
}

fn serve_endpoint(listen: &str, registry: Option<prometheus::Registry>) -> Result<Endpoint, Error> {
    let cannot = |e: std::io::Error| Error::Telemetry(format!("telemetry.metrics_listen {listen:?}: {e}"));
    let listener = std::net::TcpListener::bind(listen).map_err(cannot)?;
    listener.set_nonblocking(true).map_err(cannot)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(cannot)?;
    Ok(Endpoint::serve(listener, registry, readiness()))
}

fn resource(service: &'static str) -> Resource {
    Resource::builder().with_service_name(service).build()
}
