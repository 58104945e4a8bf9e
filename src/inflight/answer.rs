//! The in-flight layer's header values and refusal, formatted once when the layer is
//! built.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};

use crate::{
    error::ConfigError,
    response::{
        prefixed_value, problem_body, quota_refusal, sf_string, shared_value, QUOTA_EXCEEDED,
        RATELIMIT, RATELIMIT_POLICY,
    },
};

/// `RateLimit` values formatted in advance, for this many remaining slots and fewer.
const PRESET: u32 = 256;

/// A concurrency refusal has no exact retry time (a slot frees when some response ends):
/// one second, the shortest a client may be told, and never `0`.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the layer adds to its responses.
pub(crate) struct Answers {
    /// The limit's name.
    pub(crate) label: Box<str>,
    /// `"label";q=N;qu="concurrent-requests"`.
    policy: HeaderValue,
    /// `"label";r=` (the prefix of every `RateLimit` value).
    prefix: Vec<u8>,
    /// `RateLimit` for `r = 0..=PRESET` (or up to the limit).
    remaining: Vec<HeaderValue>,
    /// The problem body of a refusal.
    body: Bytes,
    /// `tollgate.in_flight.requests` by result: admitted, refused, fail_open, fail_closed.
    #[cfg(feature = "metrics")]
    requests: [metrics::Counter; 4],
}

/// What became of a request, for the metrics.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counted {
    Admitted = 0,
    Refused = 1,
    FailOpen = 2,
    FailClosed = 3,
}

impl std::fmt::Debug for Answers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answers")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Answers {
    /// Counts a request's outcome (with the feature `metrics`).
    #[inline]
    pub(crate) fn count(&self, what: Counted) {
        #[cfg(feature = "metrics")]
        self.requests[what as usize].increment(1);
        let _ = what;
    }

    /// The answers of a limit named `label` of `max` requests in flight. Refuses a label
    /// that cannot be sent in a header.
    pub(crate) fn new(label: &str, max: u32) -> Result<Self, ConfigError> {
        if label.is_empty() || !label.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(ConfigError::InvalidName(label.to_owned()));
        }
        let mut prefix = Vec::new();
        sf_string(label, &mut prefix);
        let mut policy = prefix.clone();
        policy.extend_from_slice(b";q=");
        policy.extend_from_slice(itoa::Buffer::new().format(max).as_bytes());
        policy.extend_from_slice(b";qu=\"concurrent-requests\"");
        prefix.extend_from_slice(b";r=");
        let remaining = (0..=max.min(PRESET))
            .map(|r| {
                let mut v = prefix.clone();
                v.extend_from_slice(itoa::Buffer::new().format(r).as_bytes());
                shared_value(v)
            })
            .collect();
        let body = problem_body(
            429,
            "Too Many Requests",
            "Too many requests of this client are in flight; retry when one has finished.",
            &[label],
            Some(QUOTA_EXCEEDED),
        );
        #[cfg(feature = "metrics")]
        crate::observe::describe();
        Ok(Answers {
            #[cfg(feature = "metrics")]
            requests: ["admitted", "refused", "fail_open", "fail_closed"].map(|r| {
                metrics::counter!(
                    "tollgate.in_flight.requests",
                    "tollgate.limiter" => label.to_owned(),
                    "tollgate.result" => r
                )
            }),
            label: label.into(),
            policy: shared_value(policy),
            prefix,
            remaining,
            body,
        })
    }

    fn remaining_value(&self, r: u32) -> HeaderValue {
        match self.remaining.get(r as usize) {
            Some(v) => v.clone(),
            None => prefixed_value(&self.prefix, u64::from(r)),
        }
    }

    /// Adds this limit's items to a response's `RateLimit-Policy` and `RateLimit` fields,
    /// beside those of other layers (appended, never replacing theirs).
    pub(crate) fn apply(&self, headers: &mut HeaderMap, remaining: u32) {
        headers.append(&RATELIMIT_POLICY, self.policy.clone());
        headers.append(&RATELIMIT, self.remaining_value(remaining));
    }

    /// The refusal: `429`, `Retry-After: 1`, the fields with `r=0`, a problem body; for
    /// a gRPC call, `RESOURCE_EXHAUSTED` with a one-second `RetryInfo` and the same
    /// fields as metadata.
    pub(crate) fn refusal(&self, grpc: bool) -> Response<Bytes> {
        let message = grpc.then_some(
            "Too many requests of this client are in flight; retry when one has finished.",
        );
        // `RateLimit-Policy` and `RateLimit` follow.
        let mut r = quota_refusal(Some(self.body.clone()), message, Some(RETRY_AFTER), 2);
        self.apply(r.headers_mut(), 0);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_refusal() {
        let a = Answers::new("inflight", 2).unwrap();
        let mut h = HeaderMap::new();
        a.apply(&mut h, 1);
        assert_eq!(
            h["ratelimit-policy"],
            "\"inflight\";q=2;qu=\"concurrent-requests\""
        );
        assert_eq!(h["ratelimit"], "\"inflight\";r=1");
        let r = a.refusal(false);
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()["retry-after"], "1");
        assert_eq!(r.headers()["ratelimit"], "\"inflight\";r=0");
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["violated-policies"][0], "inflight");
        assert_eq!(body["status"], 429);
    }

    #[test]
    fn values_past_the_preset_are_formatted() {
        let a = Answers::new("x", 1000).unwrap();
        assert_eq!(a.remaining_value(999), "\"x\";r=999");
        assert_eq!(a.remaining_value(3), "\"x\";r=3");
    }

    #[test]
    fn labels_must_be_printable() {
        assert!(Answers::new("", 1).is_err());
        assert!(Answers::new("é", 1).is_err());
        let a = Answers::new("a\"b", 1).unwrap();
        assert_eq!(a.remaining_value(0), "\"a\\\"b\";r=0");
    }
}
