//! Policies and the algorithms under them: each algorithm's exact decisions, debt,
//! policies chosen per request, swapped live and run in shadow, policies as text, and the
//! `simulate` example's engine replaying traces through them.

#[path = "../support/mod.rs"]
mod support;

mod algorithms;
mod debt;
mod policies;
mod policy_text;
mod simulate;
