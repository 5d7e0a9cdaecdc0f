"""The ``ppo`` runner: PPO's clipped objective written on torch, since TRL 1.x dropped PPOTrainer.

Each step samples responses to a batch of prompts from the policy, scores them with the reward
model (``reward_model.identifier``, a sequence classifier: the probability of its last label, e.g.
POSITIVE for a sentiment model), subtracts a KL penalty against the frozen starting model, and
takes ``ppo_epochs`` clipped-ratio updates with the batch-mean reward as the baseline (no learned
value head: an honest simplification of PPO, documented in ARCHITECTURE.md).
"""

from __future__ import annotations

import copy
from typing import Any

from .protocol import SpecError, Task, device, get, model_ref, output_dir, progress, resolve_model


def response_logprobs(model: Any, prompt_ids: Any, response_ids: Any) -> Any:
    """Sum of the log-probabilities the model gives the response tokens after the prompt."""
    import torch

    ids = torch.cat([prompt_ids, response_ids]).unsqueeze(0)
    logits = model(ids).logits[0, prompt_ids.shape[0] - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(1, response_ids.unsqueeze(1)).sum()


def run_ppo(task: Task) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    spec = task.spec
    prompts = [p if isinstance(p, str) else str(p.get("prompt")) for p in get(spec, "data.prompts") or []]
    if not prompts:
        raise SpecError("a ppo task needs data.prompts")
    reward_ref = get(spec, "reward_model.identifier") or get(spec, "reward_model.path")
    if not reward_ref:
        raise SpecError("a ppo task needs reward_model.identifier (a sequence classifier)")
    t = spec.get("training") or {}
    steps = int(t.get("max_steps") or t.get("steps") or 1)
    batch = max(1, int(t.get("batch_size") or 2))
    epochs = max(1, int(t.get("ppo_epochs") or 1))
    lr = float(t.get("learning_rate") or 1e-5)
    clip, kl_coef = float(t.get("cliprange", 0.2)), float(t.get("kl_coef", 0.05))
    max_new = int(get(spec, "generation.max_new_tokens") or 16)
    temperature = float(get(spec, "generation.temperature") or 1.0)
    dev = device(spec)
    torch.manual_seed(int(t.get("seed") or 0))

    base = resolve_model(model_ref(spec), task)
    tokenizer = AutoTokenizer.from_pretrained(base)
    policy = AutoModelForCausalLM.from_pretrained(base).to(dev)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    reward_path = resolve_model(str(reward_ref), task)
    reward_tok = AutoTokenizer.from_pretrained(reward_path)
    reward_model = AutoModelForSequenceClassification.from_pretrained(reward_path).to(dev).eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    history: list[dict[str, float]] = []
    for step in range(1, steps + 1):
        chosen = [prompts[((step - 1) * batch + i) % len(prompts)] for i in range(batch)]
        samples = []
        policy.eval()
        for text in chosen:
            prompt_ids = tokenizer(text, return_tensors="pt").input_ids[0].to(dev)
            with torch.no_grad():
                out = policy.generate(prompt_ids.unsqueeze(0), max_new_tokens=max_new, min_new_tokens=1, do_sample=True,
                                      temperature=temperature, pad_token_id=pad)
                response_ids = out[0, prompt_ids.shape[0]:]
                old = response_logprobs(policy, prompt_ids, response_ids)
                ref = response_logprobs(reference, prompt_ids, response_ids)
                scored = reward_tok(text + " " + tokenizer.decode(response_ids, skip_special_tokens=True),
                                    return_tensors="pt", truncation=True).to(dev)
                score = torch.softmax(reward_model(**scored).logits[0].float(), dim=-1)[-1]
            samples.append((prompt_ids, response_ids, old, float(score) - kl_coef * float(old - ref), float(score)))
        rewards = torch.tensor([s[3] for s in samples])
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-8) if len(samples) > 1 else rewards - rewards.mean()
        policy.train()
        for _ in range(epochs):
            optimizer.zero_grad()
            losses = []
            for (prompt_ids, response_ids, old, _, _), adv in zip(samples, advantages):
                new = response_logprobs(policy, prompt_ids, response_ids)
                ratio = torch.exp((new - old) / max(1, response_ids.shape[0]))
                losses.append(-torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv))
            loss = torch.stack(losses).mean()
            loss.backward()
            optimizer.step()
        entry = {"loss": loss.item(), "reward": float(sum(s[4] for s in samples) / len(samples)),
                 "kl": float(sum(float(s[2]) for s in samples) / len(samples))}
        history.append(entry)
        progress(kind="train", step=step, max_steps=steps, learning_rate=lr, **entry)

    target = output_dir() / "artifacts" / "checkpoints"
    target.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return {
        "ok": True,
        "task_type": "ppo",
        "algorithm": "ppo-clip, batch-mean baseline, KL penalty to the starting model",
        "base_model": base,
        "reward_model": reward_path,
        "global_step": steps,
        "losses": [h["loss"] for h in history],
        "rewards": [h["reward"] for h in history],
        "final_loss": history[-1]["loss"],
        "final_model_path": "artifacts/checkpoints",
        "final_model_archive": f"{task.task_id}/artifacts/checkpoints",
    }
