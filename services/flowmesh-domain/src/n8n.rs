//! FlowMesh's n8n-style JSON workflows (an n8n editor export: `nodes` and `connections`),
//! translated to the equivalent `flowmesh/v1` document, as FlowMesh's own server does:
//!
//! - an LLM chain node (`chainLlm`) wired to a Hugging Face model node is a task; its `notes`
//!   hold `{"taskType": …}`, its prompt text becomes `inference.system_prompt`;
//! - raw "Set" nodes feeding a task are spec fragments, chosen by the start of their name:
//!   `Data`/`Input`/`Format` → `data`, `Resource` → `resources`, `Training` → `training`,
//!   `Runtime` → `model.vllm`, `Omni` → `omni`, `Checkpoint` → load the upstream task's
//!   `final_model_archive`;
//! - a task depends on the tasks upstream of it, through any fragment nodes between them; a
//!   task with none is a graph root.
//!
//! What FlowMesh on NATS cannot run — OpenAI/API nodes (they carry n8n credentials), node types
//! it does not know — is reported, one problem per node, naming the node and what to do.

use crate::problem::{Problem, push};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};

const SET: &str = "n8n-nodes-base.set";
const CHAIN: &str = "@n8n/n8n-nodes-langchain.chainLlm";
const HF_MODEL: &str = "@n8n/n8n-nodes-langchain.lmOpenHuggingFaceInference";
const OPENAI_MODEL: &str = "@n8n/n8n-nodes-langchain.lmChatOpenAi";
const OPENAI: &str = "@n8n/n8n-nodes-langchain.openAi";
/// Nodes that only matter inside n8n's editor.
const IGNORED: [&str; 2] = ["n8n-nodes-base.manualTrigger", "n8n-nodes-base.stickyNote"];

/// Whether a decoded document is an n8n export rather than a `flowmesh/v1` document.
pub fn is_n8n(doc: &Value) -> bool {
    doc.get("nodes").is_some_and(Value::is_array)
        && doc.get("connections").is_some_and(Value::is_object)
        && doc.get("apiVersion").is_none()
        && doc.get("spec").is_none()
}

struct Node<'a> {
    name: &'a str,
    kind: &'a str,
    parameters: &'a Value,
    raw: &'a Value,
    path: String,
}

/// A stage name for an n8n node name: letters, digits, `-` and `_` (`Inference A` → `Inference-A`).
pub fn stage_name(node_name: &str) -> String {
    let mut out = String::new();
    for c in node_name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_end_matches('-');
    out.chars().take(63).collect()
}

