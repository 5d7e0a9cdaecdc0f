//! The `python` executor: FlowMesh's `code` + `entrypoint` (a function whose return value is the
//! result), or our `command` extension (any command line, result from `FLOWMESH_RESULT_FILE`).

use crate::executor::context::{ExecError, TaskContext, command_line, text};
use flowmesh_domain::work::WorkOrder;
use serde_json::Value;
use std::collections::BTreeMap;

/// Calls `entrypoint` in the task's code and writes its return value as the result file.
/// Upstream stages arrive as FlowMesh's python executor gives them: `$FLOWMESH_PY_INPUTS` (JSON,
/// stage name → the folder holding that stage's `results.json` and files), a parameter named
/// after a stage gets that stage's output (a python stage's return value, any other stage's
/// result), `inputs` gets every stage as a path-like `StageInput` (`.path`, `.result`,
/// `.output`), `**kwargs` the stages not bound otherwise; a single parameter with another name
/// gets `inputs` too (our earlier convention).
const RUNNER: &str = r#"
import importlib.util, inspect, json, os, sys

class StageInput(os.PathLike):
    def __init__(self, stage, path):
        self.stage, self.path = stage, path
    def __fspath__(self):
        return self.path
    def __str__(self):
        return self.path
    def __repr__(self):
        return "StageInput(%r, %r)" % (self.stage, self.path)
    @property
    def result(self):
        with open(os.path.join(self.path, "results.json")) as f:
            return json.load(f)
    @property
    def output(self):
        r = self.result
        return r["output"] if isinstance(r, dict) and set(r) == {"ok", "output"} else r

spec = importlib.util.spec_from_file_location("task_code", "task_code.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
entry = getattr(module, sys.argv[1], None)
if entry is None:
    sys.stderr.write("entrypoint %r is not defined in the task's code\n" % sys.argv[1])
    sys.exit(2)
stages = json.loads(os.environ.get("FLOWMESH_PY_INPUTS") or "{}")
inputs = {name: StageInput(name, path) for name, path in sorted(stages.items())}
params = list(inspect.signature(entry).parameters.values())
kwargs, rest = {}, False
for p in params:
    if p.kind is p.VAR_KEYWORD:
        rest = True
    elif p.name == "inputs" or (len(params) == 1 and p.name not in inputs and p.kind is not p.VAR_POSITIONAL):
        kwargs[p.name] = inputs
    elif p.name in inputs:
        kwargs[p.name] = inputs[p.name].output
    elif p.default is p.empty:
        sys.stderr.write("parameter %r matches no upstream stage (stages: %s)\n" % (p.name, ", ".join(inputs) or "none"))
        sys.exit(3)
if rest:
    kwargs.update({k: v.output for k, v in inputs.items() if k not in kwargs})
result = entry(**kwargs)
with open(os.environ["FLOWMESH_RESULT_FILE"], "w") as f:
    json.dump({"ok": True, "output": result}, f, default=str)
"#;

/// The upstream stages whose files are fetched before the task runs: those named in
/// `spec.inputs`; without that list, every direct upstream stage (FlowMesh's python executor
/// mounts them all), except for `echo` (no files to read) and `ssh` (mounts only what it names).
pub fn input_stages(order: &WorkOrder) -> Vec<String> {
    match order.spec.get("inputs").and_then(Value::as_array) {
        Some(inputs) => {
            inputs.iter().filter_map(|i| i.get("stage").and_then(Value::as_str)).map(str::to_owned).collect()
        }
        None if matches!(order.task_type.as_str(), "echo" | "ssh") => Vec::new(),
        None => order.upstream.keys().cloned().collect(),
    }
}

/// `$FLOWMESH_PY_INPUTS`: stage name → its downloaded folder, for the stages fetched.
fn inputs_env(ctx: &TaskContext) -> BTreeMap<String, String> {
    let root = ctx.work_dir.join("inputs");
    let stages: serde_json::Map<String, Value> = input_stages(&ctx.order)
        .into_iter()
        .map(|s| {
            let dir = root.join(&s).display().to_string();
            (s, Value::String(dir))
        })
        .collect();
    BTreeMap::from([("FLOWMESH_PY_INPUTS".to_owned(), Value::Object(stages).to_string())])
}

pub async fn run(interpreter: &str, ctx: &TaskContext) -> Result<Value, ExecError> {
    let spec = &ctx.order.spec;
    if let Some(code) = spec.get("code").and_then(Value::as_str) {
        let entrypoint = spec.get("entrypoint").and_then(Value::as_str).unwrap_or("main");
        std::fs::write(ctx.work_dir.join("task_code.py"), code)
            .map_err(|e| ExecError::Retryable(format!("writing task code: {e}")))?;
        std::fs::write(ctx.work_dir.join("flowmesh_runner.py"), RUNNER)
            .map_err(|e| ExecError::Retryable(format!("writing runner: {e}")))?;
        let argv = vec![interpreter.to_owned(), "flowmesh_runner.py".to_owned(), entrypoint.to_owned()];
        return ctx.run_command_with(&argv, &inputs_env(ctx)).await;
    }
    let Some(mut argv) = command_line(spec.get("command")) else {
        return Err(ExecError::Permanent("a python task needs code or command".to_owned()));
    };
    if let Some(Value::Array(args)) = spec.get("args") {
        argv.extend(args.iter().map(text));
    }
    ctx.run_command_with(&argv, &inputs_env(ctx)).await
}
