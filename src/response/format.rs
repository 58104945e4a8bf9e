//! The rate-limit fields and the standard refusal: [`Fields`], preformatted per policy
//! when a layer is built (each limit's `RateLimit-Policy` item, the problem bodies, a
//! denied request's head), and what they make of each decision ([`ResponseHeaders`] for an
//! admitted response, the `429` for a refused one).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::HeaderMap;
use http::HeaderName;
use http::HeaderValue;
use http::Response;
use http::StatusCode;

use super::own::{quota_refusal, NO_STORE, PROBLEM_JSON};
use super::settle::Pending;
pub(crate) use super::values::problem_body;
use super::values::{
    items_value, problem_open, push_u64, refusal_values, retry_after_secs, seconds_value, sf_int,
    sf_string, shared_value, with_wait, Item,
};
use crate::algorithm::{Algorithm, Limit};
use crate::{decision::Decision, decision::Outcome, decision::MAX_LIMITS, policy::Policy};

pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

pub(crate) const QUOTA_EXCEEDED: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// The problem type of a request refused because its turn in a queue comes after its
/// caller's deadline (see the responses guide).
pub(crate) const PAST_DEADLINE: &str =
    "https://docs.rs/tollgate/latest/tollgate/response/index.html#queued-past-the-deadline";
/// Its title.
pub(crate) const PAST_DEADLINE_TITLE: &str = "Queued Past the Deadline";

/// A custom rejection: builds the refusal from the decision. The middleware still adds
/// `Retry-After` and the `RateLimit` fields when the closure did not set them.
pub(crate) type Rejection = Arc<dyn Fn(&Decision) -> Response<Bytes> + Send + Sync>;

/// The layer's choices for its responses (the same for every policy).
pub(crate) struct Answers {
    pub(crate) ietf: bool,
    pub(crate) legacy: bool,
    pub(crate) problem: bool,
    /// gRPC requests are refused with gRPC statuses.
    pub(crate) grpc: bool,
    pub(crate) rejection: Option<Rejection>,
}

impl fmt::Debug for Answers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Answers")
            .field("ietf", &self.ietf)
            .field("legacy", &self.legacy)
            .field("problem", &self.problem)
            .field("grpc", &self.grpc)
            .field("custom_rejection", &self.rejection.is_some())
            .finish()
    }
}

impl Answers {
    /// Whether admitted responses carry rate-limit fields.
    pub(crate) fn fields(&self) -> bool {
        self.ietf || self.legacy
    }
}

impl Default for Answers {
    fn default() -> Self {
        Answers {
            ietf: true,
            legacy: false,
            problem: true,
            grpc: true,
            rejection: None,
        }
    }
}

/// One policy's header values and bodies, formatted once when the policy is installed.
/// Values that depend on which limits a key is shadowed from are kept per subset of the
/// policy's limits (bit `i`: limit `i`), at most 16.
pub(crate) struct Fields {
    /// `RateLimit-Policy` for each subset of limits enforced for a key.
    policy_values: Vec<HeaderValue>,
    /// `"name";r=` of each limit.
    prefixes: Vec<Vec<u8>>,
    /// Each limit's `q` (the legacy trio's limit too).
    quotas: Vec<u64>,
    /// Problem bodies by the subset of limits that refused, without their closing brace:
    /// a refusal closes them with its wait.
    bodies: Vec<Vec<u8>>,
    exceeds_bodies: Vec<Bytes>,
    /// The problem bodies of a request refused for its deadline, by the subset of the
    /// policy's queues it waited in (those enforced for its key), opened as `bodies` are;
    /// none without a queue.
    late_bodies: Vec<(usize, Vec<u8>)>,
    /// Every limit: the mask of a key shadowed from none.
    all: usize,
    /// The head of the commonest refusal (a denied request, a problem body, the IETF
    /// fields of every limit), its `Retry-After` and `RateLimit` values left blank: one
    /// clone of it is a refusal's header map, without a name hashed.
    denied_head: HeaderMap,
}

