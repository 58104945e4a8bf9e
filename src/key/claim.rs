//! [`BearerClaim`]: a claim of the bearer JWT (feature `jwt`).

use std::{fmt, panic::AssertUnwindSafe, sync::Arc};

use http::{header::AUTHORIZATION, Request};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::KeyExtractor;
use crate::error::ConfigError;

/// The `jsonwebtoken` crate, whose key and validation types [`BearerClaim::verified`]
/// takes (re-exported so that its version is always the one tollgate uses).
pub use jsonwebtoken as jwt;

/// The longest `Authorization` header value read, in bytes.
const MAX_TOKEN_LEN: usize = 8 * 1024;

/// How tokens are checked before a claim is read.
#[derive(Clone)]
enum Check {
    /// Signature, algorithm and the time claims, with `jsonwebtoken`.
    Verified(Arc<(DecodingKey, Validation)>),
    /// None: an earlier layer verified the token.
    Unverified,
}

/// Keys requests by a claim of the JWT in `Authorization: Bearer <token>`, such as `sub`
/// or a tenant id, **after verifying the token**.
///
/// A claim is only worth keying on if the token is genuine: anyone can write a JWT with
/// any claims, so an unverified claim lets a client mint a new identity (and a fresh
/// bucket) per request. [`BearerClaim::verified`] and [`BearerClaim::hs256`] check the
/// signature, the algorithm, `exp` (required) and `nbf` with the well-kept
/// [`jsonwebtoken`](https://docs.rs/jsonwebtoken) crate; a token that fails gives no key, so forged tokens
/// are refused (`MissingKey::Reject`, by default with `400`) or all land in the layer's
/// keyless bucket (`MissingKey::Shared`). [`BearerClaim::unverified`] skips the check, for a layer
/// placed inside an auth layer that already rejected bad tokens.
///
/// Prefer [`ExtensionKey`](super::ExtensionKey) when the auth layer already puts the
/// verified claims in the request extensions: it costs no second decode.
///
/// # Key
///
/// A `String`: a string claim as is, an integer claim as its decimal digits. The key is
/// `None` when the header is missing, not `Bearer` (case-insensitive), longer than 8 KiB,
/// when the token fails verification, or when the claim is missing, empty or of another
/// type.
///
/// # Crypto provider
///
/// Verifying needs one of `jsonwebtoken`'s crypto backends, which the app chooses:
/// tollgate's feature `jwt-rust-crypto` (RustCrypto; its RSA comes from the `rsa` crate,
/// whose advisory RUSTSEC-2023-0071 concerns private-key operations, not the public-key
/// verification done here), or `jsonwebtoken`'s own `aws_lc_rs` or `rust_crypto` feature
/// in the app's `Cargo.toml`, or a provider installed with
/// [`CryptoProvider::install_default`](jwt::crypto::CryptoProvider::install_default)
/// before the extractor is built. `jsonwebtoken` panics on every signature (in the app's
/// own JWT code too) when it has none, or when both backends are enabled and none was
/// installed: [`BearerClaim::verified`] and [`BearerClaim::hs256`] try the provider once
/// and refuse to build with [`ConfigError::Key`] then, so no request ever meets the
/// panic (`jsonwebtoken`'s message is still printed by the panic hook, and with
/// `panic = "abort"` the process stops there, at start-up).
///
/// See the [module docs](super) for the other extractors.
///
/// ```
/// use tollgate::key::{jwt, BearerClaim, KeyExtractor};
///
/// # if cfg!(not(feature = "jwt-rust-crypto")) { return Ok(()); }
/// let secret = b"a secret shared with the issuer";
/// let by_user = BearerClaim::hs256("sub", secret)?;
///
/// let claims = serde_json::json!({ "sub": "alice", "exp": jwt::get_current_timestamp() + 600 });
/// let token = jwt::encode(&jwt::Header::default(), &claims, &jwt::EncodingKey::from_secret(secret))?;
/// let req = http::Request::builder()
///     .header("authorization", format!("Bearer {token}"))
///     .body(())?;
/// assert_eq!(by_user.extract(&req).as_deref(), Some("alice"));
///
/// // The same claims signed with another key give no key at all.
/// let forged = jwt::encode(&jwt::Header::default(), &claims, &jwt::EncodingKey::from_secret(b"guess"))?;
/// let req = http::Request::builder()
///     .header("authorization", format!("Bearer {forged}"))
///     .body(())?;
/// assert_eq!(by_user.extract(&req), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct BearerClaim {
    claim: Arc<str>,
    check: Check,
}

