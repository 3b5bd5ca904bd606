"""A batch of pairs scored with each prompt computed once: the prompts, then the answers on the prompts' KV cache.

Why: `PairCollator` pads prompt + chosen and prompt + rejected into 2N rows, so a DPO step runs every prompt twice
through the policy (and, with a reference that is not precomputed, twice more through the reference). In chat data
the prompt is most of a row (ortlab's tutorial pairs: a 70-90-token rendered prompt, answers of 1-30 tokens), so
most of the work was the same prompt done twice. Here the N prompts run once (`use_cache=True`); the 2N answers
run on their prompt's keys and values (each prompt's cache repeated for its chosen and its rejected answer), with
position ids that continue from each prompt's true length and an attention mask [prompt mask, answer mask]. The
prompts are right-padded, so that mask has holes between a short prompt and its answer; transformers builds the
4-D causal-and-padding mask from the 2-D one (sdpa and eager), so the holes are never attended. The first answer
token is scored by the logits of the prompt's last real position, the others by the answer forward's logits.

It is the same computation as the full rows (each answer token attends to the same keys at the same positions),
so the log-probabilities, the loss, the rewards and the gradients (which flow through the cache into the prompt's
forward) equal the full rows' to float rounding: tests/test_shared_prompt.py proves it within 1e-5 in float32.

Where it is exact and supported (`unsupported`, `layout`): a decoder-only causal LM whose forward takes
`past_key_values` and `position_ids`, full attention (no sliding window: its cache keeps the last tokens of a
padded prompt, which may be padding), sdpa or eager attention, right padding, and each pair's chosen and rejected
rows beginning with the same prompt (the tokens before the first trained label) of at least one token. Elsewhere
the trainer runs the full rows and says why (`PreferenceTrainer.prompt_sharing`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from ortlab.train.preference import IGNORE, sequence_logps

__all__ = ["SharedLayout", "causal_lm", "layout", "pair_logps", "unsupported"]

ATTENTION = ("sdpa", "eager")


def causal_lm(model: Any) -> Any:
    """The transformers model inside a peft model (or DDP's wrapper around one)."""
    model = getattr(model, "module", model)
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def unsupported(model: Any) -> str | None:
    """Why the prompt cannot be shared for `model` (None: it can)."""
    lm = causal_lm(model)
    config = getattr(lm, "config", None)
    name = type(lm).__name__
    if config is None or getattr(config, "is_encoder_decoder", False):
        return f"{name} is not a decoder-only causal LM"
    params = inspect.signature(lm.forward).parameters
    missing = [p for p in ("past_key_values", "position_ids") if p not in params]
    if missing:
        return f"{name}.forward takes no {'/'.join(missing)}"
    if getattr(config, "sliding_window", None) or "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return f"{name} uses sliding-window attention (its cache of a padded prompt may keep padding only)"
    attention = getattr(config, "_attn_implementation", None) or "eager"
    if attention not in ATTENTION:
        return f"attention implementation {attention!r} (shared prompts are checked with {ATTENTION})"
    return None


@dataclass
class SharedLayout:
    """A batch of N pairs cut into N prompts and 2N answers (rows 2i and 2i+1: pair i's chosen and rejected)."""

    prompt_ids: torch.Tensor  # (N, Lp), right-padded
    prompt_mask: torch.Tensor  # (N, Lp)
    prompt_lengths: torch.Tensor  # (N,)
    answer_ids: torch.Tensor  # (2N, La), right-padded
    answer_mask: torch.Tensor  # (2N, Lp + La): the prompt's mask, then the answer's
    answer_labels: torch.Tensor  # (2N, 1 + La): IGNORE, then the answer's labels (the shift of `token_logps`)
    positions: torch.Tensor  # (2N, La): each answer's position ids, from its prompt's length on

    @property
    def positions_computed(self) -> int:
        """Token positions one model runs on (padding included): N x Lp + 2N x La, against 2N x L for full rows."""
        return self.prompt_ids.numel() + self.answer_ids.numel()


def layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> SharedLayout | str:
    """The batch of 2N full rows (N chosen, then N rejected, `PairCollator`'s) as prompts and answers, or why not.

    A row's prompt is its tokens before the first trained label (`split_prompt`'s rule), so a chat rendering's
    prompt (system, user, the assistant header) is shared as well as TRL-style `prompt_ids`.
    """
    rows, width = input_ids.shape
    n = rows // 2
    lengths = attention_mask.sum(-1)
    positions = torch.arange(width, device=input_ids.device)
    if not torch.equal(attention_mask.bool(), positions < lengths[:, None]):
        return "the rows are not right-padded"
    trained = labels != IGNORE
    if not trained.any(-1).all():
        return "a row has no trained token"
    starts = trained.int().argmax(-1)  # the first trained label: the prompt's length
    if (starts[:n] == 0).any():
        return "a pair has no prompt token before its answer"
    if not torch.equal(starts[:n], starts[n:]):
        return "a pair's chosen and rejected prompts differ in length"
    prompt_width = int(starts.max())
    in_prompt = positions[:prompt_width] < starts[:n, None]
    if not torch.equal(input_ids[:n, :prompt_width] * in_prompt, input_ids[n:, :prompt_width] * in_prompt):
        return "a pair's chosen and rejected rows begin with different prompt tokens"
    answer_width = int((lengths - starts).max())
    index = starts[:, None] + torch.arange(answer_width, device=input_ids.device)
    in_answer = index < lengths[:, None]
    index = index.clamp(max=width - 1)  # padding positions: any valid index (masked; GPT-2's positions are bounded)
    answer_ids = input_ids.gather(1, index) * in_answer
    answer_labels = labels.gather(1, index).masked_fill(~in_answer, IGNORE)
    order = torch.stack([torch.arange(n), torch.arange(n) + n], 1).reshape(-1).to(input_ids.device)
    prompt_mask = in_prompt.long()
    return SharedLayout(
        prompt_ids=input_ids[:n, :prompt_width],
        prompt_mask=prompt_mask,
        prompt_lengths=starts[:n],
        answer_ids=answer_ids[order],
        answer_mask=torch.cat([prompt_mask.repeat_interleave(2, 0), in_answer[order].long()], 1),
        answer_labels=torch.cat([torch.full_like(answer_labels[order, :1], IGNORE), answer_labels[order]], 1),
        positions=index[order],
    )


def pair_logps(model: Any, shared: SharedLayout) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The summed answer log-probabilities (chosen, rejected) of the pairs in `shared`, as `sequence_logps` of the
    full rows gives them. Gradients flow where `model` has them (the policy; call it under no_grad for a
    reference). None if the model's cache cannot be repeated per answer (the caller then runs the full rows)."""
    last = shared.prompt_lengths - 1  # the position whose logits score each answer's first token
    keep: dict[str, Any] = {}
    if "logits_to_keep" in inspect.signature(causal_lm(model).forward).parameters:
        kept, last = torch.unique(last, return_inverse=True)  # only the logits of those positions: (N, kept, vocab)
        keep["logits_to_keep"] = kept
    out = model(input_ids=shared.prompt_ids, attention_mask=shared.prompt_mask, use_cache=True, **keep)
    cache = out.past_key_values
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        return None
    first = out.logits[torch.arange(len(last), device=last.device), last]  # (N, vocab)
    cache.batch_repeat_interleave(2)  # row 2i and 2i+1: pair i's chosen and rejected answers
    answers = model(
        input_ids=shared.answer_ids,
        attention_mask=shared.answer_mask,
        position_ids=shared.positions,
        past_key_values=cache,
        use_cache=True,
    ).logits
    logits = torch.cat([first.repeat_interleave(2, 0).unsqueeze(1).to(answers.dtype), answers], 1)
    chosen, rejected = sequence_logps(logits, shared.answer_labels).view(-1, 2).unbind(-1)
    return chosen, rejected
