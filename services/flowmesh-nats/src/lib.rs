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

/// Every program of ours (the CLI and the three services all link this crate) allocates with
/// mimalloc, built without transparent huge pages: in the one process of `flowmesh dev` and
/// `bench --dev` the burst costs up to a fifth less CPU per task than with glibc's allocator, at
/// the same memory; the services on their own measured the same with either (ARCHITECTURE,
/// "Decisions").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
