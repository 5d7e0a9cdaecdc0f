//! Validation of submissions: schema, stage expansion, the dependency graph, placeholders,
//! conditions and the dispatch rules. The same code runs in the validator, in
//! `flowmesh validate` and (for `validate_dispatchable`) at dispatch.

use crate::decode;
use crate::echo;
use crate::ids;
use crate::problem::{Problem, push};
use crate::schema;
use crate::template;
use crate::units;
use crate::workflow::{Condition, DEFAULT_MAX_ATTEMPTS, TaskDef, Workflow, deep_merge};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// The name of the only stage of a single-task document.
pub const SINGLE_STAGE: &str = "main";

/// Decodes and validates a submission body; on failure, every problem found.
pub fn validate_submission(body: &[u8], workflow_id: &str) -> Result<Workflow, Vec<Problem>> {
    let doc = decode::decode(body).map_err(|p| vec![p])?;
    if crate::n8n::is_n8n(&doc) {
        let translated = crate::n8n::translate(&doc)?;
        return validate_document(&translated, workflow_id).map_err(|problems| {
            let note = "in the flowmesh/v1 document translated from n8n";
            problems.into_iter().map(|p| Problem { message: format!("{} ({note})", p.message), ..p }).collect()
        });
    }
    validate_document(&doc, workflow_id).map_err(|mut problems| {
        // The body decoded, so it is UTF-8 text; JSON is YAML too, so one reader locates both.
        if let Ok(text) = std::str::from_utf8(body) {
            crate::locate::annotate(text, &mut problems, decode::yaml_options());
        }
        problems
    })
}

/// One stage before merging, with where its pieces sit in the document.
struct RawStage {
    name: String,
    /// Pointer to the stage's entry (`/spec/stages/1`), or `/spec` for a single task.
    entry_path: String,
    /// The stage's own spec (empty for a single task: the root is the spec).
    spec: Value,
    spec_path: String,
    /// Direct dependencies with the pointer of each, or `None` when the stage gave none.
    depends_on: Option<Vec<(String, String)>>,
    /// A node-level condition (graph nodes may carry one beside their spec).
    condition: Option<(Value, String)>,
}

/// Stages (or graph nodes) a workflow may have. FlowMesh workflows have a handful; the cap keeps
/// a hostile document's graph checks bounded (a 1 MiB document could otherwise name ~60,000).
pub const MAX_STAGES: usize = 1000;

/// Which stages are upstream of which: one bit per pair, filled in one topological pass
/// (`N² / 8` bytes: 125 KiB at `MAX_STAGES`).
struct Ancestors {
    words: usize,
    bits: Vec<u64>,
}

impl Ancestors {
    fn of(deps: &[Vec<usize>], order: &[usize]) -> Ancestors {
        let words = deps.len().div_ceil(64);
        let mut bits = vec![0u64; deps.len() * words];
        for &i in order {
            for &d in &deps[i] {
                bits[i * words + d / 64] |= 1 << (d % 64);
                for w in 0..words {
                    bits[i * words + w] |= bits[d * words + w];
                }
            }
        }
        Ancestors { words, bits }
    }

    /// Whether stage `j` is upstream of stage `i`.
    fn contains(&self, i: usize, j: usize) -> bool {
        self.bits[i * self.words + j / 64] & (1 << (j % 64)) != 0
    }
}

