#![doc = include_str!("../docs/listener.md")]

mod accept;
mod gate;
mod http1;
mod http2;
mod limits;
mod progress;
mod slots;
mod stream;
mod track;
mod watch;

pub use accept::LimitedListener;
pub use gate::WhenFull;
pub use limits::ConnectionLimits;
