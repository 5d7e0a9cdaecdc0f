//! The FlowMesh domain: documents, validation, workflows, events, the state fold and placement.
//!
//! Pure code only: no NATS, no tokio, no clock. Callers pass `now` in.

pub mod decode;
pub mod echo;
pub mod event;
pub mod fleet;
pub mod ids;
mod locate;
pub mod n8n;
pub mod placement;
pub mod pointer;
pub mod problem;
pub mod schedule;
pub mod schema;
pub mod secret;
pub mod state;
pub mod template;
pub mod trace;
pub mod units;
pub mod validate;
pub mod work;
pub mod workflow;

pub use event::{Event, EventBody};
pub use problem::Problem;
pub use validate::{validate_dispatchable, validate_submission};
pub use workflow::{TaskDef, Workflow};
