"""The precision probe (ortlab.tune.precisionrace): bf16 only where it is measured faster and computes the same loss,
and the run that follows is untouched by the probe."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ortlab.tune import precisionrace as pp


def _times(fp32: list[float], bf16: list[float]) -> dict[str, list[float]]:
    return {"fp32": fp32, "bf16": bf16}


def test_a_clearly_faster_candidate_with_the_same_loss_is_chosen():
    probe = pp._decide("bf16", _times([1.0] * 4, [0.6] * 4), {"fp32": 0.69, "bf16": 0.70}, 3.0)
    assert probe.chosen == "bf16" and probe.ratio == pytest.approx(1 / 0.6) and probe.wins == 4
    assert "1.67x fp32" in probe.verdict


@pytest.mark.parametrize(
    ("fp32", "bf16", "losses", "why"),
    [
        ([1.0] * 4, [1.6] * 4, {"fp32": 0.69, "bf16": 0.69}, "fp32: bf16 measured 0.62x"),
        ([1.0] * 4, [0.98] * 4, {"fp32": 0.69, "bf16": 0.69}, "fp32: bf16 measured 1.02x"),  # within the margin
        ([1.0, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 1.2], {"fp32": 0.69, "bf16": 0.69}, "faster in 3 of 4"),  # sign test
        ([1.0] * 4, [0.5] * 4, {"fp32": 0.69, "bf16": 0.95}, "strays from fp32's"),
        ([1.0] * 4, [0.5] * 4, {"fp32": 0.69, "bf16": float("nan")}, "not finite"),
    ],
    ids=["slower", "within-margin", "lost-a-round", "loss-strays", "loss-nan"],
)
def test_fp32_stays_unless_the_candidate_clearly_wins(fp32, bf16, losses, why):
    probe = pp._decide("bf16", _times(fp32, bf16), losses, 3.0)
    assert probe.chosen == "fp32", probe
    assert why in probe.verdict, probe.verdict


def _tiny_classifier(seed: int = 0):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=2
    )
    return BertForSequenceClassification(config)


def _batches(n: int = 9) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    return [
        {"input_ids": torch.randint(5, 64, (4, 16), generator=g), "labels": torch.randint(0, 2, (4,), generator=g)}
        for _ in range(n)
    ]


def test_the_probe_leaves_the_model_and_the_random_state_as_they_were(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path))
    model = _tiny_classifier()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    probe = pp.probe_precision(model, _batches(), model_path="tiny", candidate="bf16", progress=lambda m: None)
    assert torch.equal(torch.rand(3), expected), "the random state the run's dropout draws from was put back"
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items()), "no weight changed"
    assert all(p.grad is None for p in model.parameters()), "no gradient left behind"
    assert probe.chosen in ("fp32", "bf16") and probe.rounds >= 2
    assert probe.loss_fp32 is not None and probe.loss_candidate is not None
    # Measured once: the next probe of the same model and shapes answers from the cache without timing anything.
    monkeypatch.setattr(pp, "_measure", lambda *a: pytest.fail("measured again"))
    again = pp.probe_precision(model, _batches(), model_path="tiny", candidate="bf16", progress=lambda m: None)
    assert again.cached and again.chosen == probe.chosen


def test_a_losing_candidate_stops_after_two_lost_rounds(tmp_path, monkeypatch):
    clock = iter(range(1000))
    monkeypatch.setattr(pp.time, "perf_counter", lambda: float(next(clock)))  # each step takes exactly 1 tick ...
    steps: list[str] = []
    real_autocast = torch.autocast

    def autocast(device_type, dtype=None, enabled=True):
        steps.append("bf16" if enabled else "fp32")
        if enabled:
            next(clock)  # ... and a bf16 step one more: bf16 always loses
        return real_autocast(device_type, dtype=dtype, enabled=enabled)

    monkeypatch.setattr(torch, "autocast", autocast)
    probe = pp._measure(_tiny_classifier(), _batches(), "bf16")
    assert probe.chosen == "fp32" and probe.rounds == pp.LOSSES_DECIDE, probe
    assert len(steps) == 2 + 2 * pp.LOSSES_DECIDE, steps  # the warm-up pair, then two rounds


@pytest.mark.slow
def test_a_run_at_auto_precision_trains_in_what_the_probe_chose(tmp_path, tiny_bert, monkeypatch):
    """Whatever the probe decides is what the run trains in, verified in the run (the precision observed in the
    first step), and recorded with the probe's timings; a second run reuses the verdict."""
    from ortlab.runfolder.rundir import RunDir
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    if pp.candidate_precision()[0] != "bf16":
        pytest.skip("this machine has no fast bf16: the probe is not run (covered by the next test)")
    # Force the verdict: bf16 measured faster (the measurement itself is covered above).
    real_decide = pp._decide
    monkeypatch.setattr(
        pp,
        "_decide",
        lambda c, times, losses, spent, cut=False: real_decide(c, _times([1.0] * 4, [0.5] * 4), losses, spent),
    )
    spec = RunSpec.parse(
        {
            "output_dir": str(tmp_path / "runs"),
            "model": {"name": str(tiny_bert)},
            "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 160, "max_eval_samples": 16},
            "hyper": {"batch_size": 8, "max_length": 32, "max_steps": 3},
        }
    )
    result = train_spec(spec, progress=False)
    records = list(RunDir(Path(result["run_dir"])).metrics())
    auto = next(r for r in records if r.get("event") == "auto")
    assert auto["resolved"]["precision"] == "bf16" and auto["precision_probe"]["chosen"] == "bf16", auto
    assert auto["why"].startswith("bf16: measured 2.00x fp32, faster in 4 of 4 rounds"), auto["why"]
    assert result["accelerations"]["bf16"]["applied"], result["accelerations"]["bf16"]
    monkeypatch.setattr(pp, "_measure", lambda *a: pytest.fail("measured again"))
    second = train_spec(spec.model_copy(update={"name": "second"}), progress=False)
    auto = next(r for r in RunDir(Path(second["run_dir"])).metrics() if r.get("event") == "auto")
    assert auto["precision_probe"]["cached"] and "a cached probe" in auto["why"]