impl BearerClaim {
    /// Keys by the claim `name` (a top-level member of the payload) of tokens verified
    /// with `key` under `validation` (which names the accepted algorithms and time claims;
    /// see [`jwt::Validation`]).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Key`] when `jsonwebtoken` has no usable crypto provider (see
    /// [Crypto provider](Self#crypto-provider)).
    pub fn verified(
        name: &str,
        key: DecodingKey,
        validation: Validation,
    ) -> Result<Self, ConfigError> {
        let alg = validation
            .algorithms
            .first()
            .copied()
            .unwrap_or(Algorithm::HS256);
        check_provider(&key, alg)?;
        Ok(Self {
            claim: name.into(),
            check: Check::Verified(Arc::new((key, validation))),
        })
    }

    /// Keys by the claim `name` of HS256 tokens signed with `secret`, requiring `exp` and
    /// checking `nbf` when present (60 s of leeway for clock skew).
    ///
    /// # Errors
    ///
    /// As [`BearerClaim::verified`].
    pub fn hs256(name: &str, secret: &[u8]) -> Result<Self, ConfigError> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.validate_nbf = true;
        Self::verified(name, DecodingKey::from_secret(secret), validation)
    }

    /// Keys by the claim `name` **without verifying the token**: only for a layer that
    /// runs after an auth layer which already rejected invalid tokens. On its own, it lets
    /// clients choose their key.
    pub fn unverified(name: &str) -> Self {
        Self {
            claim: name.into(),
            check: Check::Unverified,
        }
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
        let claims: Map<String, Value> = match &self.check {
            Check::Verified(kv) => jsonwebtoken::decode(token, &kv.0, &kv.1).ok()?.claims,
            Check::Unverified => jsonwebtoken::dangerous::insecure_decode_claims(token).ok()?,
        };
        let key = match claims.get(&*self.claim)? {
            Value::String(s) => s.clone(),
            Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
            _ => return None,
        };
        (!key.is_empty()).then_some(key)
    }
}

/// Tries `jsonwebtoken`'s crypto provider once, on a signature that cannot match. Its
/// process default is the provider the app installed or, failing that, the one its
/// features name, fixed at first use; with none of its backends, or both, that default
/// panics on every signature. The panic is caught here, when the extractor is built.
fn check_provider(key: &DecodingKey, alg: Algorithm) -> Result<(), ConfigError> {
    let probe = std::panic::catch_unwind(AssertUnwindSafe(|| {
        jsonwebtoken::crypto::verify("", b"tollgate: a provider check", key, alg)
    }));
    probe.map(drop).map_err(|_| {
        ConfigError::Key(
            "jsonwebtoken has no usable crypto provider: enable tollgate's feature \
             `jwt-rust-crypto`, or exactly one of jsonwebtoken's `rust_crypto` and \
             `aws_lc_rs`, or install one with `CryptoProvider::install_default` before \
             building the extractor"
                .into(),
        )
    })
}

impl fmt::Debug for BearerClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BearerClaim")
            .field("claim", &self.claim)
            .field("verified", &matches!(self.check, Check::Verified(_)))
            .finish()
    }
}

impl<B> KeyExtractor<Request<B>> for BearerClaim {
    type Key = String;

    fn extract(&self, req: &Request<B>) -> Option<String> {
        self.read(req.headers().get(AUTHORIZATION)?.as_bytes())
    }
}

