//! ML runners through the whole stack: a worker that asks `flowmesh_runners` what initialised,
//! real tiny models (built here, random weights), inference, and SFT → inference by placeholder.
//! The tests that need torch skip, saying so, when the ML dependencies are not installed
//! (`./tools/install-deps.sh --ml`); CI installs them.

use flowmesh_domain::EventBody;
use flowmesh_domain::event::{Event, FailureReason};
use flowmesh_domain::fleet::WorkerSnapshot;
use flowmesh_worker::Config;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tests::{World, kinds, worker_config};

/// Model loading and training on two shared cores, with the other ML scenarios running at the same
/// time, take far longer than the harness's usual deadline (about 200 s for all four here).
const ML_DEADLINE: Duration = Duration::from_secs(480);

fn runners_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../services/flowmesh-runners")
}

/// An interpreter wrapper, as `FLOWMESH_RUNNERS`, that finds the package in the checkout and
/// the tiny models through the model map (`extra` goes before the script's arguments).
fn interpreter(dir: &Path, model_map: Option<&Path>, extra: &str) -> anyhow::Result<String> {
    let path = dir.join(format!("python{}", if extra.is_empty() { "" } else { "-bare" }));
    let map = model_map.map(|m| format!("export FLOWMESH_MODEL_MAP='{}'\n", m.display())).unwrap_or_default();
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nexport PYTHONPATH='{}'\nexport HF_HUB_OFFLINE=1\n{map}exec python3 {extra} \"$@\"\n",
            runners_dir().display()
        ),
    )?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(path.display().to_string())
}

/// Builds the tiny models once per test, or says why the test is skipped.
fn tiny_models(dir: &Path) -> Option<PathBuf> {
    let check =
        std::process::Command::new("python3").args(["-c", "import torch, transformers, peft, trl, datasets"]).output();
    if !check.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: the ML dependencies are not installed (run ./tools/install-deps.sh --ml)");
        return None;
    }
    let out = std::process::Command::new("python3")
        .args(["-m", "flowmesh_runners.tiny"])
        .arg(dir.join("models"))
        .env("PYTHONPATH", runners_dir())
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "building tiny models failed: {}", String::from_utf8_lossy(&out.stderr));
    Some(dir.join("models/models.json"))
}

const ML_TYPES: [&str; 7] = ["inference", "sft", "lora_sft", "dpo", "ppo", "embedding", "rag"];

fn initialising(snap: &WorkerSnapshot) -> bool {
    snap.executors.iter().any(|e| e.unavailable.as_deref().is_some_and(|r| r.starts_with("initialising")))
}

/// Starts the worker and follows every snapshot it publishes until its runners have answered
/// (the probe runs in the background). Every snapshot before that lists the runners as
/// initialising and advertises no ML type: a type is advertised only once its runner initialised.
async fn start_and_wait_for_runners(world: &mut World, config: Config) -> anyhow::Result<WorkerSnapshot> {
    use futures_util::StreamExt;
    let id = config.worker_id.clone();
    let mut watch = world.handles.workers.watch(&id).await?;
    world.worker(config).await?;
    let deadline = tokio::time::Instant::now() + ML_DEADLINE;
    let mut before = 0;
    loop {
        let entry = tokio::time::timeout_at(deadline, watch.next())
            .await
            .map_err(|_| anyhow::anyhow!("{id}: its runners never answered ({before} snapshots)"))?
            .ok_or_else(|| anyhow::anyhow!("the watch of {id} ended"))??;
        if entry.operation != async_nats::jetstream::kv::Operation::Put {
            continue;
        }
        let snap: WorkerSnapshot = serde_json::from_slice(&entry.value)?;
        if initialising(&snap) {
            let early: Vec<&String> =
                snap.supported_task_types.iter().filter(|t| ML_TYPES.contains(&t.as_str())).collect();
            assert!(early.is_empty(), "{id} advertised {early:?} before its runners initialised");
            before += 1;
            continue;
        }
        assert!(before > 0, "{id} published a snapshot before its runners answered, without waiting for them");
        return Ok(snap);
    }
}