/// Validates a decoded document.
pub fn validate_document(doc: &Value, workflow_id: &str) -> Result<Workflow, Vec<Problem>> {
    let mut problems: BTreeSet<Problem> = schema::check_document(doc).into_iter().collect();
    let schema_passed = problems.is_empty();
    let Some(spec) = doc.get("spec").filter(|s| s.is_object()) else {
        return Err(finish(problems));
    };
    let (mut root, stages) = split_stages(spec);
    if stages.len() > MAX_STAGES {
        problems.insert(Problem::new(
            "/spec",
            format!("the workflow has {} stages; at most {MAX_STAGES} are accepted", stages.len()),
        ));
        return Err(finish(problems));
    }

    // The graph: names, dependencies, order.
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, stage) in stages.iter().enumerate() {
        let name_path = push(&stage.entry_path, "name");
        if !ids::is_valid_stage_name(&stage.name) {
            problems.insert(Problem::new(
                &name_path,
                format!(
                    "stage name {:?} must start with a letter or digit and use only letters, digits, '-' and '_' (at most 63)",
                    stage.name
                ),
            ));
        }
        if index.insert(&stage.name, i).is_some() {
            problems.insert(Problem::new(&name_path, format!("stage name {:?} is used more than once", stage.name)));
        }
    }
    let declared: Vec<Vec<usize>> = stages
        .iter()
        .enumerate()
        .map(|(i, stage)| {
            let mut out = Vec::new();
            for (dep, path) in stage.depends_on.iter().flatten() {
                match index.get(dep.as_str()) {
                    Some(&j) if j == i => {
                        problems.insert(Problem::new(path, format!("stage {:?} depends on itself", stage.name)));
                    }
                    Some(&j) => out.push(j),
                    None => {
                        problems.insert(Problem::new(
                            path,
                            format!("stage {:?} depends on unknown stage {dep:?}", stage.name),
                        ));
                    }
                }
            }
            out
        })
        .collect();
    // `schedule_hint.node_execution_order`: epochs run one after another (a barrier), and the
    // stages of an epoch are dispatched in the listed order.
    let epochs = execution_epochs(doc, &index, &mut problems);
    let mut deps = declared.clone();
    let mut rank: Vec<usize> = (0..stages.len()).collect();
    if let Some(epochs) = &epochs {
        let epoch_of: HashMap<usize, usize> =
            epochs.iter().enumerate().flat_map(|(k, members)| members.iter().map(move |&i| (i, k))).collect();
        for (position, &i) in epochs.iter().flatten().enumerate() {
            rank[i] = position;
        }
        let before = problems.len();
        for (i, stage) in stages.iter().enumerate() {
            for (dep, path) in stage.depends_on.iter().flatten() {
                if let Some(&j) = index.get(dep.as_str())
                    && j != i
                    && epoch_of[&j] >= epoch_of[&i]
                {
                    problems.insert(Problem::new(
                        path,
                        format!(
                            "stage {:?} depends on {dep:?}, which node_execution_order puts in {} epoch",
                            stage.name,
                            if epoch_of[&j] == epoch_of[&i] { "the same" } else { "a later" }
                        ),
                    ));
                }
            }
        }
        // Barriers only for a consistent hint: contradicting edges would also read as a cycle.
        if problems.len() == before {
            for pair in epochs.windows(2) {
                for &i in &pair[1] {
                    for &j in &pair[0] {
                        if !deps[i].contains(&j) {
                            deps[i].push(j);
                        }
                    }
                }
            }
        }
    }
    check_selected_stages(doc, &index, &mut problems);
    let order = match topological_order(&deps, &rank) {
        Ok(order) => order,
        Err(cyclic) => {
            for i in cyclic {
                let stage = &stages[i];
                let path = stage.depends_on.as_ref().and_then(|d| d.first()).map(|(_, p)| p.clone());
                problems.insert(Problem::new(
                    path.unwrap_or_else(|| stage.entry_path.clone()),
                    format!("stage {:?} is part of a dependency cycle", stage.name),
                ));
            }
            return Err(finish(problems));
        }
    };
    let ancestors = Ancestors::of(&deps, &order);

    // Each stage: merge, schema, semantics.
    let hints = selected_workers(doc);
    let mut tasks = Vec::with_capacity(stages.len());
    for &i in &order {
        let stage = &stages[i];
        // A single task is the one stage, and its merged spec is the root itself: moved, not copied.
        let single = stage.spec_path == "/spec";
        debug_assert!(!single || stages.len() == 1, "a single task's stage is the only one");
        let merged = if single { std::mem::take(&mut root) } else { deep_merge(&root, &stage.spec) };
        let set_by = |spec: &Value, key: &str| spec.as_object().is_some_and(|m| m.contains_key(key));
        // A field reported against the merged spec is blamed on the stage when the stage set it.
        let locate = |relative: &str| -> String {
            let first = relative.trim_start_matches('/').split('/').next().unwrap_or("");
            if !single && (set_by(&stage.spec, first) || !set_by(&root, first)) {
                schema::join(&stage.spec_path, relative)
            } else {
                schema::join("/spec", relative)
            }
        };
        // A single task's spec (no `stages`, no `graph`) is checked by the document's schema as a
        // whole `taskSpec`, and its merged spec is that spec without `dependsOn`, on which no rule
        // of the schema depends: where the document passed, checking it again finds nothing.
        // Debug builds (every test, the document fuzz test's mutations included) check it anyway.
        let checked_whole = schema_passed && stage.spec_path == "/spec";
        if !checked_whole || cfg!(debug_assertions) {
            let found = schema::check_task_spec(&merged, "/");
            assert!(
                !checked_whole || found.is_empty(),
                "a single task that passed the document's schema fails its task's: {found:?}"
            );
            for p in found {
                let path = locate(&p.path);
                problems.insert(Problem { path, ..p });
            }
        }
        check_memory(&merged, &locate, &mut problems);

        let upstream = |name: &str| index.get(name).is_some_and(|&j| ancestors.contains(i, j));
        let direct: HashSet<&str> = declared[i].iter().map(|&d| stages[d].name.as_str()).collect();
        template::walk(&merged, "", &mut |pointer, placeholder| {
            // `${stage.task_id}` is known at submit, so any other stage of the workflow may be named.
            let is_task_id = placeholder.path.len() == 1 && placeholder.path[0] == "task_id";
            let readable = upstream(placeholder.stage.as_str())
                || (is_task_id && index.contains_key(placeholder.stage.as_str()) && placeholder.stage != stage.name);
            if !readable {
                problems.insert(Problem::new(
                    locate(pointer),
                    format!(
                        "placeholder names stage {:?}, which is not upstream of {:?}; add it to dependsOn",
                        placeholder.stage, stage.name
                    ),
                ));
            }
        });

        for (pointer, referenced) in echo::references(&merged) {
            if !upstream(referenced.as_str()) {
                problems.insert(Problem::new(
                    locate(&pointer),
                    format!(
                        "item reads stage {referenced:?}, which is not upstream of {:?}; add it to dependsOn",
                        stage.name
                    ),
                ));
            }
        }

        let condition =
            stage.condition.clone().or_else(|| merged.get("condition").map(|c| (c.clone(), locate("/condition"))));
        let condition = condition.and_then(|(value, path)| {
            let parsed: Condition = serde_json::from_value(value).ok()?;
            if !direct.contains(parsed.node.as_str()) {
                problems.insert(Problem::new(
                    push(&path, "node"),
                    format!("condition names stage {:?}, which is not in dependsOn of {:?}", parsed.node, stage.name),
                ));
            }
            Some(parsed)
        });
        if merged.get("taskType").and_then(Value::as_str) == Some("ssh") {
            check_ssh_inputs(&merged, &direct, &locate, &mut problems);
        }
        for p in dispatch_rules(&merged) {
            let path = locate(&p.path);
            problems.insert(Problem { path, ..p });
        }

        let task_type = merged.get("taskType").and_then(Value::as_str).map(canonical_task_type).unwrap_or_default();
        let max_attempts = merged
            .get("maxAttempts")
            .and_then(Value::as_u64)
            .map(|n| n.clamp(1, 100) as u32)
            .unwrap_or(DEFAULT_MAX_ATTEMPTS);
        let mut merged = merged;
        crate::secret::redact(&mut merged);
        tasks.push(TaskDef {
            task_id: ids::task_id(workflow_id, &stage.name),
            stage: stage.name.clone(),
            task_type,
            depends_on: deps[i].iter().map(|&d| stages[d].name.clone()).collect(),
            spec: merged.into(),
            condition,
            max_attempts,
            selected_workers: hints.for_stage(&stage.name),
            spec_path: stage.spec_path.clone(),
        });
    }
    if !problems.is_empty() {
        return Err(finish(problems));
    }
    let metadata = doc.get("metadata");
    let text = |key: &str| metadata.and_then(|m| m.get(key)).and_then(Value::as_str).map(str::to_owned);
    Ok(Workflow {
        workflow_id: workflow_id.to_owned(),
        name: text("name").unwrap_or_else(|| workflow_id.to_owned()),
        owner: text("owner"),
        tasks,
    })
}

