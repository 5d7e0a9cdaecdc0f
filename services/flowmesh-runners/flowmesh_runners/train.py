"""The training runners: ``sft`` and ``lora_sft`` (TRL + PEFT), ``dpo`` (TRL), ``ppo`` (see ``ppo``)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .protocol import SpecError, Task, device, get, model_ref, output_dir, progress, resolve_model

# Where each type saves its model, inside the output folder: the names FlowMesh's examples list
# in `output.artifacts` (the worker uploads the folder with digests).
SAVE_DIRS = {"sft": "final_model", "lora_sft": "final_lora", "dpo": "artifacts/checkpoints"}


def resolve_dataset(name: str) -> Path:
    """A dataset named by hub id, from ``$FLOWMESH_DATASETS_DIR/<id>`` (air-gapped fleets), else
    that folder's ``default/`` (how tests substitute a tiny dataset for every name)."""
    root = os.environ.get("FLOWMESH_DATASETS_DIR")
    if Path(name).exists():
        return Path(name)
    if root and (Path(root) / name).exists():
        return Path(root) / name
    if root and (Path(root) / "default").exists():
        return Path(root) / "default"
    raise SpecError(f"dataset {name!r} is not available here (set FLOWMESH_DATASETS_DIR to a folder holding {name}/)")


def records(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Training rows: inline (``data.samples``/``data.items``/``data.preferences``/``data.prompts``)
    or a local dataset (``data.path``, or ``data.dataset_name`` through the datasets folder)."""
    data = spec.get("data") or {}
    for key in ("samples", "items", "examples", "preferences", "prompts"):
        if isinstance(data.get(key), list) and data[key]:
            rows = [r if isinstance(r, dict) else {"prompt": str(r)} for r in data[key]]
            break
    else:
        source = data.get("path") or data.get("dataset_name")
        if not source:
            raise SpecError("the spec gives no training data (data.samples, data.preferences, data.path or data.dataset_name)")
        path = resolve_dataset(str(source))
        rows = load_rows(path, data.get("split"))
    prompt_col = data.get("prompt_column", "prompt")
    response_col = data.get("response_column", "response")
    out = []
    for row in rows:
        row = dict(row)
        if prompt_col in row:
            row["prompt"] = row[prompt_col]
        if response_col in row:
            row["completion"] = row[response_col]
        elif "response" in row:
            row["completion"] = row["response"]
        out.append(row)
    limit = data.get("max_samples")
    return out[: int(limit)] if limit else out


def load_rows(path: Path, split: Any) -> list[dict[str, Any]]:
    files = [path] if path.is_file() else sorted(path.glob("*.jsonl")) + sorted(path.glob("*.json"))
    if not files:
        from datasets import load_from_disk

        ds = load_from_disk(str(path))
        if hasattr(ds, "keys"):
            ds = ds[str(split).split("[")[0] if split else "train"]
        return [dict(r) for r in ds]
    rows: list[dict[str, Any]] = []
    for f in files:
        text = f.read_text()
        if f.suffix == ".jsonl":
            rows.extend(json.loads(line) for line in text.splitlines() if line.strip())
        else:
            loaded = json.loads(text)
            rows.extend(loaded if isinstance(loaded, list) else [loaded])
    return rows


def progress_callback() -> Any:
    """A TrainerCallback that reports step, loss and learning rate as progress lines."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def __init__(self) -> None:
            self.losses: list[float] = []

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **_: Any) -> None:
            logs = logs or {}
            if "loss" in logs:
                self.losses.append(float(logs["loss"]))
            fields = {k: logs[k] for k in ("loss", "learning_rate", "epoch", "grad_norm") if k in logs}
            fields.update({k: v for k, v in logs.items() if k.startswith("rewards/")})
            if fields:
                progress(kind="train", step=state.global_step, max_steps=state.max_steps, **fields)

    return Progress()


def common_args(task: Task, work: str) -> dict[str, Any]:
    """TrainingArguments shared by every trainer, from ``spec.training``."""
    t = task.spec.get("training") or {}
    args: dict[str, Any] = {
        "output_dir": work,
        "per_device_train_batch_size": int(t.get("batch_size") or t.get("per_device_train_batch_size") or 2),
        "gradient_accumulation_steps": int(t.get("gradient_accumulation_steps") or 1),
        "learning_rate": float(t.get("learning_rate") or 5e-5),
        "num_train_epochs": float(t.get("num_train_epochs") or 1),
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "seed": int(t.get("seed") or 0),
        "disable_tqdm": True,
        "use_cpu": device(task.spec) == "cpu",
    }
    steps = t.get("max_steps") or t.get("steps")
    if steps:
        args["max_steps"] = int(steps)
    if device(task.spec) == "cuda":
        args["bf16"] = bool(t.get("bf16"))
        args["fp16"] = bool(t.get("fp16"))
    return args


