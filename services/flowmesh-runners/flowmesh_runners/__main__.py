"""``python -m flowmesh_runners capabilities`` (what initialised here, as JSON),
``python -m flowmesh_runners fingerprint`` (what the answer depends on, without importing any of
it: the worker's cache key) and ``python -m flowmesh_runners run RUNNER`` (one task under the
worker's process contract)."""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any, Callable

from .protocol import EXIT_RETRYABLE, RetryableError, SpecError, Task, apply_thread_limit, write_result

# Runner name → (task types, backends, what must import). The worker builds one executor per
# runner whose check passes and names it after the runner, so `inference` picks `vllm` or
# `transformers` by the backend the validator's classifier chooses.
RUNNERS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "transformers": (["inference"], ["transformers"], ["torch", "transformers", "peft"]),
    "vllm": (["inference"], ["vllm"], ["torch", "vllm"]),
    # ppo: TRL 1.x removed PPOTrainer; `ppo.py` writes PPO's clipped objective on torch.
    "trl": (["sft", "lora_sft", "dpo", "ppo"], [], ["torch", "transformers", "peft", "trl", "datasets"]),
    "sentence-transformers": (["embedding", "rag"], [], ["torch", "sentence_transformers"]),
}


def check(name: str) -> dict[str, Any]:
    """Imports what the runner needs; vLLM also needs a GPU it can see."""
    task_types, backends, modules = RUNNERS[name]
    entry: dict[str, Any] = {"name": name, "task_types": task_types, "backends": backends}
    try:
        for module in modules:
            __import__(module)
        import torch

        entry["gpu"] = bool(torch.cuda.is_available())
        entry["gpu_count"] = torch.cuda.device_count() if entry["gpu"] else 0
        if name == "vllm" and not entry["gpu"]:
            raise RuntimeError("vllm needs a CUDA GPU and torch sees none")
        entry["ok"] = True
    except Exception as exc:  # noqa: BLE001 - any failure to initialise means "not served here"
        entry["ok"] = False
        entry["reason"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return entry


def capabilities() -> dict[str, Any]:
    return {"protocol": 1, "runners": [check(name) for name in RUNNERS]}


# The distributions whose presence and versions decide what `capabilities` answers.
DISTRIBUTIONS = [
    "torch", "transformers", "peft", "trl", "datasets", "accelerate", "sentence-transformers", "vllm",
]


def fingerprint() -> dict[str, Any]:
    """What `capabilities` depends on, read from package metadata in well under a second (no
    import of torch): the interpreter, its search path, each distribution's version and this
    module's own source. The worker keys its cache of `capabilities` answers on it."""
    import hashlib
    from importlib import metadata

    versions: dict[str, Any] = {}
    for dist in DISTRIBUTIONS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    with open(__file__, "rb") as source:
        checks = hashlib.sha256(source.read()).hexdigest()
    return {
        "protocol": 1,
        "python": sys.executable,
        "python_version": sys.version,
        "path": sys.path,
        "packages": versions,
        "checks": checks,
    }


def dispatch(runner: str, task: Task) -> dict[str, Any]:
    table: dict[str, Callable[[], dict[str, Any]]] = {
        "transformers": lambda: __import__("flowmesh_runners.inference", fromlist=["run"]).run(task, runner),
        "vllm": lambda: __import__("flowmesh_runners.inference", fromlist=["run"]).run(task, runner),
        "trl": lambda: __import__("flowmesh_runners.train", fromlist=["run"]).run(task),
        "sentence-transformers": lambda: __import__("flowmesh_runners.rag", fromlist=["run"]).run(task),
    }
    if runner not in table:
        raise SpecError(f"unknown runner {runner!r}; known: {', '.join(table)}")
    return table[runner]()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["capabilities"], ["probe"]):
        print(json.dumps(capabilities()))
        return 0
    if argv[:1] == ["fingerprint"]:
        print(json.dumps(fingerprint(), sort_keys=True))
        return 0
    if len(argv) == 2 and argv[0] == "run":
        try:
            apply_thread_limit()
            task = Task.load()
            write_result(dispatch(argv[1], task))
            return 0
        except RetryableError as exc:
            print(f"retryable: {exc}", file=sys.stderr)
            return EXIT_RETRYABLE
        except SpecError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except Exception:  # noqa: BLE001 - reported in stderr.log, which the worker stores
            traceback.print_exc()
            return 1
    print("usage: python -m flowmesh_runners capabilities | fingerprint | run RUNNER", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main())
