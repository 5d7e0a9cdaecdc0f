//! The `python` executor: FlowMesh's `code` + `entrypoint` (a function whose return value is the
//! result), or our `command` extension (any command line, result from `FLOWMESH_RESULT_FILE`).

use crate::executor::{ExecError, TaskContext};
use serde_json::Value;

/// Calls `entrypoint` in the task's code and writes its return value as the result file. An
/// entrypoint that takes a parameter gets `inputs`: upstream stage name → the folder holding that
/// stage's stored files (FlowMesh's calling convention).
const RUNNER: &str = r#"
import importlib.util, inspect, json, os, sys
spec = importlib.util.spec_from_file_location("task_code", "task_code.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
entry = getattr(module, sys.argv[1], None)
if entry is None:
    sys.stderr.write("entrypoint %r is not defined in the task's code\n" % sys.argv[1])
    sys.exit(2)
root = os.environ.get("FLOWMESH_INPUTS_DIR", "")
inputs = {name: os.path.join(root, name) for name in sorted(os.listdir(root))} if os.path.isdir(root) else {}
takes_inputs = len(inspect.signature(entry).parameters) > 0
result = entry(inputs) if takes_inputs else entry()
with open(os.environ["FLOWMESH_RESULT_FILE"], "w") as f:
    json.dump({"ok": True, "output": result}, f, default=str)
"#;

pub async fn run(interpreter: &str, ctx: &TaskContext) -> Result<Value, ExecError> {
    let spec = &ctx.order.spec;
    if let Some(code) = spec.get("code").and_then(Value::as_str) {
        let entrypoint = spec.get("entrypoint").and_then(Value::as_str).unwrap_or("main");
        std::fs::write(ctx.work_dir.join("task_code.py"), code)
            .map_err(|e| ExecError::Retryable(format!("writing task code: {e}")))?;
        std::fs::write(ctx.work_dir.join("flowmesh_runner.py"), RUNNER)
            .map_err(|e| ExecError::Retryable(format!("writing runner: {e}")))?;
        let argv = vec![interpreter.to_owned(), "flowmesh_runner.py".to_owned(), entrypoint.to_owned()];
        return ctx.run_command(&argv).await;
    }
    let argv: Vec<String> = match spec.get("command") {
        Some(Value::String(line)) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
        Some(Value::Array(items)) => {
            items.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned)).collect()
        }
        _ => {
            return Err(ExecError::Permanent("a python task needs code or command".to_owned()));
        }
    };
    let mut argv = argv;
    if let Some(Value::Array(args)) = spec.get("args") {
        argv.extend(args.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned)));
    }
    ctx.run_command(&argv).await
}