#[cfg(all(test, feature = "jwt-rust-crypto"))]
mod tests {
    use jsonwebtoken::{encode, get_current_timestamp, EncodingKey, Header};
    use serde_json::json;

    use super::*;

    const SECRET: &[u8] = b"test secret";

    fn signed(claims: &Value, secret: &[u8]) -> String {
        encode(
            &Header::default(),
            claims,
            &EncodingKey::from_secret(secret),
        )
        .unwrap()
    }

    fn req(auth: &str) -> Request<()> {
        Request::builder()
            .header("authorization", auth)
            .body(())
            .unwrap()
    }

    fn exp() -> u64 {
        get_current_timestamp() + 600
    }

    #[test]
    fn reads_claims_of_verified_tokens() {
        let t = signed(
            &json!({"sub":"u-1","n":-12,"big":18446744073709551615u64,"f":1.5,"b":true,"e":"","exp":exp()}),
            SECRET,
        );
        let r = req(&format!("bearer  {t}"));
        let get = |c| BearerClaim::hs256(c, SECRET).unwrap().extract(&r);
        assert_eq!(get("sub").as_deref(), Some("u-1"));
        assert_eq!(get("n").as_deref(), Some("-12"));
        assert_eq!(get("big").as_deref(), Some("18446744073709551615"));
        assert_eq!(get("f"), None);
        assert_eq!(get("b"), None);
        assert_eq!(get("e"), None);
        assert_eq!(get("missing"), None);
    }

    /// Regression: tokens were decoded without verification by default, so a client could
    /// mint a new identity (and bucket) per request.
    #[test]
    fn forged_expired_and_early_tokens_give_no_key() {
        let sub = BearerClaim::hs256("sub", SECRET).unwrap();
        let good = signed(&json!({"sub":"x","exp":exp()}), SECRET);
        assert_eq!(
            sub.extract(&req(&format!("Bearer {good}"))).as_deref(),
            Some("x")
        );
        let other_key = signed(&json!({"sub":"x","exp":exp()}), b"not the secret");
        let expired = signed(
            &json!({"sub":"x","exp":get_current_timestamp() - 3600}),
            SECRET,
        );
        let no_exp = signed(&json!({"sub":"x"}), SECRET);
        let early = signed(
            &json!({"sub":"x","exp":exp(),"nbf":get_current_timestamp() + 3600}),
            SECRET,
        );
        // alg "none" with the payload of a good token.
        let payload = good.split('.').nth(1).unwrap();
        let alg_none = format!("eyJhbGciOiJub25lIn0.{payload}.");
        // A good signature over another payload.
        let parts: Vec<&str> = good.split('.').collect();
        let other = signed(&json!({"sub":"y","exp":exp()}), SECRET);
        let swapped = format!(
            "{}.{}.{}",
            parts[0],
            other.split('.').nth(1).unwrap(),
            parts[2]
        );
        for t in [other_key, expired, no_exp, early, alg_none, swapped] {
            assert_eq!(sub.extract(&req(&format!("Bearer {t}"))), None, "{t}");
        }
    }

    #[test]
    fn malformed_is_none() {
        let sub = BearerClaim::unverified("sub");
        let good = signed(&json!({"sub":"x","exp":exp()}), SECRET);
        for auth in [
            format!("Basic {good}"),
            format!("Bearer{good}"),
            "Bearer".to_owned(),
            "Bearer a.b".to_owned(),
            format!("Bearer {good}.extra.part"),
            "Bearer a.!!!.c".to_owned(),
            format!("Bearer {}", "x".repeat(9000)),
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
    fn unverified_reads_any_token() {
        let forged = signed(&json!({"sub":"mallory"}), b"anything");
        let k = BearerClaim::unverified("sub");
        assert_eq!(
            k.extract(&req(&format!("Bearer {forged}"))).as_deref(),
            Some("mallory")
        );
        assert!(format!("{k:?}").contains("verified: false"));
    }
}
