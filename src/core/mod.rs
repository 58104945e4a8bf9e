//! The core every layer shares: the response state machine, what an admitted response
//! gets from its layer, and the service every layer makes.

pub(crate) mod finish;
pub(crate) mod gate;
pub(crate) mod machine;
pub(crate) mod service;