/// Each stage's name and merged spec, as `validate_document` expands them (no checks).
pub(crate) fn stage_specs(doc: &Value) -> Vec<(String, Value)> {
    let Some(spec) = doc.get("spec").filter(|s| s.is_object()) else {
        return Vec::new();
    };
    let (root, stages) = split_stages(spec);
    stages
        .into_iter()
        .map(|stage| {
            let merged = if stage.spec_path == "/spec" { root.clone() } else { deep_merge(&root, &stage.spec) };
            (stage.name, merged)
        })
        .collect()
}

/// Problems in a stable order: by path, then message.
fn finish(problems: BTreeSet<Problem>) -> Vec<Problem> {
    problems.into_iter().collect()
}

/// `image_classification` is the older spelling of `image_classification_training`.
pub fn canonical_task_type(task_type: &str) -> String {
    match task_type {
        "image_classification" => "image_classification_training".to_owned(),
        other => other.to_owned(),
    }
}

/// Splits `spec` into the root defaults and the stages (one implicit stage for a single task).
fn split_stages(spec: &Value) -> (Value, Vec<RawStage>) {
    let mut root: Map<String, Value> = spec.as_object().cloned().unwrap_or_default();
    let stages = root.remove("stages");
    let graph = root.remove("graph");
    // Both at once is reported by the schema (`not`), with the same words people need.
    let (list, base, is_stages) = match (&stages, &graph) {
        (Some(Value::Array(list)), _) => (list.clone(), "/spec/stages".to_owned(), true),
        (None, Some(g)) => match g.get("nodes") {
            Some(Value::Array(list)) => (list.clone(), "/spec/graph/nodes".to_owned(), false),
            _ => return (Value::Object(root), Vec::new()),
        },
        (Some(_), _) => return (Value::Object(root), Vec::new()),
        (None, None) => {
            root.remove("dependsOn");
            let single = RawStage {
                name: SINGLE_STAGE.to_owned(),
                entry_path: "/spec".to_owned(),
                spec: Value::Object(Map::new()),
                spec_path: "/spec".to_owned(),
                depends_on: None,
                condition: None,
            };
            return (Value::Object(root), vec![single]);
        }
    };
    // Root-level dependencies and conditions make no sense as defaults for every stage.
    root.remove("dependsOn");
    root.remove("condition");
    let mut out = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let entry_path = push(&base, i);
        let name = stage_name(entry, i, is_stages);
        let spec = entry.get("spec").cloned().unwrap_or_else(|| Value::Object(Map::new()));
        let spec_path = push(&entry_path, "spec");
        let mut depends_on = read_names(entry.get("dependsOn"), &push(&entry_path, "dependsOn"));
        if let Some(inner) = read_names(spec.get("dependsOn"), &push(&spec_path, "dependsOn")) {
            depends_on.get_or_insert_with(Vec::new).extend(inner);
        }
        // A stage without dependencies follows the previous one; a graph node without them is a
        // root and runs beside the other roots.
        if is_stages && depends_on.as_ref().is_none_or(Vec::is_empty) && i > 0 {
            depends_on = Some(vec![(stage_name(&list[i - 1], i - 1, is_stages), push(&entry_path, "name"))]);
        }
        let condition = entry.get("condition").map(|c| (c.clone(), push(&entry_path, "condition")));
        out.push(RawStage { name, entry_path, spec, spec_path, depends_on, condition });
    }
    (Value::Object(root), out)
}