def lora_config(spec: dict[str, Any], model: Any) -> Any:
    from peft import LoraConfig

    lora = spec.get("lora") or {}
    wanted = lora.get("target_modules") or "all-linear"
    if isinstance(wanted, list):
        names = {name.split(".")[-1] for name, _ in model.named_modules()}
        if not set(wanted) & names:
            progress(kind="note", message=f"none of {wanted} in this model; LoRA targets all linear layers")
            wanted = "all-linear"
    return LoraConfig(
        r=int(lora.get("r", 8)),
        lora_alpha=int(lora.get("alpha", lora.get("lora_alpha", 16))),
        lora_dropout=float(lora.get("dropout", lora.get("lora_dropout", 0.0))),
        target_modules=wanted,
        task_type="CAUSAL_LM",
    )


def load(task: Task) -> tuple[Any, Any, str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = resolve_model(model_ref(task.spec), task)
    tokenizer = AutoTokenizer.from_pretrained(base)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(base)
    return model, tokenizer, base


def finish(task: Task, trainer: Any, tokenizer: Any, callback: Any, base: str, extra: dict[str, Any]) -> dict[str, Any]:
    """Saves the model (or adapter) into the output folder and builds the result."""
    rel = SAVE_DIRS[task.task_type]
    target = output_dir() / rel
    target.mkdir(parents=True, exist_ok=True)
    trainer.save_model(str(target))
    tokenizer.save_pretrained(str(target))
    state = trainer.state
    train_loss = next((h["train_loss"] for h in reversed(state.log_history) if "train_loss" in h), None)
    return {
        "ok": True,
        "task_type": task.task_type,
        "base_model": base,
        "global_step": state.global_step,
        "losses": callback.losses,
        "final_loss": callback.losses[-1] if callback.losses else None,
        "train_loss": train_loss,
        "adapter": (target / "adapter_config.json").is_file(),
        # Where the weights were trained: "cuda:0" on the GPU the worker gave this task, else "cpu".
        "device": str(trainer.args.device),
        "final_model_path": rel,
        # An object-store name under this task: a later stage's `${stage.final_model_archive}`
        # resolves to it, and its runner finds the files among its downloaded inputs.
        "final_model_archive": f"{task.task_id}/{rel}",
        **extra,
    }


def run_sft(task: Task) -> dict[str, Any]:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    model, tokenizer, base = load(task)
    rows = records(task.spec)
    if not all("completion" in r for r in rows):
        raise SpecError("every SFT sample needs a prompt and a response")
    ds = Dataset.from_list([{"prompt": str(r["prompt"]), "completion": " " + str(r["completion"])} for r in rows])
    t = task.spec.get("training") or {}
    callback = progress_callback()
    with tempfile.TemporaryDirectory() as work:
        config = SFTConfig(**common_args(task, work), max_length=int(t.get("max_seq_length") or t.get("max_length") or 512))
        peft = lora_config(task.spec, model) if task.task_type == "lora_sft" else None
        trainer = SFTTrainer(model=model, args=config, train_dataset=ds, processing_class=tokenizer,
                             peft_config=peft, callbacks=[callback])
        trainer.train()
        return finish(task, trainer, tokenizer, callback, base, {"samples": len(rows)})


def run_dpo(task: Task) -> dict[str, Any]:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    model, tokenizer, base = load(task)
    rows = records(task.spec)
    missing = [i for i, r in enumerate(rows) if not {"prompt", "chosen", "rejected"} <= r.keys()]
    if missing:
        raise SpecError(f"preference rows {missing} lack prompt, chosen or rejected")
    ds = Dataset.from_list([{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in rows])
    t = task.spec.get("training") or {}
    callback = progress_callback()
    with tempfile.TemporaryDirectory() as work:
        config = DPOConfig(**common_args(task, work), beta=float(t.get("beta", 0.1)),
                           max_length=int(t.get("max_length") or 512))
        trainer = DPOTrainer(model=model, args=config, train_dataset=ds, processing_class=tokenizer, callbacks=[callback])
        trainer.train()
        return finish(task, trainer, tokenizer, callback, base, {"pairs": len(rows)})


def run(task: Task) -> dict[str, Any]:
    if task.task_type in ("sft", "lora_sft"):
        return run_sft(task)
    if task.task_type == "dpo":
        return run_dpo(task)
    if task.task_type == "ppo":
        from .ppo import run_ppo

        return run_ppo(task)
    raise SpecError(f"the training runner does not serve {task.task_type!r}")
