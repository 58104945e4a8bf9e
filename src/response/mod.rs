#![doc = include_str!("../docs/responses.md")]

mod body;
mod format;
pub(crate) mod grpc;
mod head;
mod own;
mod settle;
mod values;

pub use body::RateLimitBody;
pub(crate) use format::problem_body;
pub use format::refusal;
pub(crate) use format::Answers;
pub(crate) use format::Extra;
pub(crate) use format::Fields;
pub(crate) use format::Rejection;
pub(crate) use format::ResponseHeaders;
pub(crate) use format::RATELIMIT;
pub(crate) use format::RATELIMIT_POLICY;
pub(crate) use format::{PAST_DEADLINE, PAST_DEADLINE_TITLE, QUOTA_EXCEEDED};
pub use head::ResponseHead;
pub(crate) use own::own_answer;
#[cfg(feature = "json")]
pub(crate) use own::plain;
pub(crate) use own::quota_refusal;

/// An answer of a layer's own (a refusal, a keyless request rejected, a failed store),
/// boxed: the response futures stay small on the path that calls the inner service.
pub(crate) type OwnAnswer = Box<http::Response<bytes::Bytes>>;
/// The HTTP rate limit's own answer (a refusal, most often), unboxed: a refusal is that
/// layer's hot path under a flood, and a box would cost it an allocation, its free and a
/// copy.
pub(crate) type OwnResponse = http::Response<bytes::Bytes>;
pub(crate) use settle::{Pending, SettleRule, Settlement};
pub(crate) use values::ms_up;
pub(crate) use values::prefixed_value;
pub(crate) use values::rate_limit_item;
pub(crate) use values::retry_after_secs;
pub(crate) use values::sf_string;
pub(crate) use values::shared_value;
pub(crate) use values::{problem_open, sf_int, with_wait};