/// A stage's name: `name`, else `id`, else `stage-N` / `node-N` counting from 1 (as FlowMesh does).
fn stage_name(entry: &Value, index: usize, is_stages: bool) -> String {
    let text = |key: &str| entry.get(key).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
    text("name")
        .or_else(|| text("id"))
        .unwrap_or_else(|| format!("{}-{}", if is_stages { "stage" } else { "node" }, index + 1))
}

fn read_names(value: Option<&Value>, path: &str) -> Option<Vec<(String, String)>> {
    let items = match value? {
        Value::Array(items) => items.clone(),
        Value::String(s) => vec![Value::String(s.clone())],
        _ => return None,
    };
    Some(items.iter().enumerate().filter_map(|(j, v)| v.as_str().map(|s| (s.to_owned(), push(path, j)))).collect())
}

/// Where the schedule hints sit in a document.
const HINT_PATH: &str = "/metadata/annotations/schedule_hint";

/// The epochs of `schedule_hint.node_execution_order` as stage indexes, when the hint is given
/// and names every stage exactly once; its problems otherwise. A flat list is one epoch.
fn execution_epochs(
    doc: &Value,
    index: &HashMap<&str, usize>,
    problems: &mut BTreeSet<Problem>,
) -> Option<Vec<Vec<usize>>> {
    let base = format!("{HINT_PATH}/node_execution_order");
    let items = crate::pointer::get(doc, &base)?.as_array()?;
    // (name, pointer) per epoch; the schema reports other shapes.
    let epochs: Vec<Vec<(&str, String)>> = if items.iter().all(Value::is_string) {
        vec![items.iter().enumerate().filter_map(|(j, v)| Some((v.as_str()?, push(&base, j)))).collect()]
    } else {
        items
            .iter()
            .enumerate()
            .map(|(k, epoch)| {
                let path = push(&base, k);
                epoch
                    .as_array()
                    .map(|names| {
                        names.iter().enumerate().filter_map(|(j, v)| Some((v.as_str()?, push(&path, j)))).collect()
                    })
                    .unwrap_or_default()
            })
            .collect()
    };
    let before = problems.len();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut out = Vec::with_capacity(epochs.len());
    for epoch in &epochs {
        let mut members = Vec::with_capacity(epoch.len());
        for (name, path) in epoch {
            match index.get(name) {
                None => {
                    problems.insert(Problem::new(path, format!("node_execution_order names unknown stage {name:?}")));
                }
                Some(_) if !seen.insert(name) => {
                    problems.insert(Problem::new(
                        path,
                        format!("node_execution_order names stage {name:?} more than once"),
                    ));
                }
                Some(&i) => members.push(i),
            }
        }
        out.push(members);
    }
    let mut missing: Vec<&str> = index.keys().copied().filter(|name| !seen.contains(name)).collect();
    missing.sort_by_key(|name| index[name]);
    if !missing.is_empty() {
        problems.insert(Problem::new(
            &base,
            format!("node_execution_order must name every stage exactly once; missing: {}", missing.join(", ")),
        ));
    }
    (problems.len() == before).then_some(out)
}

