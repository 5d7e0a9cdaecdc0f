"""Tiny random-weight models built once per session in a temp folder; no model hub is used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="ML dependencies not installed (./tools/install-deps.sh --ml)")
pytest.importorskip("transformers", reason="ML dependencies not installed (./tools/install-deps.sh --ml)")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from flowmesh_runners.tiny import build_all

    return build_all(tmp_path_factory.mktemp("models"))


@pytest.fixture
def task_env(tmp_path: Path, tiny: dict[str, Path], monkeypatch: pytest.MonkeyPatch):
    """Writes a task file and points the protocol's variables into a fresh folder."""

    def make(task_type: str, spec: dict, task_id: str = "wf-1-main", upstream: dict | None = None) -> Path:
        task = {"task_id": task_id, "stage": "main", "task_type": task_type, "attempt": 1, "spec": spec,
                "upstream": upstream or {}}
        (tmp_path / "task.json").write_text(json.dumps(task))
        for var, name in [("FLOWMESH_TASK_FILE", "task.json"), ("FLOWMESH_RESULT_FILE", "result.json"),
                          ("FLOWMESH_OUTPUT_DIR", "output"), ("FLOWMESH_PROGRESS_FILE", "progress.jsonl"),
                          ("FLOWMESH_INPUTS_DIR", "inputs")]:
            monkeypatch.setenv(var, str(tmp_path / name))
        monkeypatch.setenv("FLOWMESH_MODEL_MAP", str(tiny["map"]))
        return tmp_path

    return make


def progress_lines(folder: Path) -> list[dict]:
    path = folder / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
