#![doc = include_str!("../docs/responses.md")]

mod body;
mod format;
pub(crate) mod grpc;
mod head;
mod settle;
mod values;

pub use body::RateLimitBody;
#[cfg(feature = "json")]
pub(crate) use format::plain;
pub use format::refusal;
pub(crate) use format::{
    own_answer, problem_body, quota_refusal, Answers, Extra, Fields, Rejection, ResponseHeaders,
    QUOTA_EXCEEDED, RATELIMIT, RATELIMIT_POLICY,
};
pub use head::ResponseHead;
pub(crate) use settle::{Pending, SettleRule};
pub(crate) use values::{
    prefixed_value, rate_limit_item, retry_after_secs, sf_string, shared_value,
};
