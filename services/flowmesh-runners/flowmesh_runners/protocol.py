"""The runner side of the worker's process contract: task in, progress and result out, models found."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXIT_RETRYABLE = 75


class RetryableError(Exception):
    """A failure worth another attempt (a lost device, a full disk); the process exits 75."""


class SpecError(Exception):
    """The spec asks for something this runner cannot do; a permanent failure."""


@dataclass
class Task:
    """The work order the worker wrote to ``$FLOWMESH_TASK_FILE``."""

    task_id: str
    stage: str
    task_type: str
    spec: dict[str, Any]
    attempt: int = 1
    upstream: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | None = None) -> "Task":
        path = path or os.environ["FLOWMESH_TASK_FILE"]
        doc = json.loads(Path(path).read_text())
        return cls(
            task_id=doc["task_id"],
            stage=doc.get("stage", "main"),
            task_type=doc["task_type"],
            spec=doc.get("spec") or {},
            attempt=int(doc.get("attempt", 1)),
            upstream=dict(doc.get("upstream") or {}),
        )


def output_dir() -> Path:
    out = Path(os.environ.get("FLOWMESH_OUTPUT_DIR", "output"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def inputs_dir() -> Path:
    return Path(os.environ.get("FLOWMESH_INPUTS_DIR", "inputs"))


def progress(**fields: Any) -> None:
    """Reports progress: one JSON line the worker turns into a ``task.updated`` event."""
    fields.setdefault("time", round(time.time(), 3))
    line = json.dumps(fields, default=float)
    path = os.environ.get("FLOWMESH_PROGRESS_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    print(f"progress {line}", file=sys.stderr, flush=True)


def write_result(result: dict[str, Any]) -> None:
    path = os.environ.get("FLOWMESH_RESULT_FILE", "result.json")
    Path(path).write_text(json.dumps(result, indent=2, default=str))


def get(spec: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """``spec["a"]["b"]`` for ``"a.b"``, or ``default`` when any step is missing."""
    node: Any = spec
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def model_map() -> dict[str, str]:
    """Hub id → local folder, from ``$FLOWMESH_MODEL_MAP`` (a JSON file); ``"*"`` maps every id."""
    path = os.environ.get("FLOWMESH_MODEL_MAP")
    if not path:
        return {}
    mapping = json.loads(Path(path).read_text())
    base = Path(path).parent
    return {k: str((base / v) if not Path(v).is_absolute() else Path(v)) for k, v in mapping.items()}


def resolve_model(ref: str, task: Task | None = None) -> str:
    """Where ``from_pretrained`` should load ``ref`` from, in this order:

    1. an existing local path;
    2. ``<upstream task id>/<path>`` (what a training stage reports): the worker downloaded that
       stage's files into ``$FLOWMESH_INPUTS_DIR/<stage>/<path>``;
    3. the id in ``$FLOWMESH_MODEL_MAP`` (then its ``"*"`` entry);
    4. ``$FLOWMESH_MODELS_DIR/<id>`` when that folder exists;
    5. the id itself (the hub, when the machine can reach it).
    """
    ref = ref.strip()
    if ref.startswith("file://"):
        ref = ref[len("file://"):]
    if Path(ref).exists():
        return ref
    if task is not None:
        for stage, task_id in task.upstream.items():
            for prefix in (f"{task_id}/", f"flowmesh://{task_id}/"):
                if ref.startswith(prefix):
                    local = inputs_dir() / stage / ref[len(prefix):]
                    if local.exists():
                        return str(local)
                    raise SpecError(f"{ref!r} names stage {stage!r}'s files, but {local} was not downloaded")
            if ref == task_id:
                # A bare task id (`${train.task_id}`): the model folder that stage saved.
                for rel in ("final_lora", "final_model", "artifacts/checkpoints"):
                    if (inputs_dir() / stage / rel).is_dir():
                        return str(inputs_dir() / stage / rel)
                return str(inputs_dir() / stage)
    mapping = model_map()
    if ref in mapping:
        return mapping[ref]
    models = os.environ.get("FLOWMESH_MODELS_DIR")
    if models and (Path(models) / ref).exists():
        return str(Path(models) / ref)
    if "*" in mapping:
        return mapping["*"]
    return ref


def model_ref(spec: dict[str, Any]) -> str:
    """The base model a spec names (FlowMesh's ``model.source.identifier`` and its older forms)."""
    model = spec.get("model")
    if isinstance(model, str):
        return model
    for key in ("model.source.identifier", "model.source.path", "model.identifier", "model.name", "model.path"):
        value = get(spec, key)
        if isinstance(value, str) and value:
            return value
    raise SpecError("the spec names no model (expected model.source.identifier)")


def checkpoint_ref(spec: dict[str, Any]) -> str | None:
    """A checkpoint to load instead of, or on top of, the base model (``checkpoint.load``)."""
    load = get(spec, "checkpoint.load")
    if isinstance(load, str):
        return load
    if isinstance(load, dict):
        for key in ("path", "url", "uri"):
            if isinstance(load.get(key), str) and load[key]:
                return load[key]
    return None


def device(spec: dict[str, Any]) -> str:
    """``cuda`` when the worker gave this process a GPU and the spec does not force the CPU."""
    import torch

    if spec.get("enforce_cpu") or get(spec, "model.transformers.device_map") == "cpu":
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def apply_thread_limit() -> None:
    """Keeps torch to the CPU threads the worker granted (``OMP_NUM_THREADS``)."""
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
