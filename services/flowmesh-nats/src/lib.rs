//! The NATS edge: subjects, stream and bucket definitions from `streams/`, publishing with
//! deterministic ids, and the small helpers every service shares.

pub mod artifacts;
pub mod auth;
pub mod cli;
pub mod clock;
pub mod connect;
pub mod consume;
pub mod digest;
pub mod error;
pub mod host;
pub mod publish;
pub mod retention;
pub mod retry;
pub mod shutdown;
pub mod status;
pub mod subjects;
pub mod topology;

pub use error::EdgeError;
pub use shutdown::{Shutdown, Trigger};
pub use topology::{Handles, Topology};
