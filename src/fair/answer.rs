//! What a decision means for the request ([`settle`]) and its response: the fields an
//! admitted response carries ([`Reported`]) and the refusal ([`FairReplies`], formatted as
//! far as it can be when the layer is built).

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};

use super::share::{FairDecision, Share};
use crate::core::{store_failed, Verdict, Wording};
use crate::error::StoreError;
use crate::observe::{outage, Bind, Count, OncePerSecond, RATE_LIMIT_REQUESTS};
use crate::options::OnStoreError;
use crate::quota::Quota;
use crate::response::{
    grpc, problem_open, quota_refusal, rate_limit_item, retry_after_secs, sf_int, sf_string,
    with_wait, QUOTA_EXCEEDED, RATELIMIT, RATELIMIT_POLICY,
};

/// The fair-sharing layer's words.
pub(crate) static WORDING: Wording = Wording {
    kind: "fair-share limit",
    no_key: "No fair-share key could be extracted from this request.",
    store_down: "The fair-share limiter's store is unavailable.",
};

/// What the layer adds to its responses: the fields' values and the refusal.
pub(crate) struct FairReplies {
    /// The pool's name.
    pub(crate) label: Arc<str>,
    /// `"label";r=` (the prefix of every `RateLimit` value).
    prefix: Vec<u8>,
    /// The `RateLimit-Policy` value of the one share, when there is one.
    policy: Option<HeaderValue>,
    /// The problem body of a refusal, without its closing brace: the wait closes it.
    body: Vec<u8>,
    /// Store failures logged as a warning: the first of each second.
    failures: OncePerSecond,
    /// `tollgate.rate_limit.requests_total` by result: admitted, refused.
    requests: [Count; 2],
}

impl FairReplies {
    /// The replies of a pool named `label` (checked: see `CommonOptions::build`), whose
    /// keys all have the share `one` when it is given.
    pub(crate) fn new(label: &Arc<str>, one: Option<&Share>) -> Self {
        let mut prefix = Vec::new();
        sf_string(label, &mut prefix);
        prefix.extend_from_slice(b";r=");
        let body = problem_open(
            429,
            "Too Many Requests",
            "This client's share of the pool is used up; retry after the Retry-After delay.",
            &[label],
            Some(QUOTA_EXCEEDED),
        );
        FairReplies {
            requests: ["admitted", "refused"].map(|r| {
                let labels = [
                    ("tollgate.limiter", &**label),
                    ("tollgate.policy", "fair"),
                    ("tollgate.result", r),
                ];
                Count::new(RATE_LIMIT_REQUESTS, &labels, Bind::Now)
            }),
            label: Arc::clone(label),
            prefix,
            policy: one.map(|share| policy_value(label, share)),
            body,
            failures: OncePerSecond::default(),
        }
    }

    fn count(&self, admitted: bool) {
        self.requests[usize::from(!admitted)].add(1);
    }

    /// Adds the share's items to a response's `RateLimit-Policy` and `RateLimit`
    /// fields, beside those of other layers.
    fn apply(&self, headers: &mut HeaderMap, share: &Share, d: &FairDecision) {
        let policy = match &self.policy {
            Some(v) => v.clone(),
            None => policy_value(&self.label, share),
        };
        headers.append(RATELIMIT_POLICY, policy);
        let next = retry_after_secs(Duration::from_nanos(d.next_after));
        headers.append(RATELIMIT, rate_limit_item(&self.prefix, d.remaining, next));
    }

    fn refusal(&self, share: &Share, d: &FairDecision, is_grpc: bool) -> Response<Bytes> {
        tracing::info!(
            target: "tollgate",
            limiter = %self.label,
            retry_after_ms = crate::response::ms_up(Duration::from_nanos(d.retry_after)),
            "fair-share limit refused a request"
        );
        let message =
            is_grpc.then_some("Request quota exceeded; retry after the delay in RetryInfo.");
        let wait = Duration::from_nanos(d.retry_after);
        // `RateLimit-Policy` and `RateLimit` follow.
        let mut r = quota_refusal(Some(with_wait(&self.body, wait)), message, Some(wait), 2);
        self.apply(r.headers_mut(), share, d);
        r
    }
}

/// `"label";q=Q;w=W;borrow=B`: the most the key may have, its ceiling, as `q` units per
/// window of `w` whole seconds (the ceiling's period, or the least multiple of it that
/// holds the ceiling's burst: `r` never exceeds `q`), and of those the units it has only
/// by borrowing, while the pool has room (the ceiling's units in the window less the
/// guaranteed rate's).
fn policy_value(label: &str, share: &Share) -> HeaderValue {
    const NS: u128 = 1_000_000_000;
    let ceiling = share.ceiling();
    let (limit, period) = (
        u128::from(ceiling.limit()),
        ceiling.period().as_nanos().max(1),
    );
    let k = u128::from(ceiling.burst()).div_ceil(limit).max(1);
    let w = (k * period).div_ceil(NS).max(1);
    // A quota's units in `w` seconds, rounded down.
    let units = |q: Quota| -> u128 {
        u128::from(q.limit()).saturating_mul(w * NS) / q.period().as_nanos().max(1)
    };
    let q = units(ceiling);
    let borrow = q.saturating_sub(units(share.guaranteed()));
    let int = |n: u128| sf_int(u64::try_from(n).unwrap_or(u64::MAX));
    let mut v = Vec::new();
    sf_string(label, &mut v);
    for (name, n) in [(&b";q="[..], q), (b";w=", w), (b";borrow=", borrow)] {
        v.extend_from_slice(name);
        v.extend_from_slice(itoa::Buffer::new().format(int(n)).as_bytes());
    }
    HeaderValue::from_bytes(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// What an admitted request's response reports: its share and the decision.
#[allow(missing_debug_implementations)]
pub(crate) struct Reported {
    replies: Arc<FairReplies>,
    share: Share,
    decision: FairDecision,
}

impl Reported {
    /// Adds the share's fields to the response's headers.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        self.replies.apply(headers, &self.share, &self.decision);
    }
}

/// What a decision (or a store failure) means for `req`: proceed with its fields, or an
/// answer of the layer's own.
#[inline]
pub(crate) fn settle<B>(
    result: Result<FairDecision, StoreError>,
    replies: &Arc<FairReplies>,
    share: Share,
    on_error: OnStoreError,
    req: &Request<B>,
) -> Verdict<Reported> {
    match result {
        Ok(decision) if decision.admitted => {
            replies.count(true);
            Ok(Some(Reported {
                replies: Arc::clone(replies),
                share,
                decision,
            }))
        }
        Ok(d) => {
            replies.count(false);
            let refusal = replies.refusal(&share, &d, grpc::is_grpc(req.headers()));
            Err(Box::new(refusal))
        }
        Err(e) => failed(replies, &e, on_error, req),
    }
}

/// A failed store: logged (a warning for the first of each second), then `OnStoreError`
/// decides.
#[cold]
fn failed<B>(
    replies: &FairReplies,
    e: &StoreError,
    on_error: OnStoreError,
    req: &Request<B>,
) -> Verdict<Reported> {
    outage!(replies.failures, "tollgate", limiter = %replies.label, error = %e, "fair-share store failed");
    store_failed(on_error, &WORDING, req)
}