/// What a refusal is for: a limit refused, or the request's turn in a queue comes after its
/// deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refused {
    Quota,
    Late,
}

/// What `RateLimit-Policy` advertises for a limit: `q` units per window of `w` whole
/// seconds. The window is the quota's period, or the least multiple of it whose quota
/// holds the most the limit admits at once (a burst above the rate, a queue's waiting
/// units), rounded up to whole seconds: `q` is never below a `RateLimit` item's `r`, and
/// `q / w` is the limit's rate (rounded down when the window is not a whole number of
/// periods). Both at most [`SF_MAX`](super::values::SF_MAX).
fn advertised(l: &Limit) -> (u64, u64) {
    const NS: u128 = 1_000_000_000;
    let quota = l.quota();
    let (limit, period) = (u128::from(quota.limit()), u128::from(quota.period_ns()));
    let k = u128::from(l.max_cost()).div_ceil(limit).max(1);
    let span = k * period;
    let w = span.div_ceil(NS).max(1);
    // `limit * w * NS / period`, as `k * limit` and the part of a period `w` adds (under
    // a second), so that nothing overflows.
    let q = k * limit + limit * (w * NS - span) / period;
    let int = |n: u128| sf_int(u64::try_from(n).unwrap_or(u64::MAX));
    (int(q), int(w))
}

impl fmt::Debug for Fields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fields")
            .field("policy", &self.policy_values[self.all])
            .finish_non_exhaustive()
    }
}

/// Headers to add to an admitted response, formatted in `call`. Kept small: it travels
/// inside every response future.
#[derive(Debug, Default)]
pub(crate) struct ResponseHeaders {
    rate_limit: Option<HeaderValue>,
    policy: Option<HeaderValue>,
    legacy: Option<Box<[HeaderValue; 3]>>,
    /// What few responses carry, in one box so the common case stays small.
    pub(crate) extra: Option<Box<Extra>>,
}

/// The rarer parts of [`ResponseHeaders`].
#[derive(Debug, Default)]
pub(crate) struct Extra {
    /// Headers a decision hook added, and the shadow header.
    pub(crate) headers: HeaderMap,
    /// The request's cost, to settle from the response.
    pub(crate) settle: Option<Pending>,
}

impl ResponseHeaders {
    /// How many fields [`ResponseHeaders::apply`] adds at most.
    fn len(&self) -> usize {
        usize::from(self.policy.is_some())
            + usize::from(self.rate_limit.is_some())
            + self.legacy.as_ref().map_or(0, |l| l.len())
            + self.extra.as_ref().map_or(0, |e| e.headers.len())
    }

    /// Adds the fields to a response. The IETF fields are lists: a layer adds its items
    /// beside those of other tollgate layers (an inner layer's refusal keeps its own).
    /// The legacy trio holds one limit: the one with the fewest units left wins.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Some(p) = self.policy {
            headers.append(RATELIMIT_POLICY, p);
        }
        if let Some(v) = self.rate_limit {
            headers.append(RATELIMIT, v);
        }
        if let Some(legacy) = self.legacy {
            let [limit, remaining, reset] = *legacy;
            let fewer = |v: &HeaderValue| v.to_str().ok()?.parse::<u64>().ok();
            let theirs = headers.get(X_REMAINING).and_then(fewer);
            if theirs.is_none_or(|t| fewer(&remaining).is_some_and(|ours| ours < t)) {
                headers.insert(X_LIMIT, limit);
                headers.insert(X_REMAINING, remaining);
                headers.insert(X_RESET, reset);
            }
        }
        if let Some(extra) = self.extra {
            extra.apply(headers);
        }
    }
}

impl Extra {
    /// Adds the hook's and the shadow headers.
    fn apply(self, headers: &mut HeaderMap) {
        let mut last = None;
        for (name, value) in self.headers {
            // A name comes with its first value only.
            if let Some(n) = name {
                last = Some(n);
            }
            if let Some(n) = &last {
                headers.append(n.clone(), value);
            }
        }
    }
}

