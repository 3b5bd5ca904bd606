"""How to decide: which candidate wins, from the interleaved measurements, with margins that keep plain unless
another mix is clearly faster (the default must never lose).

A candidate whose loss is not finite or strays from plain's is rejected; the winner must be faster than plain
by more than WIN_MARGIN in the median of its paired ratios and pass a sign test over the rounds (so many rounds
won that chance explains it with p <= SIGN_ALPHA).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ortlab.tune.result import Measured

SIGN_ALPHA = 0.1  # a mix beats plain only if it won so many rounds that chance explains it with p <= this
WIN_MARGIN = 0.03  # a mix must be >= 3 % faster than plain in the median, and faster in every round
LOSS_RTOL, LOSS_ATOL = 0.05, 0.05  # mean training loss over the measured steps, against plain's


def _clearly_faster(paired: list[float], alpha: float = SIGN_ALPHA) -> bool:
    """A sign test: faster than plain in so many rounds that a coin (no real difference) would do it rarely."""
    n, wins = len(paired), sum(p > 1 for p in paired)
    tail = sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n
    return tail <= alpha


def _applied(applied: dict[str, bool], key: str, value: Any) -> bool:
    name = {"ort": "ort", "fused_adam": "fused_adam", "torch_compile": "torch_compile"}.get(key, value)
    return bool(applied.get(name))


def _judge(measured: dict[str, Measured], losses: dict[str, list[float]], live: dict) -> str:
    """Fill in every verdict; return the chosen candidate's name (plain unless another clearly wins)."""
    plain = measured["plain"]
    plain.samples_per_s = statistics.median(plain.slices)
    plain.ratio, plain.ratio_min, plain.ratio_max = 1.0, 1.0, 1.0
    plain_loss = statistics.fmean(losses["plain"]) if losses["plain"] else None
    plain.loss = plain_loss
    best, best_ratio = "plain", 1.0
    for name in live:
        m = measured[name]
        if len(m.slices) != len(plain.slices):
            m.verdict = m.verdict or "failed: did not finish every round"
            continue
        paired = [a / b for a, b in zip(m.slices, plain.slices, strict=True)]
        m.samples_per_s = statistics.median(m.slices)
        m.ratio, m.ratio_min, m.ratio_max = statistics.median(paired), min(paired), max(paired)
        m.loss = statistics.fmean(losses[name]) if losses[name] else None
        if name == "plain":
            continue
        if m.loss is None or not math.isfinite(m.loss):
            m.verdict = "rejected: the loss is not finite"
        elif plain_loss is not None and abs(m.loss - plain_loss) > LOSS_ATOL + LOSS_RTOL * abs(plain_loss):
            m.verdict = f"rejected: loss {m.loss:.4f} strays from plain's {plain_loss:.4f}"
        elif m.ratio < 1 + WIN_MARGIN or not _clearly_faster(paired):
            wins = sum(p > 1 for p in paired)
            m.verdict = (
                f"slower: {m.ratio:.2f}x plain"
                if m.ratio < 1
                else f"within noise: {m.ratio:.2f}x plain, faster in {wins} of {len(paired)} rounds; plain kept"
            )
        elif m.ratio > best_ratio:
            best, best_ratio = name, m.ratio
    for name in live:
        m = measured[name]
        if name == best:
            m.verdict = "chosen" + (f": {m.ratio:.2f}x plain" if name != "plain" else ": nothing measured faster")
        elif name == "plain":
            m.verdict = f"the baseline ({best} measured faster)"
        elif not m.verdict:
            m.verdict = f"slower than {best}: {m.ratio:.2f}x plain"
    return best
