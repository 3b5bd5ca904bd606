"""Preference-training losses (DPO, IPO, cDPO, ORPO, KTO) and the metrics TRL logs for them: pure torch functions.

Each loss is written from its paper's definition; tests/test_preference_loss.py proves it equal to TRL 1.16's
trainers on the same model, batch and beta (loss, rewards, gradients). The trainer that feeds them is
`ortlab.train.preferencetrainer`; the batches come from `ortlab.train.preferencebatch`.

Conventions (the same as TRL's, so that the numbers compare):
- A sequence's log-probability is the sum, over its answer tokens (labels not -100), of log p(token | everything
  before it): logits at position t score the label at t+1, as in a causal LM's own loss. ORPO averages per token.
- A "reward" is beta times the policy's log-probability ratio to the reference, `beta * (logp - ref_logp)`, the
  implicit reward of DPO; ORPO, which has no reference, reports `beta * mean-token logp`.
- Paired batches hold the chosen answers first and the rejected ones second (one forward for both).

Sources: DPO, Rafailov et al. 2023 (arXiv 2305.18290), eq. 7; cDPO, Mitchell 2023 ("A note on DPO with noisy
preferences"); IPO, Azar et al. 2023 (arXiv 2310.12036), eq. 17, on per-token averaged log-ratios as TRL computes
it (its authors confirmed the normalisation to TRL); ORPO, Hong et al. 2024 (arXiv 2403.07691), eqs. 4-7; KTO,
Ethayarajh et al. 2024 (arXiv 2402.01306), eq. 7 with the KL estimate of section 4.1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

__all__ = [
    "IGNORE",
    "PreferenceLoss",
    "dpo_loss",
    "kto_kl",
    "kto_loss",
    "kto_metric_sums",
    "kto_metrics",
    "kto_metrics_from_sums",
    "orpo_loss",
    "pair_metrics",
    "sequence_logps",
    "token_logps",
]

IGNORE = -100  # the label of a token that is not trained (prompt, padding): as transformers' losses


@dataclass
class PreferenceLoss:
    """What a preference loss returns: the scalar to minimise, each example's loss, the rewards (detached) and
    the loss's own extra numbers for the logs (ORPO's log-odds, KTO's KL)."""

    loss: torch.Tensor
    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


def token_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each position's log-probability of its next label, and the mask of positions that count.

    `logits` (batch, length, vocab) and `labels` (batch, length, -100 where not trained) are the model's input
    positions; the result is (batch, length - 1): position t's logits score label t+1. Computed in float32 (the
    log-softmax of bf16 logits loses the small differences DPO lives on); masked positions are 0.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} differ before the vocab axis")
    logits = logits[:, :-1, :]
    labels = labels[:, 1:]
    mask = labels != IGNORE
    picked = torch.gather(logits, -1, labels.masked_fill(~mask, 0).unsqueeze(-1)).squeeze(-1).float()
    if logits.dtype == torch.float32:
        norm = torch.logsumexp(logits, dim=-1)
    else:  # one row at a time: a float32 copy of a whole batch of logits would be (batch, length, vocab) * 4 bytes
        norm = torch.stack([torch.logsumexp(row.float(), dim=-1) for row in logits])
    return (picked - norm).masked_fill(~mask, 0.0), mask


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor, average: bool = False) -> torch.Tensor:
    """log p(answer | prompt) of each sequence: the sum of its answer tokens' log-probabilities (the mean per answer
    token with `average=True`, as ORPO uses). Labels are -100 outside the answer; shifted as in causal-LM training."""
    logps, mask = token_logps(logits, labels)
    total = logps.sum(-1)
    return total / mask.sum(-1).clamp(min=1) if average else total


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    ipo: bool = False,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
) -> PreferenceLoss:
    """DPO's loss on pairs of summed answer log-probabilities (policy and reference).

    sigmoid (DPO): -log sigmoid(beta * (chosen log-ratio - rejected log-ratio)).
    label_smoothing = eps > 0 (cDPO): the preference is taken as flipped with probability eps,
        -(1 - eps) log sigmoid(beta d) - eps log sigmoid(-beta d). (TRL 1.16's "sigmoid" ignores label_smoothing; its
        older releases computed exactly this; the test builds it from TRL's "sigmoid" and "robust" losses.)
    ipo=True (IPO): (h - 1 / (2 beta))^2 with h the difference of the per-answer-token *mean* log-ratios, which
        needs `chosen_lengths` / `rejected_lengths` (answer tokens per sequence); beta is IPO's tau.
    """
    chosen_ratio = chosen_logps - ref_chosen_logps
    rejected_ratio = rejected_logps - ref_rejected_logps
    if ipo:
        if chosen_lengths is None or rejected_lengths is None:
            raise ValueError("IPO averages the log-ratios per answer token: pass chosen_lengths and rejected_lengths")
        h = chosen_ratio / chosen_lengths.clamp(min=1) - rejected_ratio / rejected_lengths.clamp(min=1)
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        d = beta * (chosen_ratio - rejected_ratio)
        losses = -(1 - label_smoothing) * F.logsigmoid(d)
        if label_smoothing:
            losses = losses - label_smoothing * F.logsigmoid(-d)
    return PreferenceLoss(
        loss=losses.mean(),
        losses=losses,
        chosen_rewards=beta * chosen_ratio.detach(),
        rejected_rewards=beta * rejected_ratio.detach(),
    )


