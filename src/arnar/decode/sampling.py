"""Token sampling: temperature, top-k, top-p (nucleus), greedy; restricted to allowed ids.

All functions work on the last dimension of ``logits`` and take an explicit
``torch.Generator`` so that a synthesis run is reproducible from its seed.
"""

from __future__ import annotations

import torch


def restrict_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Set the logits of ids outside ``allowed`` (a bool [V] vector) to -inf."""
    return logits.masked_fill(~allowed.to(logits.device), float("-inf"))


def filter_top_k_top_p(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Keep the ``top_k`` largest logits (0: all) and the smallest set of ids whose probability
    sums to at least ``top_p`` (1.0: all); the rest become -inf. The most likely id always stays."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # mass strictly before each id; an id is dropped once the mass before it reaches top_p
        before = probs.cumsum(-1) - probs
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(
    logits: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one id per row of ``logits`` [..., V].

    Returns ``(ids, probs)`` where ``probs`` is the probability of each chosen id under the
    *unfiltered* distribution at temperature 1 (the confidence MaskGIT-style loops rank by).
    ``temperature == 0`` is greedy.
    """
    shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1]).float()
    full_probs = flat.softmax(-1)
    if temperature <= 0:
        ids = flat.argmax(-1)
    else:
        filtered = filter_top_k_top_p(flat / temperature, top_k, top_p)
        probs_filtered = filtered.softmax(-1)
        if generator is not None and generator.device != probs_filtered.device:
            # a CPU generator (reproducible across devices) draws on the CPU
            probs_filtered = probs_filtered.cpu()
        ids = torch.multinomial(probs_filtered, 1, generator=generator).squeeze(-1).to(flat.device)
    probs = full_probs.gather(-1, ids[:, None]).squeeze(-1)
    return ids.reshape(shape), probs.reshape(shape)


def repetition_aware(
    ids: torch.Tensor,
    logits: torch.Tensor,
    history: list[int],
    generator: torch.Generator | None,
    *,
    window: int = 10,
    max_ratio: float = 0.1,
) -> torch.Tensor:
    """Repetition-aware sampling (VALL-E 2; CosyVoice 2 decodes its LM with it).

    If the id just sampled (nucleus sampling) already fills more than ``max_ratio`` of the last
    ``window`` generated ids, draw again from the full distribution instead: an AR speech LM
    otherwise tends to lock into a loop of one token. ``ids`` [1], ``logits`` [1, V] (already
    restricted to the allowed ids)."""
    recent = history[-window:]
    if window > 0 and recent and recent.count(int(ids[0])) > max_ratio * window:
        probs = logits.float().softmax(-1)
        if generator is not None and generator.device != probs.device:
            probs = probs.cpu()
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)
    return ids