/// `selected_worker.selected` may only name stages of the workflow.
fn check_selected_stages(doc: &Value, index: &HashMap<&str, usize>, problems: &mut BTreeSet<Problem>) {
    let path = format!("{HINT_PATH}/selected_worker/selected");
    let Some(Value::Object(selected)) = crate::pointer::get(doc, &path) else {
        return;
    };
    for stage in selected.keys() {
        if !index.contains_key(stage.as_str()) {
            problems.insert(Problem::new(
                push(&path, stage.as_str()),
                format!("selected_worker names stage {stage:?}, which is not in the workflow"),
            ));
        }
    }
}

/// Kahn's algorithm, lowest `rank` first so the order is stable (the document's order, or the
/// order `node_execution_order` lists). `Err` holds the stages on cycles.
fn topological_order(deps: &[Vec<usize>], rank: &[usize]) -> Result<Vec<usize>, Vec<usize>> {
    let n = deps.len();
    let mut remaining: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut dependants: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, ds) in deps.iter().enumerate() {
        for &d in ds {
            dependants[d].push(i);
        }
    }
    let mut ready: BTreeSet<(usize, usize)> = (0..n).filter(|&i| remaining[i] == 0).map(|i| (rank[i], i)).collect();
    let mut order = Vec::with_capacity(n);
    while let Some((_, i)) = ready.pop_first() {
        order.push(i);
        for &k in &dependants[i] {
            remaining[k] -= 1;
            if remaining[k] == 0 {
                ready.insert((rank[k], k));
            }
        }
    }
    if order.len() == n { Ok(order) } else { Err((0..n).filter(|&i| remaining[i] > 0).collect()) }
}