def _log1m_exp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, accurate on both sides of -log 2 (Maechler 2012, "Accurately computing
    log(1-exp(-|a|))")."""
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_loss(
    chosen_mean_logps: torch.Tensor, rejected_mean_logps: torch.Tensor, chosen_nll: torch.Tensor, beta: float = 0.1
) -> PreferenceLoss:
    """ORPO: the chosen answers' NLL plus beta (the paper's lambda) times the odds-ratio term, no reference model.

    odds(y) = p / (1 - p) with p the per-token mean probability of the answer (exp of the mean log-probability);
    log OR = log odds(chosen) - log odds(rejected); L = NLL(chosen) - beta * mean(log sigmoid(log OR)).
    `chosen_nll` is the chosen sequences' causal-LM loss (a scalar; which tokens it covers is the trainer's choice).
    Rewards as TRL logs them: beta * mean log-probability. `extra`: nll_loss, log_odds_ratio (the mean of
    log sigmoid(log OR)) and log_odds_chosen (the mean log OR).
    """
    chosen = chosen_mean_logps.float()
    rejected = rejected_mean_logps.float()
    log_odds = (chosen - rejected) - (_log1m_exp(chosen) - _log1m_exp(rejected))
    ratio = F.logsigmoid(log_odds)
    losses = chosen_nll - beta * ratio
    return PreferenceLoss(
        loss=chosen_nll - beta * ratio.mean(),
        losses=losses,
        chosen_rewards=beta * chosen.detach(),
        rejected_rewards=beta * rejected.detach(),
        extra={
            "nll_loss": chosen_nll.detach(),
            "log_odds_ratio": ratio.mean().detach(),
            "log_odds_chosen": log_odds.mean().detach(),
        },
    )


def kto_kl(kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor) -> torch.Tensor:
    """KTO's reference point z0: the policy's KL to the reference, estimated on mismatched (prompt, answer) pairs,
    mean(log pi(y'|x) - log ref(y'|x)), detached (no gradient flows through it) and clipped at 0. With several
    processes, average the unclipped estimates over processes first and clip after (as TRL does)."""
    return (kl_logps - ref_kl_logps).mean().detach().clamp(min=0)


def kto_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    kl: torch.Tensor,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> PreferenceLoss:
    """KTO on unpaired answers: r = log pi(y|x) - log ref(y|x); a desirable answer loses 1 - sigmoid(beta (r - z0)),
    an undesirable one 1 - sigmoid(beta (z0 - r)), weighted by lambda_D / lambda_U; the loss is the mean over the
    batch. `desirable` is a bool per row; `kl` is z0 (`kto_kl`). Rewards are beta * r of each group (either may be
    empty); `losses` lists the desirable rows' losses first."""
    desirable = desirable.bool()
    ratio = logps - ref_logps
    chosen_ratio, rejected_ratio = ratio[desirable], ratio[~desirable]
    chosen_losses = 1 - torch.sigmoid(beta * (chosen_ratio - kl))
    rejected_losses = 1 - torch.sigmoid(beta * (kl - rejected_ratio))
    losses = torch.cat((desirable_weight * chosen_losses, undesirable_weight * rejected_losses))
    return PreferenceLoss(
        loss=losses.mean(),
        losses=losses,
        chosen_rewards=beta * chosen_ratio.detach(),
        rejected_rewards=beta * rejected_ratio.detach(),
        extra={"kl": kl.detach()},
    )


def pair_metrics(out: PreferenceLoss, chosen_logps: torch.Tensor, rejected_logps: torch.Tensor) -> dict[str, float]:
    """What TRL logs for a batch of pairs (DPO, IPO, ORPO): the mean rewards, their margin, the share of pairs whose
    chosen reward is higher (the preference accuracy) and the mean log-probabilities; plus the loss's extras."""
    chosen, rejected = out.chosen_rewards.float(), out.rejected_rewards.float()
    metrics = {
        "rewards/chosen": chosen.mean().item(),
        "rewards/rejected": rejected.mean().item(),
        "rewards/accuracies": (chosen > rejected).float().mean().item(),
        "rewards/margins": (chosen - rejected).mean().item(),
        "logps/chosen": chosen_logps.detach().float().mean().item(),
        "logps/rejected": rejected_logps.detach().float().mean().item(),
    }
    metrics.update({k: float(v) for k, v in out.extra.items()})
    return metrics


def kto_metric_sums(out: PreferenceLoss, logps: torch.Tensor, desirable: torch.Tensor) -> torch.Tensor:
    """The sums KTO's metrics are made of, [reward, logp, count] of the desirable rows then of the undesirable ones:
    sums add up across processes (a process's batch may hold only one group), means would not."""
    desirable = desirable.bool()
    logps = logps.detach().float()
    return torch.stack(
        [
            out.chosen_rewards.float().sum(),
            logps[desirable].sum(),
            desirable.sum().float(),
            out.rejected_rewards.float().sum(),
            logps[~desirable].sum(),
            (~desirable).sum().float(),
        ]
    )


def kto_metrics_from_sums(sums: torch.Tensor, kl: torch.Tensor) -> dict[str, float]:
    """What TRL logs for KTO: the KL estimate, and for each group the batch has the mean reward and log-probability;
    the margin only when both groups are present. KTO has no pairs, so no accuracy."""
    c_reward, c_logp, c_n, r_reward, r_logp, r_n = (float(x) for x in sums)
    metrics = {"kl": float(kl)}
    if c_n:
        metrics.update({"rewards/chosen": c_reward / c_n, "logps/chosen": c_logp / c_n})
    if r_n:
        metrics.update({"rewards/rejected": r_reward / r_n, "logps/rejected": r_logp / r_n})
    if c_n and r_n:
        metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
    return metrics


def kto_metrics(out: PreferenceLoss, logps: torch.Tensor, desirable: torch.Tensor) -> dict[str, float]:
    """KTO's metrics of one batch on one process (`kto_metrics_from_sums` of `kto_metric_sums`)."""
    return kto_metrics_from_sums(kto_metric_sums(out, logps, desirable), out.extra["kl"])
