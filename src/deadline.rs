//! [`Deadline`]: the time a request's caller waits for its answer, and where the layers
//! read it (the sources are listed on [`Deadline`]).

use std::time::Duration;

use http::{HeaderMap, HeaderName, Request};
use tokio::time::Instant;

/// When a request's caller stops waiting for its answer. The queues of the rate-limit
/// layers (a leaky-bucket delay queue) and of the in-flight layer never hold a request
/// past it:
///
/// - a rate limit's queued request whose slot would come after its deadline is refused at
///   once, with the time its slot would have come as its exact retry-after, and its units
///   go back (the slot is free for the next request); the generic layer's
///   [`RateLimited`](crate::generic::RateLimited) says so
///   ([`is_past_deadline`](crate::generic::RateLimited::is_past_deadline));
/// - an in-flight limit's waiting request leaves the queue at its deadline, refused.
///
/// Such refusals are counted apart: `tollgate.rate_limit.requests_total` and
/// `tollgate.in_flight.requests_total` with `tollgate.result = "deadline"`.
///
/// An HTTP request's deadline is the earliest of:
///
/// - a `Deadline` an earlier layer put into its extensions;
/// - gRPC's `grpc-timeout` (1 to 8 digits and a unit: `H`, `M`, `S`, `m`, `u`, `n`), the
///   time the caller has left;
/// - Envoy's `x-envoy-expected-rq-timeout-ms`, the time Envoy gives the route before it
///   answers the caller itself;
/// - a header the layer names (`deadline_header` on the HTTP builders), in milliseconds.
///
/// A time left in a header counts from when the layer reads it; a malformed value is
/// treated as absent. The generic layer reads a request's deadline with the function
/// given to its builder's `deadline`. On tokio's clock, so that paused-time tests drive
/// it.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Deadline;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(Deadline::after(Duration::from_millis(250)));
/// let left = req.extensions().get::<Deadline>().unwrap().remaining();
/// assert!(left <= Duration::from_millis(250));
/// # });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(Instant);

impl Deadline {
    /// A deadline at `instant`.
    pub fn at(instant: Instant) -> Self {
        Deadline(instant)
    }

    /// A deadline `left` from now (saturating at the clock's far end).
    pub fn after(left: Duration) -> Self {
        let now = Instant::now();
        Deadline(now.checked_add(left).unwrap_or_else(|| far_future(now)))
    }

    /// The instant.
    pub fn instant(&self) -> Instant {
        self.0
    }

    /// The time left until it; zero once it has passed.
    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }
}

/// About thirty years from `now`: a deadline no queue reaches.
fn far_future(now: Instant) -> Instant {
    now + Duration::from_secs(86_400 * 365 * 30)
}

/// `x-envoy-expected-rq-timeout-ms`.
static ENVOY: HeaderName = HeaderName::from_static("x-envoy-expected-rq-timeout-ms");
/// `grpc-timeout`.
static GRPC: HeaderName = HeaderName::from_static("grpc-timeout");

/// Where an HTTP layer reads a request's deadline: the [module docs](self)' sources, and
/// the header the layer names, if any.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeadlineSources {
    header: Option<HeaderName>,
}

impl DeadlineSources {
    /// Also reads `header`, in milliseconds.
    pub(crate) fn with_header(header: HeaderName) -> Self {
        DeadlineSources {
            header: Some(header),
        }
    }

    /// The time `req`'s caller has left, if it says.
    pub(crate) fn left<B>(&self, req: &Request<B>) -> Option<Duration> {
        let from_headers = self.in_headers(req.headers());
        let from_extension = req.extensions().get::<Deadline>().map(Deadline::remaining);
        match (from_headers, from_extension) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn in_headers(&self, headers: &HeaderMap) -> Option<Duration> {
        let grpc = headers.get(&GRPC).and_then(|v| grpc_timeout(v.as_bytes()));
        let envoy = headers.get(&ENVOY).and_then(|v| millis(v.as_bytes()));
        let own = self
            .header
            .as_ref()
            .and_then(|h| headers.get(h))
            .and_then(|v| millis(v.as_bytes()));
        [grpc, envoy, own].into_iter().flatten().min()
    }
}

/// A `grpc-timeout` value: 1 to 8 ASCII digits and a unit.
fn grpc_timeout(v: &[u8]) -> Option<Duration> {
    let (&unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n = decimal(digits)?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Milliseconds, as Envoy writes them: ASCII digits.
fn millis(v: &[u8]) -> Option<Duration> {
    if v.is_empty() || v.len() > 15 {
        return None;
    }
    decimal(v).map(Duration::from_millis)
}

/// ASCII digits (at most 15, so no overflow) as a number.
fn decimal(digits: &[u8]) -> Option<u64> {
    digits.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

/// A rate limit's queued request refused for its deadline, logged at `debug` (the layer's
/// metrics count it under `tollgate.result = "deadline"`).
#[cold]
pub(crate) fn refused(limiter: &str, policy: &str, slot: Duration) {
    tracing::debug!(
        target: "tollgate",
        limiter,
        policy,
        slot_ms = slot.as_millis() as u64,
        "a queued request's slot comes after its deadline: refused"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(headers: &[(&str, &str)]) -> Request<()> {
        let mut r = Request::new(());
        for (k, v) in headers {
            r.headers_mut().insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        r
    }

    #[test]
    fn grpc_timeouts_in_every_unit() {
        let ms = Duration::from_millis;
        for (v, want) in [
            ("1H", Some(Duration::from_secs(3600))),
            ("2M", Some(Duration::from_secs(120))),
            ("3S", Some(Duration::from_secs(3))),
            ("100m", Some(ms(100))),
            ("250u", Some(Duration::from_micros(250))),
            ("99999999n", Some(Duration::from_nanos(99_999_999))),
            ("123456789m", None), // nine digits
            ("m", None),
            ("10x", None),
            ("1.5S", None),
            ("", None),
        ] {
            assert_eq!(grpc_timeout(v.as_bytes()), want, "{v:?}");
        }
    }

    #[test]
    fn the_earliest_source_wins_and_malformed_values_are_absent() {
        let own = DeadlineSources::with_header(HeaderName::from_static("x-deadline-ms"));
        let r = req(&[
            ("grpc-timeout", "2S"),
            ("x-envoy-expected-rq-timeout-ms", "1500"),
            ("x-deadline-ms", "700"),
        ]);
        assert_eq!(own.left(&r), Some(Duration::from_millis(700)));
        assert_eq!(
            DeadlineSources::default().left(&r),
            Some(Duration::from_millis(1500))
        );
        let bad = req(&[
            ("grpc-timeout", "soon"),
            ("x-envoy-expected-rq-timeout-ms", "-1"),
        ]);
        assert_eq!(DeadlineSources::default().left(&bad), None);
        assert_eq!(DeadlineSources::default().left(&req(&[])), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_extension_deadline_counts_down() {
        let mut r = req(&[("x-envoy-expected-rq-timeout-ms", "900")]);
        r.extensions_mut()
            .insert(Deadline::after(Duration::from_millis(500)));
        tokio::time::advance(Duration::from_millis(200)).await;
        let sources = DeadlineSources::default();
        assert_eq!(sources.left(&r), Some(Duration::from_millis(300)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(sources.left(&r), Some(Duration::ZERO));
        assert!(Deadline::after(Duration::MAX).remaining() > Duration::from_secs(1 << 29));
    }
}