/// Waits for the workflow's end for up to `ML_DEADLINE` (the recorder is polled, as `wait_for` does).
async fn wait_end(world: &World, wf: &str) -> anyhow::Result<Vec<Event>> {
    let deadline = tokio::time::Instant::now() + ML_DEADLINE;
    loop {
        let events: Vec<Event> = world.events().into_iter().filter(|e| e.body.scope().0 == wf).collect();
        if events.iter().any(|e| tests::workflow_ended(e, wf) || tests::rejected(e, wf)) {
            return Ok(events);
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "{wf} did not end: {:?}", kinds(&events));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn result_of(events: &[Event], stage: &str) -> Value {
    events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::TaskCompleted(c) if c.task.stage == stage => c.result.clone(),
            _ => None,
        })
        .unwrap_or_else(|| panic!("stage {stage} did not complete: {events:#?}"))
}

fn progress_of(events: &[Event], stage: &str) -> Vec<Value> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TaskUpdated(u) if u.task.stage == stage => u.data.as_ref()?.get("progress").cloned(),
            _ => None,
        })
        .collect()
}

async fn ml_world(dir_name: &str, model_map: &Path) -> anyhow::Result<World> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    let mut config = worker_config(&world, dir_name, None);
    config.runners_python = Some(interpreter(world.dir.path(), Some(model_map), "")?);
    let snap = start_and_wait_for_runners(&mut world, config).await?;
    for t in ["inference", "sft", "lora_sft", "dpo", "ppo"] {
        assert!(snap.supported_task_types.contains(&t.to_owned()), "{t} advertised: {:?}", snap.supported_task_types);
    }
    let transformers = snap.executors.iter().find(|e| e.name == "transformers").expect("the transformers runner");
    assert_eq!(transformers.backends, ["transformers"], "its backend is advertised for placement");
    Ok(world)
}

const INFERENCE: &str = r#"
apiVersion: flowmesh/v1
kind: InferenceTask
metadata: {name: tiny-inference}
spec:
  taskType: inference
  enforce_cpu: true
  resources: {hardware: {cpu: 1}}
  model: {source: {type: huggingface, identifier: sshleifer/tiny-gpt2}}
  data: {type: list, items: ["the scheduler placed the task on", "why write tests ?"]}
  inference: {max_tokens: 8, min_tokens: 8, temperature: 0.0}
"#;

#[tokio::test]
#[ignore = "long suite: ./tools/test.sh --long"]
async fn an_inference_task_generates_text_with_a_real_tiny_model() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let Some(map) = tiny_models(scratch.path()) else { return Ok(()) };
    let world = ml_world("ml-1", &map).await?;
    let wf = world.submit(INFERENCE.as_bytes(), None).await?;
    let events = wait_end(&world, &wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{events:#?}");
    let result = result_of(&events, "main");
    assert_eq!(result["backend"], "transformers");
    let items = result["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    for item in items {
        assert_eq!(item["completion_tokens"], 8, "{item}");
        assert!(!item["output"].as_str().unwrap().trim().is_empty(), "generated text: {item}");
    }
    assert_eq!(result["usage"]["completion_tokens"], 16);
    assert!(result["usage"]["prompt_tokens"].as_u64().unwrap() >= 8);
    let progress = progress_of(&events, "main");
    assert!(progress.iter().any(|p| p["tokens_per_second"].as_f64().is_some_and(|t| t > 0.0)), "{progress:?}");
    // What `workflow watch` draws for the stage: the folded progress as a bar.
    let mut state = flowmesh_domain::state::State::default();
    for e in &world.events() {
        state.apply(e);
    }
    let kept = state.task(&format!("{wf}-main")).and_then(|t| t.progress.clone()).expect("progress folded");
    let bar = flowmesh::submit::progress_bar(&kept).expect("a bar");
    assert!(bar.starts_with("[##########] item 2/2") && bar.contains("tokens/s"), "{bar}");
    world.shutdown().await;
    Ok(())
}

const SFT_THEN_INFERENCE: &str = r#"
apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: tiny-sft-then-infer}
spec:
  model: {source: {type: huggingface, identifier: meta-llama/Llama-3.2-1B-Instruct}}
  resources: {hardware: {cpu: 1}}
  stages:
    - name: train
      spec:
        taskType: lora_sft
        lora: {r: 4, alpha: 8, target_modules: [q_proj, v_proj]}
        data:
          samples:
            - {prompt: "how should i name variables ?", response: "use short descriptive names"}
            - {prompt: "why write tests ?", response: "tests catch regressions early"}
        training: {max_steps: 2, batch_size: 2, learning_rate: 0.001}
        output: {artifacts: [results.json, final_lora]}
    - name: infer
      dependsOn: [train]
      spec:
        taskType: inference
        enforce_cpu: true
        checkpoint: {load: {type: local, path: "${train.final_model_archive}"}}
        data: {type: list, items: ["why write tests ?"]}
        inference: {max_tokens: 5, min_tokens: 5}
