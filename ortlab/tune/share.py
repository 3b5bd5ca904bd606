"""What `ortlab tune`'s table holds beside the verdicts: each mix against plain `transformers.Trainer`, in fp32 and
with `bf16=True`, and the share of this machine's measured peak each mix reached.

Why the two references: ortlab's own "plain" candidate is ORTTrainer with nothing on, the baseline a mix must beat
to be chosen. A user compares with what they ran before, `transformers.Trainer`, and often with one flag flipped
(`bf16=True`): ortlab must say what it gains over both, measured in the same interleaved rounds (two more candidate
processes, never chosen). Why the share of the peak: a ratio says which mix is faster, not how far any is from
what the machine can do; the model's FLOP/s (`ortlab.flops`) over the dense matmul peak measured here for the
precision the mix trains in (`ortlab.peak`) does.

The references and the share are measured for the table (`ortlab tune`), not for the automatic decision of a
run's 'auto' mix, which keeps its budget for the candidates.
"""

from __future__ import annotations

import statistics
from typing import Any

from ortlab.tune.mixes import MixCandidate
from ortlab.tune.result import Measured

TRAINER, TRAINER_BF16 = "trainer_fp32", "trainer_bf16"


def references(bf16_skipped: str | None) -> list[MixCandidate]:
    """Plain `transformers.Trainer` in fp32 and with `bf16=True` (skipped where bf16 is, with the same reason)."""
    return [
        MixCandidate(TRAINER, reference=True),
        MixCandidate(TRAINER_BF16, precision="bf16", reference=True, skipped=bf16_skipped),
    ]


def reference_verdict(name: str) -> str:
    return "reference: plain transformers.Trainer" + (" with bf16=True" if name == TRAINER_BF16 else " (fp32)")


def add_reference_ratios(measured: list[Measured], refs: dict[str, Measured]) -> None:
    """Each measured row's median paired ratio to each reference's slices of the same rounds (None where a side
    did not finish every round)."""
    for m in measured:
        for name, field in ((TRAINER, "vs_trainer"), (TRAINER_BF16, "vs_trainer_bf16")):
            ref = refs.get(name)
            if ref is None or not ref.slices or len(m.slices) != len(ref.slices):
                continue
            setattr(m, field, statistics.median(a / b for a, b in zip(m.slices, ref.slices, strict=True)))


def mean_flops_per_sample(
    model_path: str, task: str, label_names: list[str] | None, revision: str | None, batches
) -> Any:
    """Training FLOPs per sample: `ortlab.flops.flops_per_sample` averaged over `batches` (their padded shapes:
    padding is computed too), the model counted on its skeleton on the meta device (no weights); None when the
    config names no layer count or hidden size."""
    import torch
    import transformers

    from ortlab.flops import count_parameters, flops_per_sample
    from ortlab.tasks import TASK_FEATURES, get_feature

    config = transformers.AutoConfig.from_pretrained(model_path, revision=revision)
    if label_names:
        config.num_labels = len(label_names)
    auto = getattr(transformers, get_feature(TASK_FEATURES[task]).auto_class)
    try:
        auto._model_mapping[type(config)]  # imported outside the meta device (see ortlab.adapters.check_model)
    except KeyError:
        return None
    with torch.device("meta"):
        shape = count_parameters(auto.from_config(config))
    if shape is None:
        return None
    sizes = [tuple(b["input_ids"].shape) for b in batches]
    return sum(n * flops_per_sample(shape, length) for n, length in sizes) / sum(n for n, _ in sizes)


def measured_peaks(precisions: set[str], device: str) -> dict[str, dict[str, Any]]:
    """The measured dense matmul peak of each precision (`ortlab.peak`: cached, or about a second each)."""
    from ortlab.peak import measured_peak

    out = {}
    for precision in sorted(precisions):
        try:
            peak, cached = measured_peak(precision, device)
            out[precision] = {**peak.to_dict(), "cached": cached}
        except Exception as e:  # a precision this build lacks: no share for its rows, the table still comes
            out[precision] = {"error": f"{type(e).__name__}: {e}"[:300]}
    return out


def add_peak_share(measured: list[Measured], flops: float | None, peaks: dict[str, dict[str, Any]]) -> None:
    """Each row's model FLOP/s over the measured peak of the precision it trains in, in percent."""
    for m in measured:
        peak = peaks.get(m.choice.get("precision") or "fp32", {})
        if flops and m.samples_per_s and peak.get("flops"):
            m.peak_pct = 100 * m.samples_per_s * flops / peak["flops"]