impl Fields {
    pub(crate) fn new(policy: &Policy) -> Self {
        let limits = policy.limits();
        let mut items = Vec::new();
        let mut prefixes = Vec::new();
        let mut quotas = Vec::new();
        for l in limits {
            let (q, w) = advertised(l);
            quotas.push(q);
            let mut item = Vec::new();
            sf_string(l.name(), &mut item);
            item.extend_from_slice(b";q=");
            push_u64(&mut item, q);
            item.extend_from_slice(b";w=");
            push_u64(&mut item, w);
            items.push(item);
            let mut prefix = Vec::new();
            sf_string(l.name(), &mut prefix);
            prefix.extend_from_slice(b";r=");
            prefixes.push(prefix);
        }
        let names: Vec<&str> = limits.iter().map(|l| l.name()).collect();
        let subsets = 1usize << limits.len();
        let pick = |mask: usize| -> Vec<usize> {
            (0..limits.len()).filter(|i| mask & (1 << i) != 0).collect()
        };
        let violated =
            |mask: usize| -> Vec<&str> { pick(mask).into_iter().map(|i| names[i]).collect() };
        let policy_values: Vec<HeaderValue> = (0..subsets)
            .map(|mask| {
                let mut v = Vec::new();
                for (n, i) in pick(mask).into_iter().enumerate() {
                    if n > 0 {
                        v.extend_from_slice(b", ");
                    }
                    v.extend_from_slice(&items[i]);
                }
                shared_value(v)
            })
            .collect();
        let open = |detail: &str, mask: usize| {
            problem_open(
                429,
                "Too Many Requests",
                detail,
                &violated(mask),
                Some(QUOTA_EXCEEDED),
            )
        };
        let queues = limits
            .iter()
            .enumerate()
            .filter(|(_, l)| matches!(l.algorithm(), Algorithm::LeakyQueue { .. }))
            .fold(0usize, |m, (i, _)| m | (1 << i));
        Fields {
            denied_head: denied_head(&policy_values[subsets - 1]),
            policy_values,
            prefixes,
            quotas,
            bodies: (0..subsets)
                .map(|mask| {
                    open(
                        "Request quota exceeded; retry after the number of seconds in Retry-After.",
                        mask,
                    )
                })
                .collect(),
            exceeds_bodies: (0..subsets)
                .map(|mask| {
                    let mut body = open(
                        "This request costs more than the quota can ever admit at once; retrying will not help.",
                        mask,
                    );
                    body.push(b'}');
                    Bytes::from(body)
                })
                .collect(),
            late_bodies: (1..subsets)
                .filter(|mask| mask & !queues == 0)
                .map(|mask| {
                    let body = problem_open(
                        429,
                        PAST_DEADLINE_TITLE,
                        "This request's turn in the queue comes after its deadline; retry after the number of seconds in Retry-After.",
                        &violated(mask),
                        Some(PAST_DEADLINE),
                    );
                    (mask, body)
                })
                .collect(),
            all: subsets - 1,
        }
    }

    /// The `RateLimit` field value for a decision, over the limits in `mask`: its numbers
    /// formatted first, then the value written into one allocation of its length.
    pub(crate) fn rate_limit_value(&self, d: &Decision, mask: usize) -> HeaderValue {
        self.rate_limit_items(d, mask, items_value)
    }

