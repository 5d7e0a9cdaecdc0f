//! Errors at the NATS edge, split by what the caller should do about them.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum EdgeError {
    /// NATS did not answer or refused for now: retry (nak with delay, back off).
    #[error("nats is unavailable for {what}: {source}")]
    Transient { what: String, source: Box<dyn std::error::Error + Send + Sync> },
    /// An existing stream or bucket differs from `streams/`: an operator must decide.
    #[error("{kind} {name} exists with {field} = {found}, but streams/ defines {expected}; refusing to change it")]
    Conflict { kind: &'static str, name: String, field: &'static str, expected: String, found: String },
    /// A message that must be readable is not (only the services may write it).
    #[error("{what} is unreadable: {why}")]
    Unreadable { what: String, why: String },
    /// A definition in `streams/` cannot be used.
    #[error("bad definition in streams/{file}: {message}")]
    Definition { file: &'static str, message: String },
}

impl EdgeError {
    pub fn transient(what: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        EdgeError::Transient { what: what.into(), source: Box::new(source) }
    }
}
