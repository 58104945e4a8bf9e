//! Division by a divisor fixed when a limit is built, with two multiplications instead of
//! a `div` instruction.
//!
//! A 64-bit `div` is one of the slowest integer instructions (tens of cycles on many
//! x86-64 cores), more than the rest of a check; every report divides by the emission
//! interval (`remaining`), every window decision by the window's length. With `c = ceil(2^128 / d)`, `floor(n / d)` is the top 64 bits
//! of the 192-bit product `c * n` for every 64-bit `n` and every `d >= 2`: the error
//! `c * d - 2^128` is below `d <= 2^64` (Lemire, Kaser and Kurz, "Faster remainder by
//! direct computation", 2019, theorem 1 with F = 128, N = 64). `d = 1` is the identity.

/// `n / d` for a fixed `d >= 1`, exact for every `u64` `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Divisor {
    /// `ceil(2^128 / d)`, or 0 for `d = 1` (whose reciprocal, 2^128, does not fit).
    c: u128,
}

impl Divisor {
    /// The divisor `d`; `d = 0` is treated as 1 (callers never pass it: an emission
    /// interval is at least 1 ns).
    pub(crate) const fn new(d: u64) -> Self {
        let c = if d <= 1 {
            0
        } else {
            // u128::MAX / d + 1 = ceil(2^128 / d), also when d divides 2^128.
            u128::MAX / d as u128 + 1
        };
        Divisor { c }
    }

    /// `n / d`.
    #[inline]
    pub(crate) fn divide(self, n: u64) -> u64 {
        if self.c == 0 {
            return n;
        }
        let n = u128::from(n);
        let lo = (self.c as u64 as u128 * n) >> 64;
        let hi = (self.c >> 64) * n;
        // hi <= (2^64 - 1)^2 and lo < 2^64: the sum fits in 128 bits.
        ((hi + lo) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::Divisor;

    #[test]
    fn edges() {
        let ds = [
            1,
            2,
            3,
            7,
            10,
            1_000,
            999_999_937,
            1 << 32,
            (1 << 63) + 1,
            u64::MAX - 1,
            u64::MAX,
        ];
        let ns = [
            0,
            1,
            2,
            3,
            999,
            1 << 32,
            (1 << 53) + 1,
            u64::MAX / 3,
            u64::MAX - 1,
            u64::MAX,
        ];
        for d in ds {
            let div = Divisor::new(d);
            for n in ns {
                assert_eq!(div.divide(n), n / d, "{n} / {d}");
            }
            for k in [1, 2, 3, 1000] {
                // Around exact multiples, where an inexact reciprocal is off by one.
                if let Some(m) = d.checked_mul(k) {
                    assert_eq!(div.divide(m), k, "{m} / {d}");
                    assert_eq!(div.divide(m - 1), k - 1, "{} / {d}", m - 1);
                }
            }
        }
        assert_eq!(Divisor::new(0).divide(5), 5);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]
        #[test]
        fn matches_division(d in 1u64.., n: u64) {
            prop_assert_eq!(Divisor::new(d).divide(n), n / d);
        }

        #[test]
        fn matches_division_small_divisors(d in 1u64..1_000_000_000_000, n: u64) {
            prop_assert_eq!(Divisor::new(d).divide(n), n / d);
        }

        #[test]
        fn matches_division_near_multiples(d in 1u64..u64::MAX / 4, k in 1u64..4, off in 0u64..2) {
            let n = d * k - off;
            prop_assert_eq!(Divisor::new(d).divide(n), n / d);
        }
    }
}
