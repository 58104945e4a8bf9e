#![doc = include_str!("../docs/responses.md")]

mod body;
mod format;
pub(crate) mod grpc;
mod head;

pub use body::RateLimitBody;
#[cfg(feature = "json")]
pub(crate) use format::plain;
pub(crate) use format::{
    own_answer, prefixed_value, problem_body, quota_refusal, rate_limit_item, sf_string,
    shared_value, Answers, Extra, Fields, Pending, ResponseHeaders, SettleRule, QUOTA_EXCEEDED,
    RATELIMIT, RATELIMIT_POLICY,
};
pub use format::{refusal, retry_after_secs, Rejection};
pub use head::ResponseHead;
