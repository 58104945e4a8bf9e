//! Refusals and rate-limit header fields.
//!
//! - `429 Too Many Requests` (RFC 6585) with `Retry-After` in whole seconds rounded *up*
//!   (a 300 ms wait is `Retry-After: 1`, never `0`) and `Cache-Control: no-store`.
//! - The IETF fields of draft-ietf-httpapi-ratelimit-headers-10 on every response, one
//!   item per limit: `RateLimit-Policy: "100-per-1s";q=100;w=1` (static, formatted once when
//!   the layer is built) and `RateLimit: "100-per-1s";r=42;t=1` (`r` remaining, `t` seconds
//!   until one more unit is available, rounded up).
//! - Optionally the legacy `X-RateLimit-Limit` / `-Remaining` / `-Reset` trio read by
//!   GitHub-style clients (`Reset` is a Unix time in seconds, as GitHub sends it), about the
//!   limit with the fewest units left.
//! - A body of RFC 9457 `application/problem+json` of type `quota-exceeded` naming the
//!   `violated-policies` (the default), or a custom rejection closure.

mod body;
mod format;
mod head;

pub use body::RateLimitBody;
pub(crate) use format::{
    plain, problem_body, sf_string, shared_value, Answers, DebugRule, Extra, Fields, Pending,
    ResponseHeaders, SettleRule, NO_STORE, PROBLEM_JSON, QUOTA_EXCEEDED, RATELIMIT,
    RATELIMIT_POLICY,
};
pub use format::{refusal, retry_after_secs, Rejection};
pub use head::ResponseHead;
