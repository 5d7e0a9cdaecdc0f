//! Integration scenarios against a real nats-server.

mod artifacts;
mod bench;
mod binaries;
mod chaos;
mod cli;
mod cluster;
mod dev;
mod fleet_ops;
mod forgery;
mod graph;
mod merge;
mod ml;
mod n8n;
mod observability;
mod permissions;
mod retention;
mod router;
mod security;
mod serve;
mod skeleton;
mod ssh;
mod trace;
mod validator;
mod verbs;
mod warm;
mod worker;