/// Translates an n8n export to a `flowmesh/v1` document, or says what it cannot translate.
pub fn translate(doc: &Value) -> Result<Value, Vec<Problem>> {
    let mut problems: BTreeSet<Problem> = BTreeSet::new();
    let nodes = read_nodes(doc, &mut problems);
    let by_name: HashMap<&str, &Node<'_>> = nodes.iter().map(|n| (n.name, n)).collect();
    let incoming = read_connections(doc, &by_name, &mut problems);
    let sources = |name: &str| incoming.get(name).map(Vec::as_slice).unwrap_or_default();

    // Which nodes are tasks, and which cannot be translated at all.
    let mut tasks: Vec<&Node<'_>> = Vec::new();
    for node in &nodes {
        match node.kind {
            CHAIN => {
                let models: Vec<&str> = sources(node.name)
                    .iter()
                    .filter(|(_, via)| via == "ai_languageModel")
                    .map(|(source, _)| by_name.get(source.as_str()).map_or("", |m| m.kind))
                    .collect();
                match models.as_slice() {
                    [HF_MODEL] => tasks.push(node),
                    [OPENAI_MODEL] => {
                        problems.insert(api_unsupported(node));
                    }
                    [] => {
                        problems.insert(Problem::new(
                            &node.path,
                            format!("n8n chain node {:?} has no model connection (ai_languageModel)", node.name),
                        ));
                    }
                    _ => {
                        problems.insert(Problem::new(
                            &node.path,
                            format!("n8n chain node {:?} needs exactly one Hugging Face model connection", node.name),
                        ));
                    }
                }
            }
            OPENAI => {
                problems.insert(api_unsupported(node));
            }
            SET if node.parameters.get("mode").and_then(Value::as_str) != Some("raw") => {
                problems.insert(Problem::new(
                    push(&push(&node.path, "parameters"), "mode"),
                    format!("n8n set node {:?} must use mode \"raw\" (a JSON fragment)", node.name),
                ));
            }
            SET | HF_MODEL | OPENAI_MODEL => {}
            kind if IGNORED.contains(&kind) => {}
            kind => {
                problems.insert(Problem::new(
                    push(&node.path, "type"),
                    format!(
                        "n8n node {:?} has type {kind:?}, which FlowMesh does not translate; supported: LLM chains with a Hugging Face model, raw Set nodes, manual triggers",
                        node.name
                    ),
                ));
            }
        }
    }
    if tasks.is_empty() && problems.is_empty() {
        problems.insert(Problem::new(
            "/nodes",
            "the n8n workflow has no task node (an LLM chain with a Hugging Face model)",
        ));
    }
    let task_names: BTreeSet<&str> = tasks.iter().map(|n| n.name).collect();
    let mut slugs: BTreeMap<&str, String> = BTreeMap::new();
    let mut taken: HashMap<String, &str> = HashMap::new();
    for node in &tasks {
        let slug = stage_name(node.name);
        if let Some(other) = taken.insert(slug.clone(), node.name) {
            problems.insert(Problem::new(
                push(&node.path, "name"),
                format!("n8n nodes {other:?} and {:?} both become stage {slug:?}; rename one", node.name),
            ));
        }
        slugs.insert(node.name, slug);
    }

    let mut entries = Vec::new();
    for node in &tasks {
        let spec = task_spec(node, &by_name, &incoming, &task_names, &slugs, &mut problems);
        let mut depends_on: Vec<String> = Vec::new();
        for upstream in upstream_tasks(node.name, &incoming, &task_names) {
            let slug = slugs[upstream].clone();
            if !depends_on.contains(&slug) {
                depends_on.push(slug);
            }
        }
        entries.push((slugs[node.name].clone(), spec, depends_on));
    }
    if !problems.is_empty() {
        return Err(problems.into_iter().collect());
    }
    let spec = match entries.as_slice() {
        [(_, spec, _)] => spec.clone(),
        _ => {
            let nodes: Vec<Value> = entries
                .into_iter()
                .map(|(name, spec, deps)| {
                    let mut entry = json!({"name": name, "spec": spec});
                    if !deps.is_empty() {
                        entry["dependsOn"] = json!(deps);
                    }
                    entry
                })
                .collect();
            json!({"graph": {"nodes": nodes}})
        }
    };
    let name = doc.get("name").and_then(Value::as_str).filter(|s| !s.is_empty()).unwrap_or("n8n-workflow");
    Ok(json!({
        "apiVersion": "flowmesh/v1",
        "kind": "InferenceTask",
        "metadata": {"name": name, "owner": "n8n", "annotations": {"description": "translated from an n8n workflow"}},
        "spec": spec,
    }))
}

fn api_unsupported(node: &Node<'_>) -> Problem {
    Problem::new(
        push(&node.path, "type"),
        format!(
            "n8n node {:?} calls an OpenAI-style API with n8n credentials, which FlowMesh on NATS does not translate; write it as a flowmesh/v1 `api` task",
            node.name
        ),
    )
}

