//! FlowMesh's own verb forms and the verbs added beside the original set, one file per verb;
//! `main.rs` parses the arguments and dispatches here.

pub mod download;
pub mod logs;
pub mod prewarm;
pub mod ssh;
pub mod task_watch;
pub mod trace;
