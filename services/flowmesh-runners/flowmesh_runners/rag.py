"""The ``embedding`` and ``rag`` runners: sentence-transformers, retrieval over the spec's documents.

Only documents given in the spec (``data.documents``) are searched; an external vector store named in the spec (``qdrant``) is not contacted.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .inference import prompts
from .protocol import SpecError, Task, device, get, output_dir, progress, resolve_model

DEFAULT_EMBEDDER = "sentence-transformers/all-MiniLM-L6-v2"


def embedder(task: Task) -> tuple[Any, str]:
    from sentence_transformers import SentenceTransformer

    spec = task.spec
    ref = get(spec, "embedding.model") or get(spec, "model.source.identifier") or DEFAULT_EMBEDDER
    path = resolve_model(str(ref), task)
    return SentenceTransformer(path, device=device(spec)), path


def documents(spec: dict[str, Any]) -> list[str]:
    docs = get(spec, "data.documents") or []
    return [d if isinstance(d, str) else str(d.get("text") or d.get("content") or d) for d in docs]


def run(task: Task) -> dict[str, Any]:
    model, path = embedder(task)
    queries = prompts(task.spec)
    started = time.monotonic()
    vectors = model.encode(queries, normalize_embeddings=True)
    if task.task_type == "embedding":
        out = output_dir() / "embeddings.jsonl"
        with out.open("w") as fh:
            for text, vec in zip(queries, vectors):
                fh.write(json.dumps({"input": text, "embedding": [float(x) for x in vec]}) + "\n")
        progress(kind="embedding", items=len(queries), seconds=round(time.monotonic() - started, 3))
        return {"ok": True, "model": path, "device": str(model.device), "count": len(queries),
                "dimensions": int(vectors.shape[1]), "embeddings_file": "embeddings.jsonl"}
    docs = documents(task.spec)
    if not docs:
        raise SpecError("a rag task here retrieves over documents given in the spec (data.documents: [...]); none given, and external stores (qdrant) are not contacted")
    doc_vectors = model.encode(docs, normalize_embeddings=True)
    scores = vectors @ doc_vectors.T
    top_k = int(get(task.spec, "search.top_k") or get(task.spec, "retrieval.top_k") or 3)
    items = []
    for text, row in zip(queries, scores):
        best = sorted(range(len(docs)), key=lambda i: -float(row[i]))[:top_k]
        items.append({"input": text, "hits": [{"document": docs[i], "index": i, "score": round(float(row[i]), 6)} for i in best]})
    progress(kind="rag", items=len(queries), documents=len(docs), seconds=round(time.monotonic() - started, 3))
    return {"ok": True, "model": path, "device": str(model.device), "items": items, "documents": len(docs)}
