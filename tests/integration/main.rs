//! Integration scenarios against a real nats-server.

mod bench;
mod binaries;
mod chaos;
mod cli;
mod dev;
mod ml;
mod observability;
mod router;
mod security;
mod skeleton;
mod ssh;
mod validator;
mod worker;
