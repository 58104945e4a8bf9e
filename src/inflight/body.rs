//! [`InFlightBody`]: the response body that holds its request's slot until it ends.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::store::Permit;

pin_project! {
    /// The response body of [`InFlightLimit`](super::InFlightLimit): the inner service's
    /// body, holding the request's slot until its last frame has been read (or it fails,
    /// or it is dropped), or the layer's own refusal. See the [module docs](super).
    pub struct InFlightBody<B> {
        #[pin]
        kind: Kind<B>,
        permit: Option<Permit>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> InFlightBody<B> {
    pub(crate) fn inner(body: B, permit: Option<Permit>) -> Self {
        InFlightBody {
            kind: Kind::Inner { body },
            permit,
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        InFlightBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            permit: None,
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for InFlightBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = match &self.kind {
            Kind::Inner { .. } => f.debug_struct("InFlightBody::Inner"),
            Kind::Full { .. } => f.debug_struct("InFlightBody::Full"),
        };
        if let Kind::Inner { body } = &self.kind {
            d.field("body", body);
        }
        d.field("holds_slot", &self.permit.is_some()).finish()
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
        let this = self.project();
        match this.kind.project() {
            KindProj::Inner { mut body } => {
                let frame = body.as_mut().poll_frame(cx);
                let ended = match &frame {
                    Poll::Ready(None | Some(Err(_))) => true,
                    Poll::Ready(Some(Ok(_))) => body.is_end_stream(),
                    Poll::Pending => false,
                };
                if ended {
                    // The response is over: its slot goes back now, not when the
                    // connection gets round to dropping the body.
                    *this.permit = None;
                }
                frame
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
