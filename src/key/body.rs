//! A key read from a field of the request body (feature `json`): [`BodyFieldLayer`] reads
//! the body of the routes it wraps, bounded in bytes, as JSON or as a form by its
//! `Content-Type`, and puts the field's value into the request as a [`BodyField`], which
//! [`BodyField::key`] extracts.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::{header::CONTENT_TYPE, HeaderMap, Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use super::KeyBytes;
use super::KeyExtractor;
use crate::{error::BoxError, response::plain};

/// The value of a request body's field, put into the request's extensions by
/// [`BodyFieldLayer`]: a JSON string as it is, a JSON number or boolean as its JSON text,
/// a form field's value decoded.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BodyField(Arc<str>);

impl BodyField {
    /// The value as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key extractor reading the value [`BodyFieldLayer`] found.
    pub fn key() -> BodyFieldKey {
        BodyFieldKey
    }
}

impl From<&str> for BodyField {
    fn from(s: &str) -> Self {
        BodyField(s.into())
    }
}

impl KeyBytes for BodyField {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.0.as_bytes());
    }
}

/// Extracts the [`BodyField`] a [`BodyFieldLayer`] found; `None` when the body had no
/// such field (or could not be read as JSON or as a form). Made by [`BodyField::key`].
#[derive(Clone, Copy, Debug, Default)]
pub struct BodyFieldKey;

impl<B> KeyExtractor<Request<B>> for BodyFieldKey {
    type Key = BodyField;

    fn extract(&self, req: &Request<B>) -> Option<BodyField> {
        req.extensions().get::<BodyField>().cloned()
    }

    fn misconfiguration(&self, req: &Request<B>) -> Option<&'static str> {
        req.extensions().get::<Seen>().is_none().then_some(
            "no BodyFieldLayer read this request's body: add it outside the rate-limit layer",
        )
    }
}

/// Marks a request whose body a [`BodyFieldLayer`] read.
#[derive(Clone, Copy, Debug)]
struct Seen;

/// Reads a field of the request body for a rate-limit key: the login form's `user`, say,
/// so that failed logins are limited per user. Put it on the routes that need it (other
/// routes' bodies are never buffered), *outside* the rate-limit layer: first in a
/// `tower::ServiceBuilder`. The handler receives the body unchanged.
///
/// What it reads:
/// - a body sent as `application/x-www-form-urlencoded` (an HTML form's post) is read as a
///   form: the field's value, percent-decoded (`+` is a space), as the URL standard
///   decodes it; a field given twice gives no key (the handler might read either);
/// - any other body is read as JSON: the top-level field of an object, a string as it is,
///   a number or a boolean as its JSON text (`null`, arrays and objects give no key).
///
/// The body is read up to [`max_bytes`](BodyFieldLayer::max_bytes) (default 16 KiB); a
/// larger body is answered `413` with a problem body. A body without the field gives no
/// key, and the rate-limit layer answers it as its
/// [`on_missing_key`](crate::key::MissingKey) says: `400` by default.
///
/// ```
/// use axum::{routing::post, Router};
/// use tollgate::{key::{BodyField, BodyFieldLayer}, RateLimitLayer};
/// use tower::ServiceBuilder;
///
/// let failed_logins = RateLimitLayer::builder()
///     .key(BodyField::key())
///     .policy("1/15min burst 5")
///     .count_when(|res| res.status() == 401)
///     .build()?;
/// let app: Router = Router::new().route(
///     "/login",
///     post(|| async { "ok" }).layer(
///         ServiceBuilder::new()
///             .layer(BodyFieldLayer::new("user")) // reads the body first: JSON or a form
///             .layer(failed_logins),
///     ),
/// );
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct BodyFieldLayer {
    field: Arc<str>,
    max_bytes: usize,
}

