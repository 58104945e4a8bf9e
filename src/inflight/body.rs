//! [`InFlightBody`]: the response body that holds its request's slot until it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::store::Permit;
use crate::core::OwnBody;
use crate::response::RateLimitBody;

pin_project! {
    /// The response body of the in-flight layer's service: the inner service's
    /// body, holding the request's slot until its last frame has been read (or it fails,
    /// or it is dropped), or the layer's own refusal. See the [module docs](super).
    pub struct InFlightBody<B> {
        #[pin]
        body: RateLimitBody<B>,
        permit: Option<Permit>,
    }
}

impl<B> InFlightBody<B> {
    pub(crate) fn inner(body: B, permit: Option<Permit>) -> Self {
        InFlightBody {
            body: RateLimitBody::inner(body),
            permit,
        }
    }
}

impl<B> OwnBody for InFlightBody<B> {
    fn own(data: Bytes) -> Self {
        InFlightBody {
            body: RateLimitBody::full(data),
            permit: None,
        }
    }
}

/// An empty body holding no slot: what a layer outside the middleware that answers by
/// itself builds (tower-http's `CorsLayer` for a preflight, its `TimeoutLayer` for a
/// timeout).
impl<B> Default for InFlightBody<B> {
    fn default() -> Self {
        InFlightBody::own(Bytes::new())
    }
}

impl<B: fmt::Debug> fmt::Debug for InFlightBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightBody")
            .field("body", &self.body)
            .field("holds_slot", &self.permit.is_some())
            .finish()
    }
}

impl<B> Body for InFlightBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        let frame = this.body.as_mut().poll_frame(cx);
        let ended = match &frame {
            Poll::Ready(None | Some(Err(_))) => true,
            Poll::Ready(Some(Ok(_))) => this.body.is_end_stream(),
            Poll::Pending => false,
        };
        if ended {
            // The response is over: its slot goes back now, not when the connection gets
            // round to dropping the body.
            *this.permit = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