def test_a_cpu_without_fast_bf16_is_not_probed(monkeypatch):
    from ortlab.accel import Availability, precision

    monkeypatch.setattr(
        precision, "bf16_availability", lambda: Availability("bf16", True, "emulated (no avx512_bf16)", "-", slow=True)
    )
    monkeypatch.setattr(precision, "fp16_availability", lambda: Availability("fp16", False, "needs CUDA", "-"))
    candidate, why = pp.candidate_precision()
    assert candidate is None and "emulated (no avx512_bf16)" in why


@pytest.mark.slow
def test_measuring_on_the_way_changes_nothing_the_run_trains(tmp_path, tiny_bert, monkeypatch):
    """The same spec trained twice: the first run probes the precision and measures the peak, the second finds
    both cached. Their losses agree to every digit (a measurement that drew from the seeded random state once made
    the first loss 0.6909 against 0.6890)."""
    from ortlab.runfolder.rundir import RunDir
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    losses = []
    for name in ("measured", "cached"):
        spec = RunSpec.parse(
            {
                "output_dir": str(tmp_path / "runs"),
                "name": name,
                "model": {"name": str(tiny_bert)},
                "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 160, "max_eval_samples": 16},
                "hyper": {"batch_size": 8, "max_length": 32, "max_steps": 3},
            }
        )
        records = list(RunDir(Path(train_spec(spec, progress=False)["run_dir"])).metrics())
        auto = next(r for r in records if r.get("event") == "auto")
        begin = next(r for r in records if r.get("event") == "train_begin")
        cached = "cached" in begin["device"]["mfu"]["reason"]
        assert cached == (name == "cached"), begin["device"]["mfu"]
        if "precision_probe" in auto:
            assert auto["precision_probe"]["cached"] == (name == "cached")
        losses.append([r["loss"] for r in records if r.get("event") == "step"])
    assert losses[0] == losses[1]


def test_a_probe_too_slow_for_the_machine_stops_at_its_bound_and_keeps_fp32(monkeypatch):
    """An LLM on a loaded CPU once took 43 minutes to probe (MIN_ROUNDS rounds always ran): past HARD_S no new
    round starts, fp32 is kept, and the verdict says how to choose bf16 anyway."""
    clock = iter(range(0, 10_000, 7))  # every look at the clock: 7 s later
    monkeypatch.setattr(pp.time, "monotonic", lambda: float(next(clock)))
    steps: list[bool] = []
    real_autocast = torch.autocast

    def autocast(device_type, dtype=None, enabled=True):
        steps.append(enabled)
        return real_autocast(device_type, dtype=dtype, enabled=enabled)

    monkeypatch.setattr(torch, "autocast", autocast)
    probe = pp._measure(_tiny_classifier(), _batches(), "bf16")
    assert probe.chosen == "fp32" and probe.rounds < pp.MIN_ROUNDS, probe
    assert f"stopped at its {pp.HARD_S:.0f} s bound" in probe.verdict and "accel.precision: bf16" in probe.verdict
    assert len(steps) <= 2 + 2 * 2, steps  # the warm-up pair and at most the rounds the bound let start


def test_ort_on_a_cpu_keeps_fp32_and_refuses_bf16(monkeypatch):
    """ONNX Runtime's CPU kernels have no bf16 matmul ("Could not find an implementation for Gemm(13)", seen once the
    model had loaded on a CPU where the probe found bf16 faster). 'auto' keeps fp32 under ORT there, without probing;
    an explicit ort + bf16 is refused with its fix before anything loads."""
    from ortlab.accel.mix import problems
    from ortlab.mixrules import Mix
    from ortlab.spec import RunSpec
    from ortlab.tune import auto

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: ORT's bf16 question is another one there")
    monkeypatch.setattr(auto, "candidate_precision", lambda: ("bf16", "forced for the test"))
    monkeypatch.setattr(auto, "probe_precision", lambda *a, **k: pytest.fail("the probe ran under ORT on a CPU"))
    spec = RunSpec.parse({"accel": {"ort": True, "precision": "auto"}})
    choice, probe, why = auto._probed(spec, None, "m", [], None, print, "rest")
    assert choice is None and probe is None and "no bf16 matmul" in why
    errors, _ = problems(Mix(ort=True, precision="bf16"))
    assert any("ort with bf16 on a CPU" in e and "Fix:" in e for e in errors), errors
    errors, _ = problems(Mix(ort=True, precision="fp32"))
    assert not any("bf16" in e for e in errors), errors
