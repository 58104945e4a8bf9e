//! A key read from a field of a JSON request body (feature `json`): [`JsonFieldLayer`]
//! reads the body of the routes it wraps, bounded in bytes, and puts the field's value
//! into the request as a [`JsonField`], which [`JsonField::key`] extracts.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use super::KeyExtractor;
use crate::{error::BoxError, response::plain, store::KeyBytes};

/// The value of a JSON body's field, put into the request's extensions by
/// [`JsonFieldLayer`]: a string as it is, a number or a boolean as its JSON text.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JsonField(Arc<str>);

impl JsonField {
    /// The value as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key extractor reading the value [`JsonFieldLayer`] found.
    pub fn key() -> JsonFieldKey {
        JsonFieldKey
    }
}

impl From<&str> for JsonField {
    fn from(s: &str) -> Self {
        JsonField(s.into())
    }
}

impl KeyBytes for JsonField {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.0.as_bytes());
    }
}

/// Extracts the [`JsonField`] a [`JsonFieldLayer`] found; `None` when the body had no such
/// field (or was not JSON). Made by [`JsonField::key`].
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonFieldKey;

impl<B> KeyExtractor<Request<B>> for JsonFieldKey {
    type Key = JsonField;

    fn extract(&self, req: &Request<B>) -> Option<JsonField> {
        req.extensions().get::<JsonField>().cloned()
    }

    fn misconfiguration(&self, req: &Request<B>) -> Option<&'static str> {
        req.extensions().get::<Seen>().is_none().then_some(
            "no JsonFieldLayer read this request's body: add it outside the rate-limit layer",
        )
    }
}

/// Marks a request whose body a [`JsonFieldLayer`] read.
#[derive(Clone, Copy, Debug)]
struct Seen;

/// Reads a JSON request body's field for a rate-limit key: the login form's `user`, say,
/// so that failed logins are limited per user. Put it on the routes that need it (other
/// routes' bodies are never buffered), *outside* the rate-limit layer: first in a
/// `tower::ServiceBuilder`. The body is read up to
/// [`max_bytes`](JsonFieldLayer::max_bytes) (default 16 KiB); a larger body is answered
/// `413` with a problem body. The handler receives the body unchanged.
///
/// ```
/// use axum::{routing::post, Router};
/// use tollgate::{key::{JsonField, JsonFieldLayer}, RateLimitLayer};
/// use tower::ServiceBuilder;
///
/// let failed_logins = RateLimitLayer::builder()
///     .key(JsonField::key())
///     .policy("1/15min burst 5")
///     .count_when(|res| res.status() == 401)
///     .build()?;
/// let app: Router = Router::new().route(
///     "/login",
///     post(|| async { "ok" }).layer(
///         ServiceBuilder::new()
///             .layer(JsonFieldLayer::new("user")) // reads the body first
///             .layer(failed_logins),
///     ),
/// );
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct JsonFieldLayer {
    field: Arc<str>,
    max_bytes: usize,
}

impl JsonFieldLayer {
    /// Reads the top-level field `field`.
    pub fn new(field: &str) -> Self {
        JsonFieldLayer {
            field: field.into(),
            max_bytes: 16 * 1024,
        }
    }

    /// The largest body read (default 16 KiB).
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }
}

impl<S> Layer<S> for JsonFieldLayer {
    type Service = JsonFieldService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        JsonFieldService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of a [`JsonFieldLayer`].
#[derive(Clone, Debug)]
pub struct JsonFieldService<S> {
    inner: S,
    layer: JsonFieldLayer,
}

/// The response future of [`JsonFieldService`] (it reads the body first).
pub struct JsonFieldFuture<E> {
    inner: Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>,
}

impl<E> fmt::Debug for JsonFieldFuture<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonFieldFuture").finish_non_exhaustive()
    }
}

impl<E> Future for JsonFieldFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

/// The field's value in `body`, when it is JSON with that top-level field.
fn field_of(body: &[u8], field: &str) -> Option<JsonField> {
    let serde_json::Value::Object(map) = serde_json::from_slice(body).ok()? else {
        return None;
    };
    match map.get(field)? {
        serde_json::Value::String(s) => Some(JsonField(s.as_str().into())),
        v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_)) => {
            Some(JsonField(v.to_string().into()))
        }
        _ => None,
    }
}

impl<S, ResBody> Service<Request<Body>> for JsonFieldService<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = JsonFieldFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        JsonFieldFuture {
            inner: Box::pin(async move {
                let (mut parts, body) = req.into_parts();
                let bytes = match axum::body::to_bytes(body, layer.max_bytes).await {
                    Ok(b) => b,
                    Err(_) => {
                        let r = plain(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            "The request body is larger than the rate limiter reads.",
                        );
                        return Ok(r.map(Body::from));
                    }
                };
                parts.extensions.insert(Seen);
                if let Some(v) = field_of(&bytes, &layer.field) {
                    parts.extensions.insert(v);
                }
                let req = Request::from_parts(parts, Body::from(bytes));
                inner.call(req).await.map(|r| r.map(Body::new))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_from_json_objects_only() {
        let f = |b: &str| field_of(b.as_bytes(), "user").map(|v| v.as_str().to_owned());
        assert_eq!(
            f(r#"{"user":"alice","password":"x"}"#).as_deref(),
            Some("alice")
        );
        assert_eq!(f(r#"{"user":42}"#).as_deref(), Some("42"));
        assert_eq!(f(r#"{"user":null}"#), None);
        assert_eq!(f(r#"{"name":"alice"}"#), None);
        assert_eq!(f(r#"["user"]"#), None);
        assert_eq!(f("user=alice"), None);
    }
}
