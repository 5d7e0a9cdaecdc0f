"""The ``inference`` runner: Hugging Face transformers (CPU or GPU), or vLLM on a GPU worker."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .protocol import SpecError, Task, checkpoint_ref, device, get, model_ref, progress, resolve_model


def prompts(spec: dict[str, Any]) -> list[str]:
    """The prompts of a spec: ``data.items`` (strings or ``{prompt|text|input}``), ``data.prompts``, ``prompt``."""
    items = get(spec, "data.items") or get(spec, "data.prompts") or spec.get("prompts") or []
    if not items and get(spec, "data.type") == "dataset":
        items = dataset_prompts(spec.get("data") or {})
    if isinstance(spec.get("prompt"), str):
        items = [spec["prompt"], *items]
    out: list[str] = []
    for item in items:
        if isinstance(item, dict):
            text = item.get("prompt") or item.get("text") or item.get("input")
            if not isinstance(text, str):
                raise SpecError(f"data item {item!r} has no prompt, text or input")
            out.append(text)
        else:
            out.append(str(item))
    if not out:
        raise SpecError("the spec gives no prompts (expected data.items)")
    return out


def dataset_prompts(data: dict[str, Any]) -> list[str]:
    """``data: {type: dataset, url|dataset_name, split: "test[:20]", column}``, from the datasets
    folder (``$FLOWMESH_DATASETS_DIR``) as training data is."""
    import re

    from .train import load_rows, resolve_dataset

    name = data.get("url") or data.get("dataset_name") or data.get("path")
    if not name:
        raise SpecError("a dataset input needs url or dataset_name")
    rows = load_rows(resolve_dataset(str(name)), data.get("split"))
    column = data.get("column") or data.get("prompt_column") or "prompt"
    missing = [i for i, r in enumerate(rows) if column not in r]
    if missing:
        raise SpecError(f"dataset {name!r} rows {missing[:5]} have no column {column!r}")
    limit = re.search(r"\[:(\d+)\]", str(data.get("split") or ""))
    texts = [str(r[column]) for r in rows]
    return texts[: int(limit.group(1))] if limit else texts


def sampling(spec: dict[str, Any]) -> dict[str, Any]:
    params = spec.get("inference") or {}
    return {
        "max_tokens": int(params.get("max_tokens") or params.get("max_new_tokens") or 64),
        "min_tokens": int(params.get("min_tokens") or 0),
        "temperature": float(params.get("temperature", 0.0) or 0.0),
        "top_p": float(params.get("top_p", 1.0) or 1.0),
        "seed": int(params.get("seed", spec.get("seed", 0)) or 0),
    }


def render(tokenizer: Any, system: str | None, text: str) -> str:
    """The prompt as the model expects it: its chat template when it has one and a system prompt
    is given, else the system prompt on a line before the text."""
    if not system:
        return text
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{system}\n{text}"


def is_adapter(path: str) -> bool:
    return (Path(path) / "adapter_config.json").is_file()


def adapter_refs(spec: dict[str, Any]) -> list[str]:
    refs = []
    for adapter in get(spec, "model.adapters") or spec.get("adapters") or []:
        ref = adapter.get("path") or adapter.get("url") or adapter.get("task_id")
        if ref:
            refs.append(str(ref))
    return refs


def load_transformers(task: Task) -> tuple[Any, Any, str, list[str]]:
    """Model and tokenizer, with a checkpoint or LoRA adapters from upstream stages applied."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = task.spec
    base = resolve_model(model_ref(spec), task)
    checkpoint = checkpoint_ref(spec)
    adapters = [resolve_model(r, task) for r in adapter_refs(spec)]
    if checkpoint:
        path = resolve_model(checkpoint, task)
        if is_adapter(path):
            adapters.insert(0, path)
        else:
            base = path
    dtype_name = get(spec, "model.transformers.dtype") or get(spec, "model.transformers.torch_dtype")
    dtype = getattr(torch, dtype_name) if isinstance(dtype_name, str) and dtype_name != "auto" else None
    dev = device(spec)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype) if dtype else AutoModelForCausalLM.from_pretrained(base)
    if adapters:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapters[0], adapter_name="adapter0")
        for i, path in enumerate(adapters[1:], start=1):
            model.load_adapter(path, adapter_name=f"adapter{i}")
    model.to(dev).eval()
    return model, tokenizer, base, adapters


