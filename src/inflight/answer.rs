//! What an attempt to take a slot means for the request ([`settle`]) and its response:
//! the fields an admitted response carries ([`Slot`]) and the refusal, formatted once when
//! the layer is built ([`InFlightReplies`]).

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};

use super::store::{Acquired, Permit};
use crate::core::{store_failed, Verdict, Wording};
use crate::observe::{Counted, InFlightMetrics};
use crate::options::OnStoreError;
use crate::response::OwnAnswer;
use crate::response::{
    grpc, prefixed_value, problem_body, quota_refusal, sf_string, shared_value, PAST_DEADLINE,
    PAST_DEADLINE_TITLE, QUOTA_EXCEEDED, RATELIMIT, RATELIMIT_POLICY,
};

/// The in-flight layer's words.
pub(crate) static WORDING: Wording = Wording {
    kind: "in-flight limit",
    no_key: "No in-flight limit key could be extracted from this request.",
    store_down: "The in-flight limiter's store is unavailable.",
};

/// The detail (and gRPC message) of a request refused at its deadline.
const LATE: &str =
    "This request was still waiting for a slot at its deadline; retry when one has finished.";

/// `RateLimit` values formatted in advance, for this many remaining slots and fewer.
const PRESET: u32 = 256;

/// A concurrency refusal has no exact retry time (a slot frees when some response ends):
/// one second, the shortest a client may be told, and never `0`.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the layer adds to its responses: the fields' values and the refusal.
pub(crate) struct InFlightReplies {
    /// The limit's name.
    pub(crate) label: Arc<str>,
    /// `"label";q=N;qu="concurrent-requests"`.
    policy: HeaderValue,
    /// `"label";r=` (the prefix of every `RateLimit` value).
    prefix: Vec<u8>,
    /// `RateLimit` for `r = 0..=PRESET` (or up to the limit).
    remaining: Vec<HeaderValue>,
    /// The problem body of a refusal.
    body: Bytes,
    /// The problem body of a request refused at its deadline, still waiting for a slot.
    late_body: Bytes,
    /// Its decisions, and the slots held now.
    metrics: InFlightMetrics,
}

impl std::fmt::Debug for InFlightReplies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlightReplies")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl InFlightReplies {
    /// The replies of a limit named `label` (checked: see `CommonOptions::build`) of
    /// `max` requests in flight.
    pub(crate) fn new(label: &Arc<str>, max: u32) -> Self {
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
        let late_body = problem_body(
            429,
            PAST_DEADLINE_TITLE,
            LATE,
            &[label],
            Some(PAST_DEADLINE),
        );
        InFlightReplies {
            metrics: InFlightMetrics::new(label),
            label: Arc::clone(label),
            policy: shared_value(policy),
            prefix,
            remaining,
            body,
            late_body,
        }
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
        headers.append(RATELIMIT_POLICY, self.policy.clone());
        headers.append(RATELIMIT, self.remaining_value(remaining));
    }

    /// The refusal: `429`, `Retry-After: 1`, the fields with `r=0`, a problem body; for
    /// a gRPC call, `RESOURCE_EXHAUSTED` with a one-second `RetryInfo` and the same
    /// fields as metadata.
    pub(crate) fn refusal(&self, grpc: bool) -> Response<Bytes> {
        let message = grpc.then_some(
            "Too many requests of this client are in flight; retry when one has finished.",
        );
        self.refusal_with(&self.body, message)
    }

    /// The refusal of a request still waiting for a slot at its deadline: the same, of
    /// the problem type `…#queued-past-the-deadline`.
    fn late_refusal(&self, grpc: bool) -> Response<Bytes> {
        self.refusal_with(&self.late_body, grpc.then_some(LATE))
    }

    fn refusal_with(&self, body: &Bytes, message: Option<&str>) -> Response<Bytes> {
        // `RateLimit-Policy` and `RateLimit` follow.
        let mut r = quota_refusal(Some(body.clone()), message, Some(RETRY_AFTER), 2);
        self.apply(r.headers_mut(), 0);
        r
    }
}

/// What an admitted request carries to its response: its slot, and what its fields say.
#[allow(missing_debug_implementations)]
pub(crate) struct Slot {
    permit: Permit,
    replies: Arc<InFlightReplies>,
    remaining: u32,
}

impl Slot {
    /// Adds the limit's fields to the response's headers; the slot stays held by the
    /// returned permit (which the response body keeps).
    pub(crate) fn apply(self, headers: &mut HeaderMap) -> Permit {
        self.replies.apply(headers, self.remaining);
        self.permit
    }
}

/// The refusal of a request still waiting for a slot at its deadline, counted and logged
/// apart from the others (`deadline`).
#[cold]
pub(crate) fn late<B>(replies: &InFlightReplies, req: &Request<B>) -> OwnAnswer {
    replies.metrics.count(Counted::Deadline);
    tracing::info!(target: "tollgate", limiter = %replies.label, outcome = "deadline", "in-flight limit refused a request at its deadline, still waiting for a slot");
    Box::new(replies.late_refusal(grpc::is_grpc(req.headers())))
}

/// What an attempt to take a slot means for `req`: proceed with its slot, or an answer of
/// the layer's own.
#[inline]
pub(crate) fn settle<B>(
    acquired: Acquired,
    replies: &Arc<InFlightReplies>,
    on_error: OnStoreError,
    req: &Request<B>,
) -> Verdict<Slot> {
    match acquired {
        Acquired::Admitted { permit, remaining } => {
            replies.metrics.count(Counted::Admitted);
            Ok(Some(Slot {
                permit: permit.leased(replies.metrics.lease()),
                replies: Arc::clone(replies),
                remaining,
            }))
        }
        Acquired::Full => {
            replies.metrics.count(Counted::Refused);
            tracing::info!(target: "tollgate", limiter = %replies.label, "in-flight limit refused a request");
            Err(Box::new(replies.refusal(grpc::is_grpc(req.headers()))))
        }
        // The store logged the failure.
        Acquired::Failed(_) => {
            let verdict = store_failed(on_error, &WORDING, req);
            replies.metrics.count(match verdict {
                Ok(_) => Counted::FailOpen,
                Err(_) => Counted::FailClosed,
            });
            verdict
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replies(label: &str, max: u32) -> InFlightReplies {
        InFlightReplies::new(&label.into(), max)
    }

    #[test]
    fn fields_and_refusal() {
        let a = replies("inflight", 2);
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
        let a = replies("x", 1000);
        assert_eq!(a.remaining_value(999), "\"x\";r=999");
        assert_eq!(a.remaining_value(3), "\"x\";r=3");
    }

    #[test]
    fn labels_are_quoted() {
        let a = replies("a\"b", 1);
        assert_eq!(a.remaining_value(0), "\"a\\\"b\";r=0");
    }
}
