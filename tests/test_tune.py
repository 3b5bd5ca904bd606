"""The measured mix: candidates, the decision rule, the cache, and real measurements in real processes."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from ortlab import tune
from ortlab.spec import AccelSpec, RunSpec
from ortlab.tune import Measured
from ortlab.tune.precisionrace import candidate_precision


def _measured(name: str, slices: list[float]) -> Measured:
    return Measured(name, {}, slices=slices)


def test_sign_test_needs_many_wins():
    assert tune._clearly_faster([1.1] * 4), "4 of 4 rounds faster: p = 1/16"
    assert not tune._clearly_faster([1.1, 1.1, 1.1, 0.9]), "3 of 4 is what chance does 31 % of the time"
    assert tune._clearly_faster([1.2] * 7 + [0.9]), "7 of 8: p = 9/256"
    assert not tune._clearly_faster([1.5] * 5 + [0.5] * 3)


def test_judge_keeps_plain_unless_a_mix_clearly_wins():
    plain = [10.0] * 8
    measured = {
        "plain": _measured("plain", plain),
        "steady": _measured("steady", [11.0] * 8),  # 1.10x in every round: a clear win
        "lucky": _measured("lucky", [30.0, 30.0, 30.0, 30.0, 30.0, 5.0, 5.0, 5.0]),  # big median, 5 of 8 rounds
        "slow": _measured("slow", [8.0] * 8),
        "nan": _measured("nan", [20.0] * 8),
        "off": _measured("off", [20.0] * 8),
    }
    losses = {
        "plain": [0.70, 0.69],
        "steady": [0.70, 0.69],
        "lucky": [0.7],
        "slow": [0.7],
        "nan": [math.nan],
        "off": [2.5],
    }
    chosen = tune._judge(measured, losses, dict.fromkeys(measured))
    assert chosen == "steady"
    assert measured["steady"].verdict.startswith("chosen: 1.10x")
    assert measured["lucky"].verdict.startswith("within noise: 3.00x plain, faster in 5 of 8 rounds")
    assert measured["slow"].verdict == "slower: 0.80x plain"
    assert measured["nan"].verdict == "rejected: the loss is not finite"
    assert measured["off"].verdict.startswith("rejected: loss 2.5000 strays from plain's 0.6950")
    assert measured["plain"].verdict == "the baseline (steady measured faster)"


def test_judge_prefers_plain_when_nothing_wins():
    measured = {"plain": _measured("plain", [10.0] * 4), "a": _measured("a", [10.1] * 4)}
    assert tune._judge(measured, {"plain": [1.0], "a": [1.0]}, dict.fromkeys(measured)) == "plain"
    assert measured["plain"].verdict == "chosen: nothing measured faster"
    assert measured["a"].verdict.startswith("within noise: 1.01x plain"), "under the 3 % margin"


def test_candidate_mixes_name_why_a_mix_is_not_measured(monkeypatch):
    from ortlab.accel import Availability, ort, precision

    monkeypatch.setattr(ort, "availability", lambda probe=False: Availability("ort", False, "no ORT here", "-"))
    monkeypatch.setattr(
        precision, "bf16_availability", lambda: Availability("bf16", True, "emulated (no avx512_bf16)", "-", slow=True)
    )
    plan = {c.name: c for c in tune.candidate_mixes()}
    assert plan["plain"].skipped is None and plan["fused_adam"].skipped is None
    assert plan["ort"].skipped == plan["ort+fused_adam"].skipped == "no ORT here"
    monkeypatch.setattr(ort, "availability", lambda probe=False: Availability("ort", True, "here", "-"))
    with_ort = {c.name: c for c in tune.candidate_mixes()}
    assert with_ort["ort+fused_adam"].skipped is None, "ORT is measured with fused AdamW, one export fewer"
    assert with_ort["ort"].skipped.startswith("not measured: fused AdamW is independent of ORT's graph")
    assert plan["bf16+fused_adam"].skipped == "not measured: emulated (no avx512_bf16)"
    assert plan["torch_compile"].skipped.startswith("not measured: its warm-up exceeds the calibration budget")
    many = {c.name: c for c in tune.candidate_mixes(processes=2)}
    assert many["fused_adam"].skipped.startswith("not measured: ortlab tunes single-process runs only")
    assert many["plain"].skipped is None


def test_auto_fields_take_the_measured_choice_and_nothing_else(monkeypatch):
    from ortlab.accel import Availability, fused_adam
    from ortlab.accel.mix import resolve

    monkeypatch.setattr(fused_adam, "availability", lambda probe=False: Availability("fused_adam", True, "forced", "-"))
    conservative = resolve(AccelSpec())
    assert (conservative.ort, conservative.fused_adam, conservative.precision) == (False, True, "fp32"), (
        "without a measurement 'auto' is what never loses to plain PyTorch"
    )
    choice = {"ort": True, "fused_adam": True, "precision": "bf16", "torch_compile": False}
    assert resolve(AccelSpec(), choice).model_dump(include={"ort", "fused_adam", "precision"}) == {
        "ort": True,
        "fused_adam": True,
        "precision": "bf16",
    }
    explicit = resolve(AccelSpec(ort=False, precision="fp32"), choice)
    assert (explicit.ort, explicit.fused_adam, explicit.precision) == (False, True, "fp32")
    assert resolve(AccelSpec(torch_compile=True), choice).ort is False, "'auto' ORT yields to an explicit compile"


def test_cache_key_changes_with_model_shapes_and_machine(tmp_path):
    (tmp_path / "config.json").write_text('{"a": 1}')
    ident = tune.model_identity(str(tmp_path), None)
    cands = tune.candidate_mixes()
    env = {"cpu": "x", "packages": {"torch": "2.6.0"}}
    key = tune.cache_key(ident, {"batch_shapes": [[16, 40]]}, cands, env)
    assert key == tune.cache_key(ident, {"batch_shapes": [[16, 40]]}, cands, env)
    assert key != tune.cache_key(ident, {"batch_shapes": [[16, 41]]}, cands, env)
    assert key != tune.cache_key(ident, {"batch_shapes": [[16, 40]]}, cands, {**env, "cpu": "y"})
    (tmp_path / "config.json").write_text('{"a": 2}')
    assert key != tune.cache_key(tune.model_identity(str(tmp_path), None), {"batch_shapes": [[16, 40]]}, cands, env)


def _tiny_spec(tmp_path: Path, model: Path, **accel) -> RunSpec:
    return RunSpec.parse(
        {
            "output_dir": str(tmp_path / "runs"),
            "model": {"name": str(model)},
            "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 256, "max_eval_samples": 32},
            "hyper": {"batch_size": 16, "max_length": 64, "max_steps": 6, "learning_rate": 1e-3},
            "accel": accel,
        }
    )


@pytest.fixture(scope="module")
def measured(tmp_path_factory, tiny_bert):
    """One real measurement of the tiny model (its own cache folder), shared by the tests that read it."""
    tmp = tmp_path_factory.mktemp("tune")
    saved = os.environ.get("ORTLAB_CACHE_DIR")
    os.environ["ORTLAB_CACHE_DIR"] = str(tmp / "cache")
    try:
        spec = _tiny_spec(tmp, tiny_bert)
        lines: list[str] = []
        result = tune.tune_spec(spec, progress=lines.append, baselines=True)  # as `ortlab tune` measures
    finally:
        if saved is None:
            os.environ.pop("ORTLAB_CACHE_DIR")
        else:
            os.environ["ORTLAB_CACHE_DIR"] = saved
    return spec, result, tmp / "cache", lines


@pytest.mark.slow
def test_tune_measures_every_candidate_in_its_own_process_and_caches(measured, tmp_path, monkeypatch):
    spec, result, cache, lines = measured
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(cache))
    by_name = {m.name: m for m in result.candidates}
    planned = {c.name: c for c in tune.candidate_mixes()}
    assert set(by_name) == set(planned)
    for name, c in planned.items():
        m = by_name[name]
        assert m.verdict, f"{name} has no verdict"
        if c.skipped is None:
            assert len(m.slices) == result.rounds >= tune.MIN_ROUNDS, (name, m.slices)
            assert m.samples_per_s > 0 and m.warmup_s > 0 and m.peak_mem_mb > 0
            assert m.loss is not None and math.isfinite(m.loss)
            if any(v and v != "fp32" for v in m.choice.values()):
                assert m.applied and all(m.applied.values()), f"{name}: not verified as applied: {m.applied}"
    assert by_name["plain"].ratio == 1.0
    assert result.chosen in by_name and by_name[result.chosen].verdict.startswith("chosen")
    assert any(line.startswith("tune: measuring, round") for line in lines), "long work shows progress"
    # Plain transformers.Trainer, fp32 and bf16=True, trained in the same rounds: never chosen, every row's ratio to
    # both (the median of the paired ratios), and each row's share of the peak of the precision it trains in.
    refs = {m.name: m for m in result.references}
    assert set(refs) == {"trainer_fp32", "trainer_bf16"} and result.chosen not in refs
    trainer, trainer_bf16 = refs["trainer_fp32"], refs["trainer_bf16"]
    assert trainer.verdict.startswith("reference: plain transformers.Trainer") and len(trainer.slices) == result.rounds
    assert trainer.vs_trainer == 1.0 and trainer.samples_per_s > 0
    assert result.flops_per_sample > 0 and result.peaks["fp32"]["flops"] > 0
    for m in [*result.candidates, *result.references]:
        if len(m.slices) != result.rounds:
            continue  # not measured here (its verdict says why)
        paired = sorted(a / b for a, b in zip(m.slices, trainer.slices, strict=True))
        assert m.vs_trainer == pytest.approx(statistics.median(paired))
        peak = result.peaks[m.choice["precision"]]["flops"]
        assert m.peak_pct == pytest.approx(100 * m.samples_per_s * result.flops_per_sample / peak)
        if len(trainer_bf16.slices) == result.rounds:
            assert m.vs_trainer_bf16 == pytest.approx(
                statistics.median(a / b for a, b in zip(m.slices, trainer_bf16.slices, strict=True))
            )
    if len(trainer_bf16.slices) != result.rounds:  # bf16 not measured on this CPU: the same reason as bf16's row
        assert trainer_bf16.verdict == next(m.verdict for m in result.candidates if m.name == "bf16+fused_adam")
    stored = json.loads((cache / "tune" / f"{result.key}.json").read_text())
    assert stored["chosen"] == result.chosen

    again = tune.tune_spec(spec, progress=lines.append)
    assert again.cached and again.chosen == result.chosen and again.key == result.key

    # The CLI finds the same measurement and shows the whole table in 80 columns, no cell cut.
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(spec.to_yaml())
    env = dict(os.environ, COLUMNS="80", ORTLAB_CACHE_DIR=str(cache))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ortlab"), "tune", str(spec_file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"fastest here: {result.chosen} (cached measurement" in proc.stdout, proc.stdout
    assert "…" not in proc.stdout, proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    for name in [*planned, "trainer_fp32", "trainer_bf16"]:
        assert name in proc.stdout, name
    assert "over this machine's measured matmul peak" in " ".join(proc.stdout.split())


@pytest.mark.slow
def test_a_candidate_that_cannot_train_is_recorded_not_fatal(tmp_path, tiny_bert, monkeypatch):
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    real_plan = tune.candidate_mixes
    # fp16 on a CPU fails inside the candidate's process, after the model loaded: the verdict says why.
    monkeypatch.setattr(
        "ortlab.tune.measure.candidate_mixes",
        lambda processes=1, use_cpu=False, compile=False: [
            *real_plan()[:1],
            tune.MixCandidate("fp16", precision="fp16"),
        ],
    )
    result = tune.tune_spec(_tiny_spec(tmp_path, tiny_bert), progress=lambda m: None)
    fp16 = next(m for m in result.candidates if m.name == "fp16")
    assert fp16.verdict.startswith("failed: "), fp16.verdict
    assert "fp16" in fp16.verdict.lower() or "cuda" in fp16.verdict.lower(), fp16.verdict
    assert result.chosen == "plain"


@pytest.mark.slow
def test_a_run_records_why_auto_resolved_as_it_did(tmp_path, tiny_bert, monkeypatch):
    from ortlab.runfolder.rundir import RunDir
    from ortlab.runner import train_spec

    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    # Short run, nothing cached: the mixes not measured (the conservative default) and the record says so; the
    # precision is the probe's where this machine has a fast 16-bit precision (ortlab.tune.precisionrace), else fp32.
    result = train_spec(_tiny_spec(tmp_path, tiny_bert).model_copy(update={"name": "short"}), progress=False)
    run = RunDir(Path(result["run_dir"]))
    auto = next(r for r in run.metrics() if r.get("event") == "auto")
    assert auto["tuned"] is False and "not measured for 6 steps" in auto["why"], auto
    probed = auto.get("precision_probe", {}).get("chosen", "fp32")
    assert ("precision_probe" in auto) == (candidate_precision()[0] is not None), auto
    assert auto["resolved"] == {"ort": False, "fused_adam": True, "precision": probed}
    assert not result["accelerations"]["ort"]["requested"]
    assert not (run.path / "tune.json").exists()

    # accel.tune='measure': measured first; the run trains with the winner and keeps the table.
    spec = _tiny_spec(tmp_path, tiny_bert, tune="measure").model_copy(update={"name": "tuned"})
    result = train_spec(spec, progress=False)
    run = RunDir(Path(result["run_dir"]))
    table = json.loads((run.path / "tune.json").read_text())
    auto = next(r for r in run.metrics() if r.get("event") == "auto")
    assert auto["tuned"] is True and auto["choice"] == table["choice"]
    for field in ("ort", "fused_adam"):
        assert result["accelerations"][field]["requested"] == table["choice"][field]
    assert (run.path / "logs" / "tune-plain.log").exists(), "each candidate's own output is kept"


@pytest.mark.slow
def test_the_workbench_button_sets_the_toggles_to_the_fastest_mix(measured, monkeypatch):
    from ortlab.ui.workbench import Workbench

    spec, result, cache, _ = measured
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(cache))
    wb = Workbench(spec=spec.model_copy(update={"accel": AccelSpec(ort=not result.choice["ort"])}))
    wb.measure_fastest().join(timeout=600)
    assert "fastest here" in wb.tune_note.value, wb.tune_note.value
    assert wb.toggles["ort"].value == result.choice["ort"]
    assert wb.toggles["fused_adam"].value == result.choice["fused_adam"]
    assert wb.toggles["bf16"].value == (result.choice["precision"] == "bf16")
    for m in result.candidates:
        assert f"<td style='padding:0 8px'>{m.name}</td>" in wb.tune_note.value
    assert wb.spec().accel.ort == result.choice["ort"], "Launch would start the measured mix"


def test_the_lookup_draws_the_batches_a_shuffled_loader_gives_without_its_list():
    """`batches_from` takes the first batches of a seeded shuffle: exactly what `DataLoader(shuffle=True)` with
    that generator yields first, drawn from the permutation tensor (the loader's sampler lists every index)."""
    import torch

    from ortlab.tune.auto import batches_from

    rows = [{"x": torch.tensor([i])} for i in range(1000)]

    def collate(batch):
        return {"x": torch.stack([r["x"] for r in batch])}

    for seed in (5, 42):
        loader = torch.utils.data.DataLoader(
            rows, batch_size=8, collate_fn=collate, shuffle=True, generator=torch.Generator().manual_seed(seed)
        )
        expected = [b["x"].tolist() for b, _ in zip(loader, range(3), strict=False)]
        assert [b["x"].tolist() for b in batches_from(rows, collate, 8, seed, n=3)] == expected
