//! `BearerClaim` and `jsonwebtoken`'s crypto provider, which the app chooses. Without a
//! usable one (none of jsonwebtoken's backends, or both and none installed), jsonwebtoken
//! panics on every signature: the extractor is refused when it is built instead, so no
//! request meets that panic.
//!
//! The provider is fixed for the whole process at its first use: the other tests of this
//! binary use jsonwebtoken only with `jwt-rust-crypto`, the provider this test expects
//! then. `cargo test --features jwt --test keys jwt_provider` runs the case without a
//! provider; `--features jwt-rust-crypto` (and `--all-features`) the case with one.

use tollgate::key::{BearerClaim, KeyExtractor};
use tollgate::ConfigError;

/// `{"sub":"alice","exp":4102444800}` signed with HS256 and `SECRET` (exp: year 2100).
const TOKEN: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhbGljZSIsImV4cCI6NDEwMjQ0NDgwMH0.exWtHXHXKH1TXjU5YIN09Osy6gEcmz31LviykaqFvwg";
const SECRET: &[u8] = b"the issuer secret";

fn bearer() -> http::Request<()> {
    http::Request::builder()
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(())
        .unwrap()
}

#[test]
fn a_bearer_claim_is_built_only_with_a_usable_crypto_provider() {
    let built = BearerClaim::hs256("sub", SECRET);
    if cfg!(feature = "jwt-rust-crypto") {
        let k = built.expect("RustCrypto is jsonwebtoken's only backend");
        assert_eq!(k.extract(&bearer()).as_deref(), Some("alice"));
        return;
    }
    match built {
        Err(ConfigError::Key(why)) => {
            assert!(why.contains("jwt-rust-crypto"), "{why}");
            assert!(why.contains("install_default"), "{why}");
        }
        Err(other) => panic!("another error: {other}"),
        // Built without a provider: the first request would panic inside jsonwebtoken.
        Ok(k) => panic!(
            "built without a crypto provider; a request gives {:?}",
            k.extract(&bearer())
        ),
    }
    // Reading a claim without verifying needs no provider.
    assert_eq!(
        BearerClaim::unverified("sub").extract(&bearer()).as_deref(),
        Some("alice")
    );
}