    /// The `RateLimit` items of a decision over the limits in `mask`, formatted, and their
    /// length as one value (separators included), handed to `f`.
    #[inline]
    fn rate_limit_items<R>(
        &self,
        d: &Decision,
        mask: usize,
        f: impl FnOnce(&[Item<'_>], usize) -> R,
    ) -> R {
        let mut numbers = [[itoa::Buffer::new(); 2]; MAX_LIMITS];
        let mut items = [const { Item(&[], "", "") }; MAX_LIMITS];
        let (mut n, mut len) = (0, 0);
        for ((i, l), [r, t]) in d.limits().iter().enumerate().zip(&mut numbers) {
            if mask & (1 << i) == 0 {
                continue;
            }
            let item = Item(
                &self.prefixes[i.min(self.prefixes.len() - 1)],
                r.format(sf_int(l.remaining())),
                t.format(sf_int(retry_after_secs(l.next_after()))),
            );
            len += usize::from(n > 0) * 2 + item.len();
            items[n] = item;
            n += 1;
        }
        f(&items[..n], len)
    }

    /// The limits a decision reports on: all but those in shadow for the key (a client is
    /// not told of limits it is not held to).
    #[inline]
    fn mask(&self, shadow: u8) -> usize {
        self.all & !usize::from(shadow)
    }

    /// Headers for a response to a request with this decision.
    #[inline]
    pub(crate) fn headers(&self, a: &Answers, d: &Decision, shadow: u8) -> ResponseHeaders {
        let mut h = ResponseHeaders::default();
        let mask = self.mask(shadow);
        if a.ietf && mask != 0 {
            h.policy = Some(self.policy_values[mask].clone());
            h.rate_limit = Some(self.rate_limit_value(d, mask));
        }
        if a.legacy {
            // The limit with the fewest units left binds.
            let enforced = d.limits().iter().filter(|l| mask & (1 << l.index()) != 0);
            if let Some(l) = enforced.min_by_key(|l| l.remaining()) {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                let reset = now.as_secs() + retry_after_secs(l.reset_after());
                // The limit's `q`: `RateLimit-Policy`'s, never below `remaining`.
                let q = self.quotas.get(l.index()).copied().unwrap_or(0);
                h.legacy = Some(Box::new([
                    HeaderValue::from(q),
                    HeaderValue::from(l.remaining()),
                    HeaderValue::from(reset),
                ]));
            }
        }
        h
    }

    /// The shadow header's value: the would-be refusal's `RateLimit` items.
    pub(crate) fn shadow_value(&self, d: &Decision) -> HeaderValue {
        let violated = d.violated().fold(0usize, |m, l| m | (1 << l.index()));
        self.rate_limit_value(d, violated)
    }

    /// The refusal for a denied or exceeding decision.
    pub(crate) fn refusal(&self, a: &Answers, d: &Decision, shadow: u8) -> Response<Bytes> {
        self.refusal_for(a, d, shadow, Refused::Quota)
    }

    /// The refusal of a request whose turn in a queue comes after its deadline (`d`:
    /// denied, retry after its turn, the queues violated).
    pub(crate) fn late_refusal(&self, a: &Answers, d: &Decision, shadow: u8) -> Response<Bytes> {
        self.refusal_for(a, d, shadow, Refused::Late)
    }

    fn refusal_for(&self, a: &Answers, d: &Decision, shadow: u8, why: Refused) -> Response<Bytes> {
        let Some(rejection) = &a.rejection else {
            return self.standard_refusal(a, d, shadow, why);
        };
        // The user's response, completed: their fields are kept unless ours say more.
        let mut response = rejection(d);
        let headers = response.headers_mut();
        if !headers.contains_key(CACHE_CONTROL) {
            headers.insert(CACHE_CONTROL, NO_STORE);
        }
        if let Some(wait) = d.retry_after() {
            // The longest wait wins over one the rejection closure set.
            let secs = retry_after_secs(wait);
            let theirs = headers
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if theirs.is_none_or(|t| t < secs) {
                headers.insert(RETRY_AFTER, seconds_value(secs));
            }
        }
        if !headers.contains_key(RATELIMIT) {
            self.headers(a, d, shadow).apply(headers);
        }
        response
    }

    /// The refusal without a rejection closure: a fresh response, so every field is
    /// inserted without looking for one already there. A denial's problem body ends with
    /// its wait.
    fn standard_refusal(
        &self,
        a: &Answers,
        d: &Decision,
        shadow: u8,
        why: Refused,
    ) -> Response<Bytes> {
        let mask = d.violated().fold(0usize, |m, l| m | (1 << l.index()));
        let Outcome::Denied { retry_after } = d.outcome() else {
            let body = a
                .problem
                .then(|| self.exceeds_bodies[mask.min(self.exceeds_bodies.len() - 1)].clone());
            return self.quota_refusal(a, d, shadow, body, None);
        };
        let late = (why == Refused::Late)
            .then(|| self.late_bodies.iter().find(|(m, _)| *m == mask))
            .flatten();
        let open = a.problem.then(|| match late {
            Some((_, body)) => &body[..],
            None => &self.bodies[mask.min(self.bodies.len() - 1)][..],
        });
        match open {
            Some(open) if a.ietf && !a.legacy && self.mask(shadow) == self.all => {
                self.denied(d, open, retry_after)
            }
            open => {
                let body = open.map(|o| with_wait(o, retry_after));
                self.quota_refusal(a, d, shadow, body, None)
            }
        }
    }

    /// The commonest refusal, from its preformatted head: the same response as
    /// [`Fields::quota_refusal`] gives it, its three values per request (`RateLimit`,
    /// `Retry-After`, the problem body) written together.
    fn denied(&self, d: &Decision, open: &[u8], wait: Duration) -> Response<Bytes> {
        let (rate_limit, retry_after, body) = self.rate_limit_items(d, self.all, |items, len| {
            refusal_values(items, len, wait, Some(open))
        });
        let mut r = Response::new(body.unwrap_or_default());
        *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        let h = r.headers_mut();
        // `Response::new`'s map is `HeaderMap::new()`, which owns no allocation: it is
        // forgotten rather than dropped, which would walk its empty parts.
        std::mem::forget(std::mem::replace(h, self.denied_head.clone()));
        // Filled by position (see `denied_head`): no name hashed or compared.
        let mut values = h.values_mut();
        if let Some(blank) = values.nth(RETRY_AFTER_AT) {
            *blank = retry_after;
        }
        if let Some(blank) = values.nth(RATELIMIT_AT - RETRY_AFTER_AT - 1) {
            *blank = rate_limit;
        }
        r
    }

    /// The refusal of a gRPC request: `RESOURCE_EXHAUSTED` with the exact retry delay in
    /// a `RetryInfo` (none when the cost can never be admitted), and the same
    /// `Retry-After` and rate-limit fields as an HTTP refusal, harmless as gRPC metadata.
    pub(crate) fn grpc_refusal(&self, a: &Answers, d: &Decision, shadow: u8) -> Response<Bytes> {
        let message = match d.outcome() {
            Outcome::Exceeds => {
                "This request costs more than the quota can ever admit at once; retrying will not help."
            }
            _ => "Request quota exceeded; retry after the delay in RetryInfo.",
        };
        self.quota_refusal(a, d, shadow, None, Some(message))
    }

    /// [`Fields::grpc_refusal`] for a request whose turn in a queue comes after its
    /// deadline.
    pub(crate) fn late_grpc_refusal(
        &self,
        a: &Answers,
        d: &Decision,
        shadow: u8,
    ) -> Response<Bytes> {
        let message = "This request's turn in the queue comes after its deadline; retry after the delay in RetryInfo.";
        self.quota_refusal(a, d, shadow, None, Some(message))
    }

    /// [`quota_refusal`] for a decision, with the decision's rate-limit fields.
    #[inline]
    fn quota_refusal(
        &self,
        a: &Answers,
        d: &Decision,
        shadow: u8,
        body: Option<Bytes>,
        grpc_message: Option<&str>,
    ) -> Response<Bytes> {
        let fields = self.headers(a, d, shadow);
        let mut r = quota_refusal(body, grpc_message, d.retry_after(), fields.len());
        fields.apply(r.headers_mut());
        r
    }
}

/// Where the blank `Retry-After` and `RateLimit` values of [`denied_head`] are, in the
/// order of its values.
const RETRY_AFTER_AT: usize = 2;
const RATELIMIT_AT: usize = 4;

/// The head of a denied request's standard refusal, as [`quota_refusal`] and
/// [`ResponseHeaders::apply`] write it (in that order), with `policy` as its
/// `RateLimit-Policy` and blank `Retry-After` and `RateLimit` values at
/// [`RETRY_AFTER_AT`] and [`RATELIMIT_AT`] (a map keeps its entries in the order they
/// were inserted).
fn denied_head(policy: &HeaderValue) -> HeaderMap {
    let blank = HeaderValue::from_static("");
    let mut h = HeaderMap::with_capacity(5);
    h.insert(CONTENT_TYPE, PROBLEM_JSON);
    h.insert(CACHE_CONTROL, NO_STORE);
    h.insert(RETRY_AFTER, blank.clone());
    h.append(RATELIMIT_POLICY, policy.clone());
    h.append(RATELIMIT, blank);
    debug_assert!(h.keys().nth(RETRY_AFTER_AT) == Some(&RETRY_AFTER));
    debug_assert!(h.keys().nth(RATELIMIT_AT) == Some(&RATELIMIT));
    h
}

/// The standard refusal for `decision` under `policy`, as the HTTP layer answers it with
/// its default settings: `429 Too Many Requests`, `Retry-After` rounded up, the IETF
/// `RateLimit-Policy` / `RateLimit` fields, `Cache-Control: no-store` and a problem body
/// of type `quota-exceeded` naming the violated limits. For handlers that decide by hand
/// (with [`MemoryStore::check`](crate::store::MemoryStore::check), say).
///
/// ```
/// use tollgate::{response, store::MemoryStore, Limit, Policy, Quota};
///
/// let policy = Policy::new(Limit::token_bucket(Quota::per_minute(1)?)?.named("login")?);
/// let store = MemoryStore::new(policy.clone());
/// assert!(store.check(&"alice", 1).is_allowed());
/// let refused = store.check(&"alice", 1);
/// let r = response::refusal(&refused, &policy);
/// assert_eq!(r.status(), 429);
/// assert_eq!(r.headers()["retry-after"], "60");
/// assert_eq!(r.headers()["ratelimit"], "\"login\";r=0;t=60");
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub fn refusal(decision: &Decision, policy: &Policy) -> Response<Bytes> {
    Fields::new(policy).refusal(&Answers::default(), decision, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::response::values::{prefixed_value, rate_limit_item, SF_MAX};

    #[test]
    fn values_are_written_exactly() {
        for (r, t) in [(0, 0), (9, 10), (10, 99), (SF_MAX, SF_MAX)] {
            let v = rate_limit_item(b"\"default\";r=", r, t);
            assert_eq!(v.as_bytes(), format!("\"default\";r={r};t={t}").as_bytes());
        }
        // Past RFC 9651's 15 digits: the largest integer a structured field carries.
        let v = rate_limit_item(b"\"default\";r=", u64::MAX, SF_MAX + 1);
        assert_eq!(v, "\"default\";r=999999999999999;t=999999999999999");
        assert_eq!(prefixed_value(b"x=", 1000).as_bytes(), b"x=1000");
    }

    #[test]
    fn seconds_values_are_exact() {
        for n in (0..=150).chain([1_000, u64::MAX]) {
            assert_eq!(seconds_value(n).to_str().unwrap(), n.to_string());
        }
    }

    /// The commonest refusal, written from its preformatted head, is the response the
    /// general path writes: the same status, fields in the same order, the same body.
    #[test]
    fn denied_refusals_are_the_general_ones() {
        use crate::{algorithm::Limit, quota::Quota};
        let long = "a-policy-name-long-enough-that-its-items-do-not-fit-together";
        for (limit, name) in [
            (Limit::token_bucket(Quota::per_minute(1).unwrap()), "m"),
            (Limit::token_bucket(Quota::per_hour(1).unwrap()), "h"),
            (Limit::token_bucket(Quota::per_day(2).unwrap()), long),
        ] {
            let policy = Policy::new(limit.unwrap().named(name).unwrap());
            let mut state = [0u64; 16];
            while policy.decide(&mut state, 0, 1).is_allowed() {}
            let d = policy.decide(&mut state, 0, 1);
            let fields = Fields::new(&policy);
            let a = Answers::default();
            let fast = fields.refusal(&a, &d, 0);
            let body = with_wait(&fields.bodies[1], d.retry_after().unwrap());
            let general = fields.quota_refusal(&a, &d, 0, Some(body), None);
            assert_eq!(fast.status(), general.status());
            let pairs = |r: &Response<Bytes>| -> Vec<(String, String)> {
                r.headers()
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
                    .collect()
            };
            assert_eq!(pairs(&fast), pairs(&general), "{name}");
            assert_eq!(fast.body(), general.body());
        }
    }

    /// A thread repeats the values it wrote last only when they are the same values.
    #[test]
    fn repeated_values_are_the_values() {
        let value = |r: &str, t: &str, ms: u64, open: Option<&[u8]>| {
            let item = Item(b"\"m\";r=", r, t);
            let len = item.len();
            let wait = Duration::from_millis(ms);
            let (rate_limit, retry_after, body) = refusal_values(&[item], len, wait, open);
            let text = |v: HeaderValue| v.to_str().unwrap().to_owned();
            let body = body.map(|b| String::from_utf8(b.to_vec()).unwrap());
            (text(rate_limit), text(retry_after), body)
        };
        let open: &[u8] = b"{\"status\":429";
        let long = vec![b'x'; 600];
        for (r, t, ms, open) in [
            ("0", "60", 59_001, Some(open)),
            ("0", "60", 59_001, Some(open)),
            ("0", "60", 59_002, Some(open)),
            ("0", "60", 59_002, None),
            ("0", "6", 59_002, None),
            ("0", "60", 5_002, Some(open)),
            ("1", "60", 59_002, Some(open)),
            ("0", "3600", 3_599_999, Some(open)),
            ("0", "3600", 3_599_999, Some(&long[..])),
            ("0", "3600", 3_599_999, Some(open)),
            ("0", "360", 3_599_999, Some(open)),
        ] {
            let secs = u64::div_ceil(ms, 1000);
            let body =
                open.map(|o| format!("{},\"retry_after_ms\":{ms}}}", String::from_utf8_lossy(o)));
            let expected = (format!("\"m\";r={r};t={t}"), secs.to_string(), body);
            assert_eq!(value(r, t, ms, open), expected);
        }
    }

    /// What `RateLimit-Policy` advertises: the quota's rate over the window that holds the
    /// most the limit admits at once, so that `q` is never below `r`.
    #[test]
    fn advertised_quotas_hold_the_burst() {
        use crate::{algorithm::Limit, quota::Quota};
        let q = |text: &str| {
            let p: Policy = text.parse().unwrap();
            advertised(&p.limits()[0])
        };
        assert_eq!(q("5/s"), (5, 1));
        assert_eq!(q("5/s burst 10"), (10, 2));
        assert_eq!(q("5/s burst 7"), (10, 2));
        assert_eq!(q("100/min burst 200"), (200, 120));
        assert_eq!(q("10/s meter"), (10, 1));
        assert_eq!(q("queue 1/s 3"), (4, 4));
        assert_eq!(q("queue 10/s 50 nodelay 5"), (60, 6));
        assert_eq!(q("1000/day window"), (1000, 86_400));
        assert_eq!(q("7/min sliding"), (7, 60));
        // A sub-second period: the rate over one second.
        let fast = Limit::token_bucket(Quota::new(10, Duration::from_millis(100)).unwrap());
        assert_eq!(advertised(&fast.unwrap()), (100, 1));
        // A period of no whole seconds: the rate rounded down over the window.
        let odd = Limit::token_bucket(Quota::new(3, Duration::from_millis(1500)).unwrap());
        assert_eq!(advertised(&odd.unwrap()), (4, 2));
        // Past RFC 9651's 15 digits: the largest integer a client can read.
        let huge = Limit::token_bucket(
            Quota::per_second(1_000_000_000)
                .unwrap()
                .with_burst(5_000_000_000_000_000)
                .unwrap(),
        );
        assert_eq!(advertised(&huge.unwrap()), (SF_MAX, 5_000_000));
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::ZERO), 0);
        assert_eq!(retry_after_secs(Duration::from_nanos(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(999)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
    }
}