fn check_memory(spec: &Value, locate: &dyn Fn(&str) -> String, problems: &mut BTreeSet<Problem>) {
    for pointer in ["/resources/hardware/memory", "/resources/hardware/gpu/memory"] {
        let Some(value) = crate::pointer::get(spec, pointer) else {
            continue;
        };
        if template::contains_placeholder(value) {
            continue;
        }
        if let Err(message) = units::memory_value(value) {
            // The schema's pattern says the same less helpfully; keep one message per path.
            let path = locate(pointer);
            problems.retain(|p| p.path != path);
            problems.insert(Problem::new(path, message));
        }
    }
}

fn check_ssh_inputs(
    spec: &Value,
    direct: &HashSet<&str>,
    locate: &dyn Fn(&str) -> String,
    problems: &mut BTreeSet<Problem>,
) {
    let Some(inputs) = spec.get("inputs").and_then(Value::as_array) else {
        return;
    };
    let mut mounts = HashSet::new();
    for (i, input) in inputs.iter().enumerate() {
        if let Some(stage) = input.get("stage").and_then(Value::as_str)
            && !direct.contains(stage)
        {
            problems.insert(Problem::new(
                locate(&format!("/inputs/{i}/stage")),
                format!("input names stage {stage:?}, which is not in dependsOn"),
            ));
        }
        if let Some(mount) = input.get("mountPath").and_then(Value::as_str)
            && !mounts.insert(mount.trim_end_matches('/').to_owned())
        {
            problems.insert(Problem::new(
                locate(&format!("/inputs/{i}/mountPath")),
                format!("mount path {mount:?} is used by more than one input"),
            ));
        }
    }
}

/// How an inference task will be served (SPEC §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InferenceBackend {
    Transformers,
    Vllm,
    Auto,
}

impl InferenceBackend {
    /// The name a worker advertises for the backend (`ExecutorInfo::backends`); `None` for auto,
    /// which any backend serves.
    pub fn name(self) -> Option<&'static str> {
        match self {
            InferenceBackend::Transformers => Some("transformers"),
            InferenceBackend::Vllm => Some("vllm"),
            InferenceBackend::Auto => None,
        }
    }

    /// Which spec fields select it, for explanations.
    pub fn selected_by(self) -> &'static str {
        match self {
            InferenceBackend::Transformers => "enforce_cpu or model.transformers",
            InferenceBackend::Vllm => "model.vllm or model.adapters",
            InferenceBackend::Auto => "no backend field",
        }
    }
}

/// The inference backend a spec selects: `enforce_cpu` → transformers; `model.vllm` or
/// `adapters` → vLLM; `model.transformers` → transformers; otherwise auto.
pub fn inference_backend(spec: &Value) -> InferenceBackend {
    let model = spec.get("model");
    let has = |key: &str| model.and_then(|m| m.get(key)).is_some_and(|v| !v.is_null());
    if spec.get("enforce_cpu").and_then(Value::as_bool) == Some(true) {
        InferenceBackend::Transformers
    } else if has("vllm") || has("adapters") {
        InferenceBackend::Vllm
    } else if has("transformers") {
        InferenceBackend::Transformers
    } else {
        InferenceBackend::Auto
    }
}

/// Whether an `ssh` spec is an interactive session: explicit `interactive`, else a command or
/// entrypoint makes it a batch job and authorized keys make it interactive.
pub fn ssh_interactive(spec: &Value) -> bool {
    if let Some(flag) = spec.get("interactive").and_then(Value::as_bool) {
        return flag;
    }
    let present = |key: &str| spec.get(key).is_some_and(|v| !v.is_null());
    !(present("command") || present("entrypoint")) && present("authorizedKeys")
}