fn read_nodes<'a>(doc: &'a Value, problems: &mut BTreeSet<Problem>) -> Vec<Node<'a>> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, raw) in doc["nodes"].as_array().into_iter().flatten().enumerate() {
        let path = push("/nodes", i);
        let text = |key: &str| raw.get(key).and_then(Value::as_str);
        match (text("name"), text("type"), raw.get("parameters").filter(|p| p.is_object())) {
            (Some(name), Some(kind), Some(parameters)) => {
                if !seen.insert(name) {
                    problems.insert(Problem::new(push(&path, "name"), format!("n8n node name {name:?} is used twice")));
                }
                out.push(Node { name, kind, parameters, raw, path });
            }
            _ => {
                problems.insert(Problem::new(
                    path,
                    "an n8n node needs a string `name`, a string `type` and an object `parameters`",
                ));
            }
        }
    }
    out
}

/// Destination node name → (source node name, connection type).
fn read_connections(
    doc: &Value,
    by_name: &HashMap<&str, &Node<'_>>,
    problems: &mut BTreeSet<Problem>,
) -> HashMap<String, Vec<(String, String)>> {
    let mut incoming: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for (source, kinds) in doc["connections"].as_object().into_iter().flatten() {
        let path = push("/connections", source.as_str());
        if !by_name.contains_key(source.as_str()) {
            problems.insert(Problem::new(&path, format!("connection from unknown n8n node {source:?}")));
            continue;
        }
        for (via, outputs) in kinds.as_object().into_iter().flatten() {
            let targets = outputs.as_array().into_iter().flatten().flat_map(|o| o.as_array().into_iter().flatten());
            for target in targets {
                match target.get("node").and_then(Value::as_str) {
                    Some(dest) if by_name.contains_key(dest) => {
                        incoming.entry(dest.to_owned()).or_default().push((source.clone(), via.clone()));
                    }
                    other => {
                        problems.insert(Problem::new(
                            push(&path, via.as_str()),
                            format!("connection from {source:?} to unknown n8n node {:?}", other.unwrap_or("")),
                        ));
                    }
                }
            }
        }
    }
    incoming
}

/// The task nodes upstream of `name`, through any non-task nodes between them.
fn upstream_tasks<'a>(
    name: &str,
    incoming: &'a HashMap<String, Vec<(String, String)>>,
    tasks: &BTreeSet<&str>,
) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut stack: Vec<&str> = incoming.get(name).into_iter().flatten().map(|(s, _)| s.as_str()).collect();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    while let Some(source) = stack.pop() {
        if !seen.insert(source) {
            continue;
        }
        if tasks.contains(source) {
            out.push(source);
        } else {
            stack.extend(incoming.get(source).into_iter().flatten().map(|(s, _)| s.as_str()));
        }
    }
    out.sort();
    out
}

/// A Set node's JSON fragment. n8n exports sometimes escape a quote that needs none (`\"key"`);
/// such a fragment is read with the stray backslashes dropped.
fn fragment(node: &Node<'_>) -> Result<Value, Problem> {
    let path = push(&push(&node.path, "parameters"), "jsonOutput");
    let text = node
        .parameters
        .get("jsonOutput")
        .and_then(Value::as_str)
        .ok_or_else(|| Problem::new(&path, format!("n8n set node {:?} has no jsonOutput text", node.name)))?;
    serde_json::from_str(text).or_else(|first| {
        serde_json::from_str(&text.replace("\\\"", "\""))
            .map_err(|_| Problem::new(&path, format!("n8n set node {:?}: jsonOutput is not JSON ({first})", node.name)))
    })
}

/// Replaces n8n node names in `{"node": NAME}` references by their stage names.
fn rename_nodes(value: &mut Value, slugs: &BTreeMap<&str, String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(node)) = map.get_mut("node")
                && let Some(slug) = slugs.get(node.as_str())
            {
                *node = slug.clone();
            }
            map.values_mut().for_each(|v| rename_nodes(v, slugs));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rename_nodes(v, slugs)),
        _ => {}
    }
}

