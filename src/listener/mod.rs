#![doc = include_str!("../docs/listener.md")]

mod accept;
mod gate;
mod limits;
mod stream;
mod watch;

pub use accept::LimitedListener;
pub use limits::ConnectionLimits;
