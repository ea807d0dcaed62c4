//! The one telemetry setup of every service: `tracing` logs, pretty or JSON, filtered by the
//! configured directives. OpenTelemetry export and the metrics endpoint attach here too.

use midflight_config::TelemetrySection;
use tracing_subscriber::EnvFilter;

use crate::Error;

/// Keeps telemetry running; dropping it flushes what can be flushed.
#[derive(Debug)]
pub struct Telemetry {
    _private: (),
}

/// Installs the global subscriber for `service`. Call once, early.
pub fn init_telemetry(service: &'static str, section: &TelemetrySection) -> Result<Telemetry, Error> {
    let filter = EnvFilter::try_new(&section.log_filter)
        .map_err(|e| Error::Telemetry(format!("telemetry.log_filter {:?}: {e}", section.log_filter)))?;
    // Colours only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_ansi(ansi);
    let installed = if section.log_format == "json" {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.compact().try_init()
    };
    installed.map_err(|e| Error::Telemetry(format!("cannot install the log subscriber: {e}")))?;
    tracing::debug!(service, "telemetry ready");
    Ok(Telemetry { _private: () })
}
