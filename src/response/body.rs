use std::{
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The response body of every tollgate layer: the inner service's body, or the layer's
    /// own (a refusal). Under an in-flight limit it holds its request's slot until its last
    /// frame has been read (or it fails, or it is dropped). See the [crate docs](crate).
    pub struct RateLimitBody<B> {
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

impl<B: Body> Kind<B> {
    fn ended(&self) -> bool {
        match self {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }
}

impl<B> RateLimitBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        RateLimitBody {
            kind: Kind::Inner { body },
            permit: None,
        }
    }

    /// The inner service's body, holding `permit` until it ends.
    pub(crate) fn holding(body: B, permit: Option<Permit>) -> Self {
        RateLimitBody {
            kind: Kind::Inner { body },
            permit,
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        RateLimitBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            permit: None,
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let holds_slot = self.permit.is_some();
        match &self.kind {
            Kind::Inner { body } => f
                .debug_struct("RateLimitBody::Inner")
                .field("body", body)
                .field("holds_slot", &holds_slot)
                .finish(),
            Kind::Full { data } => f.debug_tuple("RateLimitBody::Full").field(data).finish(),
        }
    }
}

impl<B> Body for RateLimitBody<B>
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
        let mut kind = this.kind;
        let frame = match kind.as_mut().project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        };
        if this.permit.is_some() {
            let ended = match &frame {
                Poll::Ready(None | Some(Err(_))) => true,
                Poll::Ready(Some(Ok(_))) => kind.ended(),
                Poll::Pending => false,
            };
            if ended {
                // The response is over: its slot goes back now, not when the connection
                // gets round to dropping the body.
                *this.permit = None;
            }
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.kind.ended()
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

/// Gives a slot back when dropped.
pub(crate) trait Release: Send + Sync + 'static {
    fn release(&self, slot: u64);
}

/// A slot an in-flight limit holds for one request, from its admission until its response body ends or is
/// dropped: dropping the permit gives the slot back. No allocation: a shared pointer to
/// the store's state and the slot's index in it.
pub struct Permit {
    owner: Arc<dyn Release>,
    slot: u64,
}

impl Permit {
    pub(crate) fn new(owner: Arc<dyn Release>, slot: u64) -> Self {
        Permit { owner, slot }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.owner.release(self.slot);
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit").field("slot", &self.slot).finish()
    }
}