impl BodyFieldLayer {
    /// Reads the top-level field `field`.
    pub fn new(field: &str) -> Self {
        BodyFieldLayer {
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

impl<S> Layer<S> for BodyFieldLayer {
    type Service = BodyFieldService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BodyFieldService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of a [`BodyFieldLayer`].
#[derive(Clone, Debug)]
pub struct BodyFieldService<S> {
    inner: S,
    layer: BodyFieldLayer,
}

/// The response future of [`BodyFieldService`] (it reads the body first).
pub struct BodyFieldFuture<E> {
    inner: Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>,
}

impl<E> fmt::Debug for BodyFieldFuture<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyFieldFuture").finish_non_exhaustive()
    }
}

impl<E> Future for BodyFieldFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

/// Whether the request says its body is a form (`application/x-www-form-urlencoded`,
/// with any parameters, in any case).
fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| {
            t.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
}

/// The field's value in `body`, when it is JSON with that top-level field.
fn json_field(body: &[u8], field: &str) -> Option<BodyField> {
    let serde_json::Value::Object(map) = serde_json::from_slice(body).ok()? else {
        return None;
    };
    match map.get(field)? {
        serde_json::Value::String(s) => Some(BodyField(s.as_str().into())),
        v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_)) => {
            Some(BodyField(v.to_string().into()))
        }
        _ => None,
    }
}

/// The value of `field` in a form body, when it is there exactly once.
fn form_field(body: &[u8], field: &str) -> Option<BodyField> {
    let mut found = None;
    for pair in body.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let (name, value) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &[][..]),
        };
        if decode(name) != field.as_bytes() {
            continue;
        }
        if found.is_some() {
            return None;
        }
        found = Some(BodyField(String::from_utf8_lossy(&decode(value)).into()));
    }
    found
}

/// A form name or value decoded as the URL standard's `application/x-www-form-urlencoded`
/// parser does: `+` is a space, `%` and two hex digits a byte, any other `%` itself.
fn decode(text: &[u8]) -> Cow<'_, [u8]> {
    if !text.iter().any(|&b| b == b'+' || b == b'%') {
        return Cow::Borrowed(text);
    }
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let b = text[i];
        match b {
            b'+' => out.push(b' '),
            b'%' => match (
                text.get(i + 1).and_then(|&h| hex(h)),
                text.get(i + 2).and_then(|&l| hex(l)),
            ) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            _ => out.push(b),
        }
        i += 1;
    }
    Cow::Owned(out)
}

impl<S, ResBody> Service<Request<Body>> for BodyFieldService<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BodyFieldFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        BodyFieldFuture {
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
                let value = if is_form(&parts.headers) {
                    form_field(&bytes, &layer.field)
                } else {
                    json_field(&bytes, &layer.field)
                };
                if let Some(v) = value {
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
        let f = |b: &str| json_field(b.as_bytes(), "user").map(|v| v.as_str().to_owned());
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

    #[test]
    fn form_fields_are_decoded_as_the_url_standard_says() {
        let f = |b: &str| form_field(b.as_bytes(), "user").map(|v| v.as_str().to_owned());
        assert_eq!(f("user=alice&password=x").as_deref(), Some("alice"));
        assert_eq!(f("password=x&user=alice").as_deref(), Some("alice"));
        assert_eq!(f("user=a+b%40c.example").as_deref(), Some("a b@c.example"));
        assert_eq!(f("us%65r=alice").as_deref(), Some("alice"));
        assert_eq!(f("user=100%").as_deref(), Some("100%"));
        assert_eq!(f("user=%zz%4").as_deref(), Some("%zz%4"));
        assert_eq!(f("user=%C3%A9").as_deref(), Some("é"));
        assert_eq!(f("user=%FF").as_deref(), Some("\u{fffd}"));
        assert_eq!(f("user=&&").as_deref(), Some(""));
        assert_eq!(f("user").as_deref(), Some(""));
        assert_eq!(f("username=alice"), None);
        assert_eq!(f(r#"{"user":"alice"}"#), None);
        // Twice: the handler might read either, so neither is the key.
        assert_eq!(f("user=alice&user=bob"), None);
    }

    #[test]
    fn the_content_type_says_form_or_not() {
        let h = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, v.parse().unwrap());
            is_form(&h)
        };
        assert!(h("application/x-www-form-urlencoded"));
        assert!(h("Application/X-WWW-Form-Urlencoded; charset=UTF-8"));
        assert!(!h("application/json"));
        assert!(!h("multipart/form-data; boundary=x"));
        assert!(!is_form(&HeaderMap::new()));
    }
}
