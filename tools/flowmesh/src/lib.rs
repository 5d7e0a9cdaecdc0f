//! The `flowmesh` CLI as a library: the local stack, submitting and following workflows, the
//! views over the event log, and the bench. The binary (`main.rs`, `cmd/`) holds the verbs.

pub mod bench;
pub mod cpu;
pub mod dev;
pub mod log;
pub mod nats_server;
pub mod plan;
pub mod submit;
pub mod table;
pub mod timeline;
pub mod views;
