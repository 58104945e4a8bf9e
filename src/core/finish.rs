//! What an HTTP layer's response future yields: the inner service's response with the
//! layer's fields (and, for the in-flight layer, its slot) added, or the layer's own
//! answer. One poll serves the HTTP rate-limit, in-flight and fair-sharing layers.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use super::machine::{Decide, Machine};
use crate::response::{OwnAnswer, OwnResponse, RateLimitBody};

/// What an admitted request's response gets from its layer: `Self` is what the decision
/// left for the response (its fields, a slot), `Body` the body the layer answers with.
pub(crate) trait Finish: Sized {
    /// The response body of the layer's service, wrapping the inner service's `B`.
    type Body<B>: OwnBody;

    /// The inner service's response, given what the decision left for it (`None`: the
    /// request went through unlimited).
    fn finish<B>(response: Response<B>, extra: Option<Self>) -> Response<Self::Body<B>>;
}

/// A body that can carry a layer's own answer.
pub(crate) trait OwnBody {
    /// The body of an answer of the layer's own.
    fn own(data: Bytes) -> Self;
}

impl<B> OwnBody for RateLimitBody<B> {
    fn own(data: Bytes) -> Self {
        RateLimitBody::full(data)
    }
}

/// A layer's own answer as a future holds it: boxed ([`OwnAnswer`]: the layers whose
/// futures must stay small) or not ([`OwnResponse`]: the HTTP rate limit's, whose
/// refusals would otherwise pay the box's allocation and free).
pub(crate) trait Answer {
    /// The response.
    fn response(self) -> Response<Bytes>;
}

impl Answer for OwnAnswer {
    #[inline]
    fn response(self) -> Response<Bytes> {
        *self
    }
}

impl Answer for OwnResponse {
    #[inline]
    fn response(self) -> Response<Bytes> {
        self
    }
}

/// Polls an HTTP layer's machine to its response: the inner service's, with what the
/// decision left for it added ([`Finish`]), or the layer's own answer. Each HTTP layer's
/// response future is this.
#[inline]
#[allow(clippy::type_complexity)] // the machine's parameters, each a layer's choice
pub(crate) fn poll_http<S, B, ResBody, O, H, D>(
    machine: Pin<&mut Machine<S, Request<B>, S::Future, O, H, D>>,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<H::Body<ResBody>>, S::Error>>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    O: Answer,
    H: Finish,
    D: Decide<Request<B>, O, H>,
{
    machine.poll_machine(
        cx,
        |result, extra| Ok(H::finish(result?, extra)),
        |answer| Ok(answer.response().map(OwnBody::own)),
    )
}
