//! The optional bearer-token check in front of every mock service except health.
//!
//! A tower layer rather than a per-service interceptor, so it is applied once in the server
//! bootstrap and a new service cannot be added without it. Health stays open because probes
//! (and people checking a stack) should not need the token.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{Either, Ready, ready};
use tonic::Status;
use tower::{Layer, Service};

/// Path prefix of the gRPC health service, which needs no token.
const HEALTH_PATH_PREFIX: &str = "/grpc.health.v1.Health/";

/// Requires `authorization: Bearer <token>` when a token is configured; passes everything
/// through when it is not.
#[derive(Debug, Clone)]
pub struct BearerAuthLayer {
    expected: Option<Arc<str>>,
}

impl BearerAuthLayer {
    pub fn new(token: Option<&str>) -> BearerAuthLayer {
        BearerAuthLayer { expected: token.map(|token| Arc::from(format!("Bearer {token}"))) }
    }
}

impl<S> Layer<S> for BearerAuthLayer {
    type Service = BearerAuth<S>;

    fn layer(&self, inner: S) -> BearerAuth<S> {
        BearerAuth { inner, expected: self.expected.clone() }
    }
}

/// The service [`BearerAuthLayer`] wraps around the routes.
#[derive(Debug, Clone)]
pub struct BearerAuth<S> {
    inner: S,
    expected: Option<Arc<str>>,
}

impl<S, B> Service<http::Request<B>> for BearerAuth<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<S::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if self.allows(&request) {
            Either::Right(self.inner.call(request))
        } else {
            let status = Status::unauthenticated("missing or wrong bearer token");
            Either::Left(ready(Ok(status.into_http())))
        }
    }
}

impl<S> BearerAuth<S> {
    fn allows<B>(&self, request: &http::Request<B>) -> bool {
        let Some(expected) = &self.expected else { return true };
        if request.uri().path().starts_with(HEALTH_PATH_PREFIX) {
            return true;
        }
        request
            .headers()
            .get(http::header::AUTHORIZATION)
            .is_some_and(|presented| constant_time_eq(presented.as_bytes(), expected.as_bytes()))
    }
}

/// Compares without stopping at the first difference, so response time says nothing about
/// how much of a guessed token was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn constant_time_eq_compares_whole_strings() {
        assert!(constant_time_eq(b"Bearer abc", b"Bearer abc"));
        assert!(!constant_time_eq(b"Bearer abd", b"Bearer abc"));
        assert!(!constant_time_eq(b"Bearer ab", b"Bearer abc"));
    }
}