"#;

#[tokio::test]
#[ignore = "long suite: ./tools/test.sh --long"]
async fn a_trained_adapter_flows_to_inference_through_a_placeholder() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let Some(map) = tiny_models(scratch.path()) else { return Ok(()) };
    let world = ml_world("ml-2", &map).await?;
    let wf = world.submit(SFT_THEN_INFERENCE.as_bytes(), None).await?;
    let events = wait_end(&world, &wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{events:#?}");

    let train = result_of(&events, "train");
    assert_eq!(train["global_step"], 2);
    let losses = train["losses"].as_array().unwrap();
    assert_eq!(losses.len(), 2, "{train}");
    assert!(losses.iter().all(|l| l.as_f64().is_some_and(|l| l.is_finite() && l > 0.0)), "{train}");
    assert_eq!(train["adapter"], true);
    let uploaded: Vec<String> = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::TaskCompleted(c) if c.task.stage == "train" => {
                Some(c.artifacts.iter().map(|a| a.name.clone()).collect())
            }
            _ => None,
        })
        .unwrap();
    assert!(uploaded.contains(&"final_lora/adapter_model.safetensors".to_owned()), "{uploaded:?}");
    let steps = progress_of(&events, "train");
    assert!(
        steps.iter().any(|p| p["step"] == 2 && p["loss"].is_number() && p["learning_rate"].is_number()),
        "{steps:?}"
    );

    let infer = result_of(&events, "infer");
    let adapters = infer["adapters"].as_array().unwrap();
    assert_eq!(adapters.len(), 1, "{infer}");
    assert!(adapters[0].as_str().unwrap().ends_with("inputs/train/final_lora"), "{infer}");
    assert_eq!(infer["items"][0]["completion_tokens"], 5);
    assert!(!infer["items"][0]["output"].as_str().unwrap().trim().is_empty());
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_worker_whose_runners_cannot_import_torch_never_receives_inference() -> anyhow::Result<()> {
    // `python3 -S` has no site-packages: the runner package imports, torch does not.
    let mut world = World::start().await?;
    world.control_plane().await?;
    let mut config = worker_config(&world, "no-torch", None);
    config.runners_python = Some(interpreter(world.dir.path(), None, "-S")?);
    let snap = start_and_wait_for_runners(&mut world, config).await?;
    assert!(!snap.supported_task_types.contains(&"inference".to_owned()), "{:?}", snap.supported_task_types);
    let transformers = snap.executors.iter().find(|e| e.name == "transformers").expect("listed by name");
    assert!(transformers.task_types.is_empty());
    assert!(transformers.unavailable.as_deref().is_some_and(|r| r.contains("torch")), "{transformers:?}");
    let problems = flowmesh_domain::schema::check_worker(&serde_json::to_value(&snap)?);
    assert!(problems.is_empty(), "the snapshot matches schemas/worker.schema.json: {problems:?}");

    let wf = world.submit(INFERENCE.as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert!(!kinds(&events).contains(&"task.dispatched"), "never sent to a worker that cannot run it");
    assert!(tests::failed_for(&events, FailureReason::NoEligibleWorker), "{:?}", kinds(&events));
    world.shutdown().await;
    Ok(())
}

const LONG_TRAINING: &str = r#"
apiVersion: flowmesh/v1
kind: TrainingTask
metadata: {name: long-sft}
spec:
  taskType: sft
  model: {source: {type: huggingface, identifier: meta-llama/Llama-3.2-1B-Instruct}}
  data:
    samples:
      - {prompt: "why write tests ?", response: "tests catch regressions early"}
  training: {max_steps: 1000000, batch_size: 1}
"#;

/// Whether any process still runs inside `dir` (its working directory).
fn processes_in(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Ok(cwd) = std::fs::read_link(entry.path().join("cwd"))
            && cwd.starts_with(dir)
        {
            found.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    found
}

#[tokio::test]
#[ignore = "long suite: ./tools/test.sh --long"]
async fn cancelling_a_training_run_kills_its_runner_process() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let Some(map) = tiny_models(scratch.path()) else { return Ok(()) };
    let world = ml_world("ml-3", &map).await?;
    let wf = world.submit(LONG_TRAINING.as_bytes(), None).await?;
    let task = format!("{wf}-main");
    let deadline = tokio::time::Instant::now() + ML_DEADLINE;
    // Training is under way once a step's loss is reported.
    while progress_of(&world.events(), "main").iter().all(|p| !p["loss"].is_number()) {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "no training step reported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let work_dir = world.dir.path().join("results").join("ml-3").join(&task);
    assert!(!processes_in(&work_dir).is_empty(), "the runner runs in {}", work_dir.display());
    let out = world.cli(&["workflow", "cancel", &wf]).await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let events = wait_end(&world, &wf).await?;
    assert!(
        events.iter().any(|e| matches!(&e.body, EventBody::TaskCancelled(c) if c.worker_id.as_deref() == Some("ml-3"))),
        "{events:#?}"
    );
    assert_eq!(processes_in(&work_dir), Vec::<String>::new(), "the runner's process group was killed");
    world.shutdown().await;
    Ok(())
}

/// The probe's answer is remembered under the package's fingerprint and the machine's GPUs: a
/// second ask with the same interpreter, packages and GPUs reads it back instead of importing
/// everything again; other GPUs (or another interpreter) probe afresh. `python3 -S` keeps it quick.
#[tokio::test]
async fn a_probe_is_remembered_per_interpreter_packages_and_gpus() -> anyhow::Result<()> {
    use flowmesh_worker::executor::runner::{Source, probe};
    let dir = tempfile::tempdir()?;
    let python = interpreter(dir.path(), None, "-S")?;
    let cache = dir.path().join("cache");
    let (ready, missing, source) = probe(&python, Some(&cache), "gpus=[]").await.map_err(anyhow::Error::msg)?;
    assert_eq!(source, Source::Probed);
    assert!(ready.is_empty(), "nothing imports torch without site-packages");
    assert!(missing.iter().any(|u| u.name == "transformers" && u.reason.contains("torch")), "{missing:?}");
    let files: Vec<_> = std::fs::read_dir(&cache)?.flatten().map(|e| e.file_name()).collect();
    assert_eq!(files.len(), 1, "one remembered answer: {files:?}");

    let (_, again, source) = probe(&python, Some(&cache), "gpus=[]").await.map_err(anyhow::Error::msg)?;
    assert_eq!(source, Source::Remembered);
    assert_eq!(again, missing, "the same answer, read back");
    let (_, _, source) =
        probe(&python, Some(&cache), "gpus=[\"GPU-1:NVIDIA H100\"]").await.map_err(anyhow::Error::msg)?;
    assert_eq!(source, Source::Probed, "other GPUs are another machine");
    let full = interpreter(dir.path(), None, "")?;
    if std::process::Command::new("python3").args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success()) {
        let (ready, _, source) = probe(&full, Some(&cache), "gpus=[]").await.map_err(anyhow::Error::msg)?;
        assert_eq!(source, Source::Probed, "another search path (site-packages) is another fingerprint");
        assert!(ready.iter().any(|r| r.name == "transformers"), "{ready:?}");
    }
    let (_, _, source) = probe(&python, None, "gpus=[]").await.map_err(anyhow::Error::msg)?;
    assert_eq!(source, Source::Probed, "without a cache folder every ask probes");
    Ok(())
}
