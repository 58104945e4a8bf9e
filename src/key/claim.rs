//! [`BearerClaim`]: a claim of the bearer JWT (feature `jwt`).

use std::{fmt, sync::Arc};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use http::{header::AUTHORIZATION, Request};
use serde_json::Value;

use super::KeyExtractor;

/// The longest `Authorization` header value read, in bytes.
const MAX_TOKEN_LEN: usize = 8 * 1024;

type Verify = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Keys requests by a claim of the JWT in `Authorization: Bearer <token>`, such as `sub`
/// or a tenant id.
///
/// # The signature is not checked
///
/// **This extractor only decodes the token's payload; it does not verify the signature.**
/// Anyone can write a JWT with any claims, so on its own this extractor lets a client pick
/// its own key and escape its limit (or spend someone else's). Use it only:
///
/// - behind a layer that verifies the token and rejects the request when it is invalid
///   (the rate-limit layer added inside the auth layer), or
/// - with [`verify_with`](BearerClaim::verify_with), which is consulted first: a token it
///   refuses gives no key.
///
/// Prefer [`ExtensionKey`](super::ExtensionKey) when the auth layer already puts the
/// verified claims in the request extensions: it costs no second decode.
///
/// # Key
///
/// A `String`: a string claim as is, an integer claim as its decimal digits. The key is
/// `None` when the header is missing, not `Bearer` (case-insensitive), longer than 8 KiB,
/// not a three-part JWS compact token, when the payload is not unpadded base64url JSON
/// object, or when the claim is missing, empty or of another type.
///
/// See the [module docs](super) for the other extractors.
///
/// ```
/// use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
/// use tollgate::key::{BearerClaim, KeyExtractor};
///
/// let payload = URL_SAFE_NO_PAD.encode(r#"{"sub":"alice","tenant":42}"#);
/// let token = format!("eyJhbGciOiJIUzI1NiJ9.{payload}.c2ln");
/// let req = http::Request::builder()
///     .header("authorization", format!("Bearer {token}"))
///     .body(())?;
///
/// assert_eq!(BearerClaim::sub().extract(&req).as_deref(), Some("alice"));
/// assert_eq!(BearerClaim::claim("tenant").extract(&req).as_deref(), Some("42"));
///
/// // With a verifier, a token it refuses gives no key.
/// let checked = BearerClaim::sub().verify_with(|_token: &str| false);
/// assert_eq!(checked.extract(&req), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct BearerClaim {
    claim: Arc<str>,
    verify: Option<Verify>,
}

impl BearerClaim {
    /// Keys by the `sub` (subject) claim.
    pub fn sub() -> Self {
        Self::claim("sub")
    }

    /// Keys by the claim `name` (a top-level member of the payload).
    pub fn claim(name: &str) -> Self {
        Self {
            claim: name.into(),
            verify: None,
        }
    }

    /// Checks each token with `verify` (given the compact token, without the `Bearer `
    /// prefix) before reading it: a token for which it returns `false` gives no key.
    pub fn verify_with<F>(mut self, verify: F) -> Self
    where
        F: Fn(&str) -> bool + Send + Sync + 'static,
    {
        self.verify = Some(Arc::new(verify));
        self
    }

    fn read(&self, header: &[u8]) -> Option<String> {
        if header.len() > MAX_TOKEN_LEN {
            return None;
        }
        let header = std::str::from_utf8(header).ok()?;
        let (scheme, token) = header.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let token = token.trim_matches(' ');
        let mut parts = token.split('.');
        let (Some(_), Some(payload), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        if let Some(verify) = &self.verify {
            if !verify(token) {
                return None;
            }
        }
        let json = URL_SAFE_NO_PAD.decode(payload).ok()?;
        let claims: Value = serde_json::from_slice(&json).ok()?;
        let key = match claims.get(&*self.claim)? {
            Value::String(s) => s.clone(),
            Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
            _ => return None,
        };
        (!key.is_empty()).then_some(key)
    }
}

impl fmt::Debug for BearerClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BearerClaim")
            .field("claim", &self.claim)
            .field("verified", &self.verify.is_some())
            .finish()
    }
}

impl<B> KeyExtractor<Request<B>> for BearerClaim {
    type Key = String;

    fn extract(&self, req: &Request<B>) -> Option<String> {
        self.read(req.headers().get(AUTHORIZATION)?.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(payload: &str) -> String {
        format!("eyJhbGciOiJub25lIn0.{}.", URL_SAFE_NO_PAD.encode(payload))
    }

    fn req(auth: &str) -> Request<()> {
        Request::builder()
            .header("authorization", auth)
            .body(())
            .unwrap()
    }

    #[test]
    fn reads_claims() {
        let r = req(&format!(
            "bearer  {}",
            token(r#"{"sub":"u-1","n":-12,"big":18446744073709551615,"f":1.5,"b":true,"e":""}"#)
        ));
        let get = |c| BearerClaim::claim(c).extract(&r);
        assert_eq!(BearerClaim::sub().extract(&r).as_deref(), Some("u-1"));
        assert_eq!(get("n").as_deref(), Some("-12"));
        assert_eq!(get("big").as_deref(), Some("18446744073709551615"));
        assert_eq!(get("f"), None);
        assert_eq!(get("b"), None);
        assert_eq!(get("e"), None);
        assert_eq!(get("missing"), None);
    }

    #[test]
    fn malformed_is_none() {
        let sub = BearerClaim::sub();
        let good = token(r#"{"sub":"x"}"#);
        for auth in [
            format!("Basic {good}"),
            format!("Bearer{good}"),
            "Bearer".to_owned(),
            "Bearer a.b".to_owned(),
            format!("Bearer {good}.extra.part"),
            "Bearer a.!!!.c".to_owned(),
            format!("Bearer a.{}.c", URL_SAFE_NO_PAD.encode("not json")),
            format!("Bearer a.{}.c", URL_SAFE_NO_PAD.encode("[1,2]")),
            format!("Bearer a.{}=.c", URL_SAFE_NO_PAD.encode(r#"{"sub":"x"}"#)),
            format!(
                "Bearer {}",
                token(&format!(r#"{{"sub":"{}"}}"#, "x".repeat(9000)))
            ),
        ] {
            assert_eq!(sub.extract(&req(&auth)), None, "{auth}");
        }
        assert_eq!(sub.extract(&Request::new(())), None);
        assert_eq!(
            sub.extract(&req(&format!("Bearer {good}"))).as_deref(),
            Some("x")
        );
    }

    #[test]
    fn verifier_is_consulted_first() {
        let good = token(r#"{"sub":"x"}"#);
        let expected = good.clone();
        let k = BearerClaim::sub().verify_with(move |t: &str| t == expected);
        assert_eq!(
            k.extract(&req(&format!("Bearer {good}"))).as_deref(),
            Some("x")
        );
        let forged = token(r#"{"sub":"y"}"#);
        assert_eq!(k.extract(&req(&format!("Bearer {forged}"))), None);
        assert!(format!("{k:?}").contains("verified: true"));
    }
}
