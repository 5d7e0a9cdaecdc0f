//! FlowMesh's n8n-style JSON workflows: translated to the equivalent graph, or rejected with a
//! problem per node that says what is unsupported.

use flowmesh_domain::n8n::{is_n8n, stage_name, translate};
use flowmesh_domain::validate_submission;
use serde_json::{Value, json};

fn example(name: &str) -> Vec<u8> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/n8n").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn translated(name: &str) -> Value {
    let doc: Value = serde_json::from_slice(&example(name)).unwrap();
    assert!(is_n8n(&doc));
    translate(&doc).unwrap_or_else(|p| panic!("{name}: {p:#?}"))
}

fn node<'a>(doc: &'a Value, stage: &str) -> &'a Value {
    doc["spec"]["graph"]["nodes"].as_array().unwrap().iter().find(|n| n["name"] == stage).unwrap()
}

#[test]
fn a_fan_in_of_two_inferences_becomes_a_graph_with_two_roots_and_a_join() {
    let doc = translated("fan_in_synthesis.json");
    let names: Vec<&str> =
        doc["spec"]["graph"]["nodes"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["Inference-A", "Inference-B", "Synthesis"]);
    assert!(node(&doc, "Inference-A").get("dependsOn").is_none(), "a root");
    assert_eq!(node(&doc, "Synthesis")["dependsOn"], json!(["Inference-A", "Inference-B"]));
    let a = &node(&doc, "Inference-A")["spec"];
    assert_eq!(a["taskType"], "inference");
    assert_eq!(a["model"]["source"], json!({"type": "huggingface", "identifier": "Qwen/Qwen3-0.6B"}));
    assert_eq!(a["model"]["vllm"]["gpu_memory_utilization"], 0.85);
    assert_eq!(a["resources"]["hardware"]["gpu"]["count"], 1, "read despite n8n's stray backslash");
    assert_eq!(a["inference"], json!({"max_tokens": 96, "temperature": 0.7, "top_k": 1, "top_p": 0.95}));
    assert_eq!(a["data"]["items"][0], "Name two benefits of solar power.");
    let s = &node(&doc, "Synthesis")["spec"];
    assert_eq!(s["data"]["template"]["columns"][1]["node"], "Inference-B", "references follow the renaming");
    assert!(s["inference"]["system_prompt"].as_str().unwrap().starts_with("Weigh"));
    assert_eq!(doc["metadata"]["name"], "fan-in-synthesis");

    let wf = validate_submission(&example("fan_in_synthesis.json"), "wf-1").expect("it validates");
    let order: Vec<(&str, Vec<String>)> = wf.tasks.iter().map(|t| (t.stage.as_str(), t.depends_on.clone())).collect();
    assert_eq!(order[2], ("Synthesis", vec!["Inference-A".to_owned(), "Inference-B".to_owned()]));
}

#[test]
fn a_checkpoint_node_makes_the_inference_load_the_trained_model() {
    let doc = translated("sft_then_inference.json");
    let inference = node(&doc, "Inference");
    assert_eq!(inference["dependsOn"], json!(["SFT"]));
    assert_eq!(inference["spec"]["checkpoint"], json!({"load": {"type": "http", "url": "${SFT.final_model_archive}"}}));
    assert_eq!(inference["spec"]["data"]["items"][0], "What is 12 times 7?");
    let sft = &node(&doc, "SFT")["spec"];
    assert_eq!((sft["taskType"].as_str(), sft["training"]["num_train_epochs"].as_u64()), (Some("sft"), Some(1)));
    assert_eq!(sft["data"]["dataset_name"], "openai/gsm8k");
    validate_submission(&example("sft_then_inference.json"), "wf-1").expect("it validates");
}

#[test]
fn what_cannot_be_translated_is_named_node_by_node() {
    let problems = validate_submission(&example("unsupported_openai.json"), "wf-1").expect_err("rejected");
    let at = |path: &str, fragment: &str| {
        assert!(
            problems.iter().any(|p| p.path == path && p.message.contains(fragment)),
            "expected {path} saying {fragment:?}: {problems:#?}"
        )
    };
    at("/nodes/1/type", "\"Basic LLM Chain\" calls an OpenAI-style API");
    at("/nodes/3/type", "\"Message a model\" calls an OpenAI-style API");
    at("/nodes/4/type", "\"n8n-nodes-base.emailSend\", which FlowMesh does not translate");
}

/// (name, n8n document, expected problem path, message fragment)
#[test]
fn malformed_exports_are_rejected_with_their_paths() {
    let hf = json!({"name": "M", "type": "@n8n/n8n-nodes-langchain.lmOpenHuggingFaceInference", "parameters": {"model": "m"}});
    let chain = |name: &str, notes: &str| json!({"name": name, "type": "@n8n/n8n-nodes-langchain.chainLlm", "parameters": {}, "notes": notes});
    let lm = |to: &str| json!({"ai_languageModel": [[{"node": to, "type": "ai_languageModel", "index": 0}]]});
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "a chain without a taskType",
            json!({"nodes": [chain("A", ""), hf], "connections": {"M": lm("A")}}),
            "/nodes/0/notes",
            "needs notes like",
        ),
        (
            "a chain without a model",
            json!({"nodes": [chain("A", r#"{"taskType":"inference"}"#)], "connections": {}}),
            "/nodes/0",
            "no model connection",
        ),
        (
            "a set node that is not raw JSON",
            json!({"nodes": [chain("A", r#"{"taskType":"inference"}"#), hf,
                {"name": "Input", "type": "n8n-nodes-base.set", "parameters": {"mode": "manual"}}],
                "connections": {"M": lm("A"), "Input": {"main": [[{"node": "A"}]]}}}),
            "/nodes/2/parameters/mode",
            "mode \"raw\"",
        ),
        (
            "a fragment whose name says nothing",
            json!({"nodes": [chain("A", r#"{"taskType":"inference"}"#), hf,
                {"name": "Misc", "type": "n8n-nodes-base.set", "parameters": {"mode": "raw", "jsonOutput": "{}"}}],
                "connections": {"M": lm("A"), "Misc": {"main": [[{"node": "A"}]]}}}),
            "/nodes/2/name",
            "does not say which field",
        ),
        (
            "a connection to a node that does not exist",
            json!({"nodes": [chain("A", r#"{"taskType":"inference"}"#), hf], "connections": {"M": lm("Z")}}),
            "/connections/M/ai_languageModel",
            "unknown n8n node \"Z\"",
        ),
        (
            "no task at all",
            json!({"nodes": [{"name": "T", "type": "n8n-nodes-base.manualTrigger", "parameters": {}}], "connections": {}}),
            "/nodes",
            "no task node",
        ),
    ];
    for (name, doc, path, fragment) in cases {
        let problems = validate_submission(doc.to_string().as_bytes(), "wf-1").expect_err(name);
        assert!(
            problems.iter().any(|p| p.path == path && p.message.contains(fragment)),
            "{name}: expected {path} saying {fragment:?}, got {problems:#?}"
        );
    }
}

#[test]
fn node_names_become_stage_names() {
    for (name, stage) in
        [("Inference A", "Inference-A"), ("SFT", "SFT"), ("  Step #2 (final) ", "Step-2-final"), ("a_b", "a_b")]
    {
        assert_eq!(stage_name(name), stage, "{name}");
    }
}
