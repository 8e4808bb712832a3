//! The scenarios, each a `run` that starts its own server(s) and adds its section and
//! checks to the report.

pub(crate) mod contention;
pub(crate) mod cost;
pub(crate) mod cycles;
pub(crate) mod kinds;
pub(crate) mod memory;
pub(crate) mod multi;
pub(crate) mod scaling;
pub(crate) mod watch;