/// The rules a spec must pass before it can be dispatched, on a spec whose placeholders may or
/// may not be resolved yet: a rule whose input is still a placeholder is deferred.
/// Paths are relative to the spec (`/resources/hardware/gpu/count`).
pub fn dispatch_rules(spec: &Value) -> Vec<Problem> {
    let mut problems = Vec::new();
    let deferred = |pointer: &str| crate::pointer::get(spec, pointer).is_some_and(template::contains_placeholder);
    match spec.get("taskType").and_then(Value::as_str) {
        Some("inference") => {
            if deferred("/enforce_cpu") || deferred("/model/vllm") {
                return problems;
            }
            let enforce_cpu = spec.get("enforce_cpu").and_then(Value::as_bool) == Some(true);
            let has_vllm = crate::pointer::get(spec, "/model/vllm").is_some_and(|v| !v.is_null());
            if enforce_cpu && has_vllm {
                problems.push(Problem::new(
                    "/enforce_cpu",
                    "enforce_cpu selects the transformers backend, but model.vllm asks for vLLM; remove one of them",
                ));
            }
            if inference_backend(spec) == InferenceBackend::Vllm && !deferred("/resources/hardware/gpu/count") {
                let gpus =
                    crate::pointer::get(spec, "/resources/hardware/gpu/count").and_then(Value::as_u64).unwrap_or(0);
                if gpus < 1 {
                    problems.push(Problem::new(
                        "/resources/hardware/gpu/count",
                        "the vLLM backend needs resources.hardware.gpu.count >= 1; request a GPU, or set enforce_cpu: true to run with transformers on CPU",
                    ));
                }
            }
            if let Some(adapters) = crate::pointer::get(spec, "/model/adapters").and_then(Value::as_array) {
                for (i, adapter) in adapters.iter().enumerate() {
                    let has_source =
                        ["path", "url", "task_id"].iter().any(|k| adapter.get(*k).is_some_and(|v| !v.is_null()));
                    if !has_source {
                        problems.push(Problem::new(
                            format!("/model/adapters/{i}"),
                            "an adapter needs one of path, url or task_id to say where its weights come from",
                        ));
                    }
                }
            }
        }
        Some("ssh") => {
            if deferred("/authorizedKeys") || deferred("/command") || deferred("/interactive") {
                return problems;
            }
            if ssh_interactive(spec) {
                let keys = spec.get("authorizedKeys").and_then(Value::as_array).map_or(0, Vec::len);
                if keys == 0 {
                    problems.push(Problem::new(
                        "/authorizedKeys",
                        "an interactive ssh session needs at least one entry in authorizedKeys",
                    ));
                }
                if spec.get("command").is_some_and(|v| !v.is_null()) {
                    problems.push(Problem::new(
                        "/command",
                        "an interactive ssh session takes no command; drop it, or set interactive: false for a batch job",
                    ));
                }
            }
        }
        _ => {}
    }
    problems
}

/// The dispatch-time check on a resolved spec; paths are under the stage's `spec_path`.
pub fn validate_dispatchable(spec: &Value, spec_path: &str) -> Vec<Problem> {
    let mut problems: Vec<Problem> = schema::check_task_spec(spec, spec_path);
    problems.extend(dispatch_rules(spec).into_iter().map(|p| Problem { path: schema::join(spec_path, &p.path), ..p }));
    problems
}

/// `metadata.annotations.schedule_hint.selected_worker`: a string, a list, or
/// `{global, selected: {stage: ids}}`.
struct Hints {
    global: Option<Vec<String>>,
    per_stage: BTreeMap<String, Vec<String>>,
}

impl Hints {
    fn for_stage(&self, stage: &str) -> Option<Vec<String>> {
        self.per_stage.get(stage).cloned().or_else(|| self.global.clone())
    }
}

fn selected_workers(doc: &Value) -> Hints {
    fn ids(value: &Value) -> Option<Vec<String>> {
        match value {
            Value::String(s) if !s.is_empty() => Some(vec![s.clone()]),
            Value::Array(items) => {
                let list: Vec<String> = items.iter().filter_map(Value::as_str).map(str::to_owned).collect();
                (!list.is_empty()).then_some(list)
            }
            _ => None,
        }
    }
    let hint = crate::pointer::get(doc, "/metadata/annotations/schedule_hint/selected_worker");
    let mut hints = Hints { global: None, per_stage: BTreeMap::new() };
    match hint {
        Some(Value::Object(map)) => {
            hints.global = map.get("global").and_then(ids);
            if let Some(Value::Object(selected)) = map.get("selected") {
                for (stage, value) in selected {
                    if let Some(list) = ids(value) {
                        hints.per_stage.insert(stage.clone(), list);
                    }
                }
            }
        }
        Some(other) => hints.global = ids(other),
        None => {}
    }
    hints
}
