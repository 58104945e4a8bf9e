//! gRPC answers: how the HTTP layer refuses a request whose `content-type` is
//! `application/grpc` (tonic services are tower HTTP services).
//!
//! A refusal is a *trailers-only* response: HTTP 200, `content-type: application/grpc`,
//! `grpc-status`, a percent-encoded `grpc-message`, and for a rate-limit refusal
//! `grpc-status-details-bin` carrying a `google.rpc.Status` whose details hold a
//! `google.rpc.RetryInfo` with the exact retry delay, and an empty body, so the whole answer
//! is one HEADERS frame ending the stream. gRPC clients read the code and the delay from it
//! (tonic: `Status::code`, `tonic_types::StatusExt::get_details_retry_info`).
//!
//! The few protobuf messages are encoded by hand (varints and length-delimited fields) and
//! the details are base64-encoded here too, so the library needs neither prost nor a base64
//! crate; the tests decode them with tonic and tonic-types.

use std::time::Duration;

use bytes::Bytes;
use http::{header::CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
static GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");
const APPLICATION_GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

const RETRY_INFO_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The gRPC status codes the layer answers with (`google.rpc.Code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Code {
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Internal = 13,
    Unimplemented = 12,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl Code {
    /// The gRPC code that says what an HTTP status of ours says (the answer to a keyless
    /// request under `MissingKey::Reject(status)`): by meaning, since the server chose it,
    /// not by gRPC's table for a client that finds an HTTP error instead of a status.
    pub(crate) fn of(status: StatusCode) -> Code {
        match status.as_u16() {
            400 | 422 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            408 | 504 => Code::DeadlineExceeded,
            412 => Code::FailedPrecondition,
            429 => Code::ResourceExhausted,
            501 => Code::Unimplemented,
            502 | 503 => Code::Unavailable,
            500 => Code::Internal,
            s if (400..500).contains(&s) => Code::FailedPrecondition,
            _ => Code::Unknown,
        }
    }
}

/// Whether a request is a gRPC call: its `content-type` starts with `application/grpc`
/// (`application/grpc+proto`, `application/grpc-web` too), in any case.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    const PREFIX: &[u8] = b"application/grpc";
    headers.get(CONTENT_TYPE).is_some_and(|v| {
        v.as_bytes()
            .get(..PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(PREFIX))
    })
}

/// A trailers-only gRPC response with `code` and `message`, and the retry delay in
/// `grpc-status-details-bin` when there is one.
pub(crate) fn status(code: Code, message: &str, retry: Option<Duration>) -> Response<Bytes> {
    let mut r = Response::new(Bytes::new());
    let headers = r.headers_mut();
    headers.reserve(8);
    headers.insert(CONTENT_TYPE, APPLICATION_GRPC);
    headers.insert(&GRPC_STATUS, HeaderValue::from(code as u16));
    if let Ok(v) = HeaderValue::from_bytes(&percent_encode(message)) {
        headers.insert(&GRPC_MESSAGE, v);
    }
    if let Some(delay) = retry {
        let details = base64(&status_proto(code, message, delay));
        if let Ok(v) = HeaderValue::from_bytes(&details) {
            headers.insert(&GRPC_STATUS_DETAILS, v);
        }
    }
    r
}

/// `grpc-message` as gRPC requires: bytes outside printable ASCII, and `%`, as `%XX`.
fn percent_encode(message: &str) -> Vec<u8> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
    out
}

/// Standard base64 (RFC 4648 section 4) without padding, as gRPC sends binary metadata.
fn base64(bytes: &[u8]) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        // A chunk of k bytes gives k + 1 characters.
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]);
        }
    }
    out
}

/// Protobuf wire types.
const VARINT: u8 = 0;
const LEN: u8 = 2;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u8, wire: u8) {
    out.push(field << 3 | wire);
}

/// A varint field, omitted when zero (proto3's default).
fn varint_field(out: &mut Vec<u8>, field: u8, v: u64) {
    if v != 0 {
        tag(out, field, VARINT);
        varint(out, v);
    }
}

/// A length-delimited field: a string, bytes or an embedded message.
fn len_field(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
    tag(out, field, LEN);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// `google.rpc.Status { code = 1, message = 2, details = 3: [Any { type_url = 1, value = 2:
/// RetryInfo { retry_delay = 1: google.protobuf.Duration { seconds = 1, nanos = 2 } } }] }`.
fn status_proto(code: Code, message: &str, delay: Duration) -> Vec<u8> {
    let mut duration = Vec::with_capacity(16);
    varint_field(&mut duration, 1, delay.as_secs().min(i64::MAX as u64));
    varint_field(&mut duration, 2, u64::from(delay.subsec_nanos()));
    let mut retry_info = Vec::with_capacity(18);
    len_field(&mut retry_info, 1, &duration);
    let mut any = Vec::with_capacity(64);
    len_field(&mut any, 1, RETRY_INFO_URL.as_bytes());
    len_field(&mut any, 2, &retry_info);
    let mut status = Vec::with_capacity(any.len() + message.len() + 8);
    varint_field(&mut status, 1, code as u64);
    if !message.is_empty() {
        len_field(&mut status, 2, message.as_bytes());
    }
    len_field(&mut status, 3, &any);
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_without_padding() {
        let cases = [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ];
        for (raw, encoded) in cases {
            assert_eq!(base64(raw.as_bytes()), encoded.as_bytes(), "{raw:?}");
        }
        assert_eq!(base64(&[0xfb, 0xff, 0xbf]), b"+/+/");
    }

    #[test]
    fn varints() {
        let enc = |v| {
            let mut out = Vec::new();
            varint(&mut out, v);
            out
        };
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(1), [1]);
        assert_eq!(enc(127), [0x7f]);
        assert_eq!(enc(128), [0x80, 1]);
        assert_eq!(enc(300), [0xac, 2]);
        assert_eq!(enc(u64::MAX).len(), 10);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("a b%c"), b"a b%25c");
        assert_eq!(percent_encode("é\n"), b"%C3%A9%0A");
    }

    #[test]
    fn grpc_content_types() {
        let with = |ct: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
            is_grpc(&h)
        };
        assert!(with("application/grpc"));
        assert!(with("application/grpc+proto"));
        assert!(with("Application/GRPC-web"));
        assert!(!with("application/json"));
        assert!(!with("application/grp"));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn http_statuses_map_by_meaning() {
        assert_eq!(Code::of(StatusCode::BAD_REQUEST), Code::InvalidArgument);
        assert_eq!(Code::of(StatusCode::UNAUTHORIZED), Code::Unauthenticated);
        assert_eq!(Code::of(StatusCode::FORBIDDEN), Code::PermissionDenied);
        assert_eq!(
            Code::of(StatusCode::TOO_MANY_REQUESTS),
            Code::ResourceExhausted
        );
        assert_eq!(Code::of(StatusCode::SERVICE_UNAVAILABLE), Code::Unavailable);
        assert_eq!(Code::of(StatusCode::IM_A_TEAPOT), Code::FailedPrecondition);
        assert_eq!(Code::of(StatusCode::OK), Code::Unknown);
    }

    /// What a tonic client reads from the response: the code, the message, and the
    /// `RetryInfo` decoded by tonic-types, to the nanosecond.
    #[test]
    fn tonic_decodes_the_status_and_its_retry_info() {
        use tonic_types::StatusExt as _;

        for delay in [
            Duration::from_secs(1),
            Duration::from_nanos(1),
            Duration::new(86_400 * 365, 999_999_999),
            Duration::ZERO,
        ] {
            let r = status(Code::ResourceExhausted, "quota 100%: wait", Some(delay));
            assert_eq!(r.status(), 200);
            assert_eq!(r.headers()[CONTENT_TYPE], "application/grpc");
            assert!(r.body().is_empty());
            let s = tonic::Status::from_header_map(r.headers()).expect("a gRPC status");
            assert_eq!(s.code(), tonic::Code::ResourceExhausted);
            assert_eq!(s.message(), "quota 100%: wait");
            let info = s
                .get_details_retry_info()
                .expect("RetryInfo in the details");
            assert_eq!(info.retry_delay, Some(delay), "{delay:?}");
        }
        let r = status(Code::Unavailable, "store down", None);
        let s = tonic::Status::from_header_map(r.headers()).unwrap();
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert!(s.details().is_empty());
        assert!(!r.headers().contains_key(&GRPC_STATUS_DETAILS));
    }
}