def run_transformers(task: Task) -> dict[str, Any]:
    import torch

    params = sampling(task.spec)
    texts = prompts(task.spec)
    model, tokenizer, base, adapters = load_transformers(task)
    torch.manual_seed(params["seed"])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    items = []
    total_prompt = total_completion = 0
    started = time.monotonic()
    system = get(task.spec, "inference.system_prompt")
    for i, text in enumerate(texts):
        encoded = tokenizer(render(tokenizer, system, text), return_tensors="pt").to(model.device)
        t0 = time.monotonic()
        kwargs: dict[str, Any] = {"max_new_tokens": params["max_tokens"], "pad_token_id": pad}
        if params["min_tokens"]:
            kwargs["min_new_tokens"] = min(params["min_tokens"], params["max_tokens"])
        if params["temperature"] > 0:
            kwargs.update(do_sample=True, temperature=params["temperature"], top_p=params["top_p"])
        else:
            kwargs["do_sample"] = False
        with torch.no_grad():
            generated = model.generate(**encoded, **kwargs)
        new = generated[0, encoded["input_ids"].shape[1]:]
        output = tokenizer.decode(new, skip_special_tokens=True)
        n_prompt, n_new = int(encoded["input_ids"].shape[1]), int(new.shape[0])
        total_prompt += n_prompt
        total_completion += n_new
        elapsed = max(time.monotonic() - t0, 1e-9)
        progress(kind="inference", item=i + 1, items=len(texts), tokens=n_new, tokens_per_second=round(n_new / elapsed, 2))
        items.append({"input": text, "output": output, "prompt_tokens": n_prompt, "completion_tokens": n_new})
    elapsed = max(time.monotonic() - started, 1e-9)
    return {
        "ok": True,
        "backend": "transformers",
        "model": base,
        "adapters": adapters,
        "device": str(model.device),
        "items": items,
        "usage": {
            "prompt_tokens": total_prompt,
            "completion_tokens": total_completion,
            "total_tokens": total_prompt + total_completion,
        },
        "tokens_per_second": round(total_completion / elapsed, 2),
    }


def run_vllm(task: Task) -> dict[str, Any]:
    """vLLM on the GPUs the worker gave this process; ``model.vllm`` passes through to ``LLM``."""
    from vllm import LLM, SamplingParams

    spec = task.spec
    params = sampling(spec)
    texts = prompts(spec)
    base = resolve_model(model_ref(spec), task)
    checkpoint = checkpoint_ref(spec)
    adapters = [resolve_model(r, task) for r in adapter_refs(spec)]
    if checkpoint:
        path = resolve_model(checkpoint, task)
        if is_adapter(path):
            adapters.insert(0, path)
        else:
            base = path
    options = dict(get(spec, "model.vllm") or {})
    if adapters:
        options.setdefault("enable_lora", True)
    llm = LLM(model=base, **options)
    sp = SamplingParams(
        max_tokens=params["max_tokens"],
        min_tokens=params["min_tokens"],
        temperature=params["temperature"],
        top_p=params["top_p"],
        seed=params["seed"],
    )
    lora = None
    if adapters:
        from vllm.lora.request import LoRARequest

        lora = LoRARequest("adapter0", 1, adapters[0])
    started = time.monotonic()
    system = get(spec, "inference.system_prompt")
    outputs = llm.generate([render(llm.get_tokenizer(), system, t) for t in texts], sp, lora_request=lora)
    elapsed = max(time.monotonic() - started, 1e-9)
    items = []
    for text, out in zip(texts, outputs):
        completion = out.outputs[0]
        items.append({
            "input": text,
            "output": completion.text,
            "prompt_tokens": len(out.prompt_token_ids or []),
            "completion_tokens": len(completion.token_ids),
        })
    completion_tokens = sum(i["completion_tokens"] for i in items)
    prompt_tokens = sum(i["prompt_tokens"] for i in items)
    progress(kind="inference", item=len(items), items=len(items), tokens=completion_tokens,
             tokens_per_second=round(completion_tokens / elapsed, 2))
    return {
        "ok": True,
        "backend": "vllm",
        "model": base,
        "adapters": adapters,
        "items": items,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
        "tokens_per_second": round(completion_tokens / elapsed, 2),
    }


def backend(spec: dict[str, Any]) -> str:
    """The validator's classifier (SPEC §4.2): enforce_cpu → transformers; model.vllm or adapters →
    vllm; model.transformers → transformers; otherwise auto."""
    if spec.get("enforce_cpu"):
        return "transformers"
    if get(spec, "model.vllm") is not None or get(spec, "model.adapters") or spec.get("adapters"):
        return "vllm"
    if get(spec, "model.transformers") is not None:
        return "transformers"
    return "auto"


def run(task: Task, runner: str) -> dict[str, Any]:
    """``runner`` is the executor the worker chose (``transformers`` or ``vllm``)."""
    if runner == "vllm":
        return run_vllm(task)
    return run_transformers(task)
