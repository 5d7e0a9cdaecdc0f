//! The `echo` executor: runs in the worker itself, with no process and no files; what it answers
//! is `flowmesh_domain::echo`'s.

use crate::executor::context::{ExecError, TaskContext};
use serde_json::Value;

pub fn run(ctx: &TaskContext) -> Result<Value, ExecError> {
    flowmesh_domain::echo::run(&ctx.order.spec).map_err(ExecError::Permanent)
}
