//! Injected latency: a log-normal distribution fitted to a median and a 99th percentile.
//!
//! Service latencies are right-skewed with a long tail, which a log-normal reproduces with two
//! numbers people actually know about their downstream (p50 and p99). With `ln X ~ N(mu, sigma)`,
//! the median is `exp(mu)` and the 99th percentile is `exp(mu + 2.326 sigma)`, so both parameters
//! follow directly from the two percentiles.

use std::time::Duration;

use rand::Rng;

use crate::plan::Latency;

/// The standard normal's 99th percentile.
const Z_P99: f64 = 2.326;
/// Longest single injected delay. The tail of a log-normal is unbounded; a cap keeps one unlucky
/// draw from outliving every caller's deadline by hours.
pub const DELAY_MS_MAX: f64 = 120_000.0;

/// A log-normal distribution of delays, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogNormal {
    mu: f64,
    sigma: f64,
}

impl LogNormal {
    /// Fits the distribution; `None` when the median is zero (no latency injected).
    pub fn fit(latency: Latency) -> Option<LogNormal> {
        if latency.p50_ms == 0 {
            return None;
        }
        let p50 = f64::from(latency.p50_ms);
        let p99 = f64::from(latency.p99_ms.max(latency.p50_ms));
        Some(LogNormal { mu: p50.ln(), sigma: (p99.ln() - p50.ln()) / Z_P99 })
    }

    /// Draws one delay.
    pub fn sample(&self, rng: &mut impl Rng) -> Duration {
        let ms = (self.mu + self.sigma * standard_normal(rng)).exp().min(DELAY_MS_MAX);
        Duration::from_secs_f64(ms / 1_000.0)
    }
}

/// Draws a delay for `latency` (zero when no latency is configured).
pub fn sample(latency: Latency, rng: &mut impl Rng) -> Duration {
    LogNormal::fit(latency).map_or(Duration::ZERO, |distribution| distribution.sample(rng))
}

/// Box-Muller: two uniform draws make one standard normal draw.
fn standard_normal(rng: &mut impl Rng) -> f64 {
    // `random` is in [0, 1); taking 1 - u keeps the logarithm's argument away from zero.
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn percentile(sorted: &[Duration], p: f64) -> f64 {
        let index = ((sorted.len() as f64) * p) as usize;
        sorted[index.min(sorted.len() - 1)].as_secs_f64() * 1_000.0
    }

    #[test]
    fn samples_match_the_fitted_percentiles() {
        let mut rng = StdRng::seed_from_u64(42);
        let latency = Latency { p50_ms: 60, p99_ms: 180 };
        let mut draws: Vec<Duration> = (0..100_000).map(|_| sample(latency, &mut rng)).collect();
        draws.sort();
        let (p50, p99) = (percentile(&draws, 0.50), percentile(&draws, 0.99));
        assert!((57.0..63.0).contains(&p50), "p50 {p50}");
        assert!((170.0..190.0).contains(&p99), "p99 {p99}");
    }

    #[test]
    fn zero_median_means_no_latency_and_equal_percentiles_a_constant() {
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(sample(Latency::default(), &mut rng), Duration::ZERO);
        let constant = sample(Latency { p50_ms: 25, p99_ms: 25 }, &mut rng);
        assert!((constant.as_secs_f64() * 1_000.0 - 25.0).abs() < 1e-6, "{constant:?}");
    }

    #[test]
    fn the_tail_is_capped() {
        let mut rng = StdRng::seed_from_u64(3);
        let wild = Latency { p50_ms: 60_000, p99_ms: 60_000 };
        let max = (0..1_000).map(|_| sample(wild, &mut rng)).max().expect("draws");
        assert!(max <= Duration::from_secs_f64(DELAY_MS_MAX / 1_000.0));
    }
}
