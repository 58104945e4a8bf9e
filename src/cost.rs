//! What a request costs in units of the quota: [`Cost`], [`UnitCost`] (the default), or a
//! closure over the request.
//!
//! ```
//! use http::Request;
//! use tollgate::cost::Cost;
//!
//! // One unit per started KiB of declared body, at least one.
//! let by_size = |req: &Request<()>| {
//!     let len = req
//!         .headers()
//!         .get(http::header::CONTENT_LENGTH)
//!         .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
//!         .unwrap_or(0);
//!     len.div_ceil(1024).max(1)
//! };
//! let req = Request::builder().header("content-length", "4000").body(()).unwrap();
//! assert_eq!(by_size.cost(&req), 4);
//! ```

/// The cost of a request in units of the quota. Implemented by [`UnitCost`] (every request
/// costs 1, the default) and by every closure `Fn(&Req) -> u64`. See the [module docs](self).
pub trait Cost<Req> {
    /// Units this request spends.
    fn cost(&self, req: &Req) -> u64;
}

/// Every request costs one unit. See [`Cost`].
#[derive(Clone, Copy, Debug, Default)]
pub struct UnitCost;

impl<Req> Cost<Req> for UnitCost {
    #[inline]
    fn cost(&self, _: &Req) -> u64 {
        1
    }
}

/// A closure weighs requests: by route, by header, by declared body size. See the
/// [module docs](self).
impl<Req, F: Fn(&Req) -> u64> Cost<Req> for F {
    #[inline]
    fn cost(&self, req: &Req) -> u64 {
        self(req)
    }
}
