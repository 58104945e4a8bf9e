//! What the HTTP layer's answer makes of the inner service's response: the fields added,
//! and a cost settled from the response when the layer counts that way.

use http::Response;

use crate::core::finish::Finish;
use crate::response::{RateLimitBody, ResponseHead, ResponseHeaders};

impl Finish for ResponseHeaders {
    type Body<B> = RateLimitBody<B>;

    #[inline]
    fn finish<B>(response: Response<B>, extra: Option<Self>) -> Response<RateLimitBody<B>> {
        let mut response = response.map(RateLimitBody::inner);
        if let Some(mut h) = extra {
            if let Some(pending) = h.extra.as_mut().and_then(|x| x.settle.take()) {
                pending.settle(&ResponseHead::of(&response));
            }
            h.apply(response.headers_mut());
        }
        response
    }
}
