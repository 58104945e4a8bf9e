//! What a request costs in units of the quota: [`Cost`], [`UnitCost`] (the default) and
//! [`cost_fn`].
//!
//! ```
//! use http::Request;
//! use tollgate::cost::{cost_fn, Cost};
//!
//! // One unit per started KiB of declared body, at least one.
//! let by_size = cost_fn(|req: &Request<()>| {
//!     let len = req
//!         .headers()
//!         .get(http::header::CONTENT_LENGTH)
//!         .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
//!         .unwrap_or(0);
//!     len.div_ceil(1024).max(1)
//! });
//! let req = Request::builder().header("content-length", "4000").body(()).unwrap();
//! assert_eq!(by_size.cost(&req), 4);
//! ```

/// The cost of a request in units of the quota. Implemented by [`UnitCost`] (every request
/// costs 1, the default) and by closures through [`cost_fn`]. See the [module docs](self).
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

pub use closure::cost_fn;

/// A cost from a closure, unnamed: users hold it through [`Cost`].
mod closure {
    use std::fmt;

    use super::Cost;

    /// A [`Cost`](super::Cost) from a closure; built by [`cost_fn`].
    #[derive(Clone, Copy)]
    pub struct CostFn<F>(F);

    /// Weighs requests with a closure: by route, by header, by declared body size. See the
    /// [module docs](super).
    pub fn cost_fn<F>(f: F) -> CostFn<F> {
        CostFn(f)
    }

    impl<F> fmt::Debug for CostFn<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("CostFn")
        }
    }

    impl<Req, F: Fn(&Req) -> u64> Cost<Req> for CostFn<F> {
        #[inline]
        fn cost(&self, req: &Req) -> u64 {
            (self.0)(req)
        }
    }
}