fn task_spec(
    node: &Node<'_>,
    by_name: &HashMap<&str, &Node<'_>>,
    incoming: &HashMap<String, Vec<(String, String)>>,
    tasks: &BTreeSet<&str>,
    slugs: &BTreeMap<&str, String>,
    problems: &mut BTreeSet<Problem>,
) -> Value {
    let mut spec = Map::new();
    let notes = node.raw.get("notes").and_then(Value::as_str).unwrap_or("");
    match serde_json::from_str::<Value>(notes)
        .ok()
        .and_then(|n| n.get("taskType").and_then(Value::as_str).map(str::to_owned))
    {
        Some(task_type) if !task_type.is_empty() => {
            spec.insert("taskType".into(), Value::String(task_type));
        }
        _ => {
            problems.insert(Problem::new(
                push(&node.path, "notes"),
                format!("n8n chain node {:?} needs notes like {{\"taskType\": \"inference\"}}", node.name),
            ));
        }
    }
    let mut model = Map::new();
    let mut inference = Map::new();
    for (source, _) in incoming.get(node.name).into_iter().flatten() {
        let Some(source) = by_name.get(source.as_str()) else { continue };
        match source.kind {
            HF_MODEL => {
                let id = source.parameters.get("model").cloned().unwrap_or(Value::Null);
                model.insert("source".into(), json!({"type": "huggingface", "identifier": id}));
                let options = source.parameters.get("options");
                for (from, to) in
                    [("maxTokens", "max_tokens"), ("temperature", "temperature"), ("topK", "top_k"), ("topP", "top_p")]
                {
                    if let Some(v) = options.and_then(|o| o.get(from)) {
                        inference.insert(to.into(), v.clone());
                    }
                }
            }
            SET => {
                let mut value = match fragment(source) {
                    Ok(v) => v,
                    Err(p) => {
                        problems.insert(p);
                        continue;
                    }
                };
                let name = source.name;
                let key = if ["Data", "Input", "Format"].iter().any(|p| name.starts_with(p)) {
                    "data"
                } else if name.starts_with("Resource") {
                    "resources"
                } else if name.starts_with("Training") {
                    "training"
                } else if name.starts_with("Runtime") {
                    model.insert("vllm".into(), value);
                    continue;
                } else if name.starts_with("Omni") {
                    "omni"
                } else if name.starts_with("Checkpoint") {
                    let parents: Vec<&str> =
                        incoming.get(name).into_iter().flatten().map(|(s, _)| s.as_str()).collect();
                    match parents.as_slice() {
                        [parent] if tasks.contains(parent) => {
                            let url = format!("${{{}.final_model_archive}}", slugs[parent]);
                            value = json!({"load": {"type": "http", "url": url}});
                            "checkpoint"
                        }
                        _ => {
                            problems.insert(Problem::new(
                                &source.path,
                                format!("n8n checkpoint node {name:?} must have exactly one input, a task node"),
                            ));
                            continue;
                        }
                    }
                } else {
                    problems.insert(Problem::new(
                        push(&source.path, "name"),
                        format!(
                            "n8n set node {name:?} feeds {:?} but its name does not say which field it sets (Data, Input, Format, Resource, Training, Runtime, Omni or Checkpoint …)",
                            node.name
                        ),
                    ));
                    continue;
                };
                if key == "data" && spec.contains_key("data") {
                    problems.insert(Problem::new(
                        &source.path,
                        format!("n8n chain node {:?} has more than one Data/Input/Format node", node.name),
                    ));
                    continue;
                }
                rename_nodes(&mut value, slugs);
                spec.insert(key.into(), value);
            }
            _ => {}
        }
    }
    if let Some(text) = node.parameters.get("text").and_then(Value::as_str).map(str::trim).filter(|t| !t.is_empty()) {
        inference.insert("system_prompt".into(), Value::String(text.to_owned()));
    }
    if !model.is_empty() {
        spec.insert("model".into(), Value::Object(model));
    }
    if !inference.is_empty() {
        spec.insert("inference".into(), Value::Object(inference));
    }
    Value::Object(spec)
}
