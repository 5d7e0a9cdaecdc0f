"""The runners on tiny real models, on CPU: outputs asserted, not only exit codes."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from flowmesh_runners.__main__ import capabilities, main
from flowmesh_runners.protocol import Task, resolve_model

from .conftest import progress_lines

SAMPLES = [
    {"prompt": "how should i name variables ?", "response": "use short descriptive names"},
    {"prompt": "why write tests ?", "response": "tests catch regressions early"},
]


def run(runner: str, folder) -> dict:
    assert main(["run", runner]) == 0
    return json.loads((folder / "result.json").read_text())


def test_capabilities_name_every_runner_and_why_one_is_missing():
    caps = {r["name"]: r for r in capabilities()["runners"]}
    assert caps["transformers"]["ok"] and caps["transformers"]["task_types"] == ["inference"]
    assert set(caps) == {"transformers", "vllm", "trl", "sentence-transformers"}
    for entry in caps.values():
        assert entry["ok"] or entry["reason"]


def test_fingerprint_names_the_versions_and_imports_nothing_heavy():
    """The worker's cache key: read from package metadata, so a fresh interpreter that asks for
    it has imported neither torch nor transformers afterwards."""
    import subprocess
    import sys

    code = ("import json, sys; from flowmesh_runners.__main__ import fingerprint; f = fingerprint(); "
            "print(json.dumps([f, [m for m in ('torch', 'transformers', 'trl') if m in sys.modules]]))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    found, imported = json.loads(out)
    assert imported == []
    assert found["packages"]["torch"] and found["packages"]["transformers"]
    assert set(found["packages"]) >= {"trl", "peft", "sentence-transformers", "vllm"}
    assert found["python"] == sys.executable and len(found["checks"]) == 64


def test_inference_generates_text_and_counts_tokens(task_env):
    folder = task_env("inference", {
        "enforce_cpu": True,
        "model": {"source": {"identifier": "sshleifer/tiny-gpt2"}},
        "data": {"items": ["the scheduler placed the task on", {"prompt": "why write tests ?"}]},
        "inference": {"max_tokens": 6, "min_tokens": 6},
    })
    result = run("transformers", folder)
    assert result["backend"] == "transformers" and result["device"] == "cpu"
    assert [i["completion_tokens"] for i in result["items"]] == [6, 6]
    assert all(i["output"].strip() for i in result["items"])
    assert result["usage"]["total_tokens"] == result["usage"]["prompt_tokens"] + 12
    assert any(p.get("tokens_per_second", 0) > 0 for p in progress_lines(folder))


@pytest.mark.parametrize("task_type,saved", [("lora_sft", "final_lora"), ("sft", "final_model")])
def test_two_sft_steps_report_loss_and_save_the_model(task_env, task_type, saved):
    folder = task_env(task_type, {
        # On the CPU on any machine, so the device it reports is known (tools/gpu-check.sh
        # checks a GPU's).
        "enforce_cpu": True,
        "model": {"source": {"identifier": "meta-llama/Llama-3.2-1B-Instruct"}},
        "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "data": {"samples": SAMPLES},
        "training": {"max_steps": 2, "batch_size": 2, "learning_rate": 1e-3},
    }, task_id="wf-3-train")
    result = run("trl", folder)
    assert result["global_step"] == 2 and len(result["losses"]) == 2
    assert all(math.isfinite(loss) and loss > 0 for loss in result["losses"])
    assert result["final_model_archive"] == f"wf-3-train/{saved}"
    marker = "adapter_config.json" if task_type == "lora_sft" else "config.json"
    assert (folder / "output" / saved / marker).is_file()
    assert result["adapter"] == (task_type == "lora_sft") and result["device"] == "cpu"
    steps = [p for p in progress_lines(folder) if "loss" in p]
    assert [p["step"] for p in steps] == [1, 2] and all("learning_rate" in p for p in steps)


def test_inference_loads_an_upstream_adapter_by_its_reported_name(task_env, tmp_path):
    train = task_env("lora_sft", {
        "model": {"source": {"identifier": "x/base"}},
        "data": {"samples": SAMPLES},
        "training": {"max_steps": 1, "batch_size": 2},
    }, task_id="wf-4-train")
    reported = run("trl", train)["final_model_archive"]
    # What the worker does for the next stage: the train stage's files under inputs/<stage>/.
    shutil.copytree(train / "output", tmp_path / "inputs" / "train")
    folder = task_env("inference", {
        "enforce_cpu": True,
        "model": {"source": {"identifier": "x/base"}},
        "checkpoint": {"load": {"type": "local", "path": reported}},
        "data": {"items": ["why write tests ?"]},
        "inference": {"max_tokens": 3, "min_tokens": 3},
    }, task_id="wf-4-infer", upstream={"train": "wf-4-train"})
    result = run("transformers", folder)
    assert result["adapters"] == [str(tmp_path / "inputs" / "train" / "final_lora")]
    assert result["items"][0]["completion_tokens"] == 3


def test_dpo_step_on_three_pairs(task_env):
    folder = task_env("dpo", {
        "model": {"source": {"identifier": "HuggingFaceTB/SmolLM2-360M-Instruct"}},
        "data": {"preferences": [
            {"prompt": "how should i name variables ?", "chosen": "use short descriptive names", "rejected": "any name works"},
            {"prompt": "why write tests ?", "chosen": "tests catch regressions early", "rejected": "tests are optional"},
            {"prompt": "why write tests ?", "chosen": "document the intended behaviour", "rejected": "any name works"},
        ]},
        "training": {"max_steps": 1, "batch_size": 3, "learning_rate": 1e-4},
    })
    result = run("trl", folder)
    assert result["global_step"] == 1 and result["pairs"] == 3
    assert result["losses"] and math.isfinite(result["losses"][0])
    assert (folder / "output" / "artifacts" / "checkpoints" / "config.json").is_file()


def test_model_map_and_upstream_names_resolve(tiny, monkeypatch, tmp_path):
    monkeypatch.setenv("FLOWMESH_MODEL_MAP", str(tiny["map"]))
    monkeypatch.setenv("FLOWMESH_INPUTS_DIR", str(tmp_path))
    assert resolve_model("sentence-transformers/all-MiniLM-L6-v2") == str(tiny["embedder"])
    assert resolve_model("any/other") == str(tiny["llama"])
    (tmp_path / "train" / "final_lora").mkdir(parents=True)
    task = Task(task_id="wf-9-infer", stage="infer", task_type="inference", spec={}, upstream={"train": "wf-9-train"})
    assert resolve_model("wf-9-train/final_lora", task) == str(tmp_path / "train" / "final_lora")


def test_rag_ranks_the_spec_documents_for_each_query(task_env):
    docs = ["tests catch regressions early", "use short descriptive names", "the worker runs the task"]
    folder = task_env("rag", {
        "enforce_cpu": True,
        "embedding": {"model": "sentence-transformers/all-MiniLM-L6-v2"},
        "search": {"top_k": 2},
        "data": {"items": ["tests catch regressions early"], "documents": docs},
    })
    result = run("sentence-transformers", folder)
    hits = result["items"][0]["hits"]
    assert len(hits) == 2 and result["device"] == "cpu"
    assert hits[0]["document"] == docs[0], "an identical document ranks first"
    assert hits[0]["score"] >= hits[1]["score"]


def test_a_named_dataset_loads_from_the_datasets_folder(task_env, tiny, monkeypatch):
    monkeypatch.setenv("FLOWMESH_DATASETS_DIR", str(tiny["datasets"]))
    folder = task_env("sft", {
        "model": {"source": {"identifier": "Qwen/Qwen2.5-0.5B-Instruct"}},
        "data": {"dataset_name": "openai/gsm8k", "split": "train[:1%]", "prompt_column": "question",
                 "response_column": "answer", "max_samples": 3},
        "training": {"max_steps": 1, "batch_size": 2},
    })
    result = run("trl", folder)
    assert result["samples"] == 3 and result["global_step"] == 1


def test_inference_reads_prompts_from_a_named_dataset(task_env, tiny, monkeypatch):
    monkeypatch.setenv("FLOWMESH_DATASETS_DIR", str(tiny["datasets"]))
    folder = task_env("inference", {
        "model": {"source": {"identifier": "HuggingFaceTB/SmolLM2-360M-Instruct"}, "transformers": {"device_map": "cpu"}},
        "data": {"type": "dataset", "url": "openai/gsm8k", "split": "test[:2]", "column": "question"},
        "inference": {"max_tokens": 2, "min_tokens": 2, "system_prompt": "reply kindly"},
    })
    result = run("transformers", folder)
    assert len(result["items"]) == 2 and result["usage"]["completion_tokens"] == 4
    plain = len("the scheduler placed the task on a worker with a free gpu".split())
    assert result["items"][0]["prompt_tokens"] == plain + 2, "the system prompt's two words come first"


def test_ppo_steps_score_with_the_reward_model_and_save_the_policy(task_env):
    folder = task_env("ppo", {
        "model": {"source": {"identifier": "Qwen/Qwen2.5-0.5B-Instruct"}},
        "reward_model": {"type": "sentiment", "identifier": "distilbert/distilbert-base-uncased-finetuned-sst-2-english"},
        "data": {"prompts": ["reply kindly to a customer", "encourage a friend"]},
        "training": {"learning_rate": 1e-3, "batch_size": 2, "steps": 2, "ppo_epochs": 2},
        "generation": {"max_new_tokens": 4, "temperature": 1.0},
    })
    result = run("trl", folder)
    assert result["global_step"] == 2 and len(result["losses"]) == 2
    assert all(0.0 <= r <= 1.0 for r in result["rewards"]), "a probability from the reward model"
    assert all(math.isfinite(loss) for loss in result["losses"])
    assert (folder / "output" / "artifacts" / "checkpoints" / "config.json").is_file()
    steps = [p for p in progress_lines(folder) if p.get("kind") == "train"]
    assert [p["step"] for p in steps] == [1, 2] and all("reward" in p for p in steps)
