"""ORTTrainer: real training runs on CPU with a tiny BERT built in the test (tests/helpers/train_mix.py).

Each mix trains in its own subprocess (DeepSpeed starts torch.distributed, ORTModule keeps global state), and a
run is cached per mix so the parity and metrics tests reuse the runs the mix tests made.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT

HELPER = ROOT / "tests" / "helpers" / "train_mix.py"
MARKER = "TRAIN-MIX-RESULT "
STEPS = 30


def _results(stdout: str) -> list[dict]:
    return [json.loads(line[len(MARKER) :]) for line in stdout.splitlines() if line.startswith(MARKER)]


def train(out: Path, mix: str, *extra: str, procs: int = 1, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [PYTHON, str(HELPER), "--mix", mix, "--steps", str(STEPS), "--out", str(out), *extra]
    if procs > 1:  # (torchrun with its store on loopback, as the launcher starts it)
        cmd = [PYTHON, "-m", "ortlab.runner.torchrun", f"--nproc_per_node={procs}", *cmd[1:]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"training failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """mix -> (result of rank 0, output dir); each mix trained at most once per test session."""
    cache: dict[str, tuple[dict, Path]] = {}

    def get(mix: str) -> tuple[dict, Path]:
        if mix not in cache:
            out = tmp_path_factory.mktemp("run-" + (mix.replace(",", "+") or "none"))
            proc = train(out, mix, "--eval")
            cache[mix] = (_results(proc.stdout)[0], out)
        return cache[mix]

    return get


MIXES = ["", "ort", "fused_adam", "zero1", "bf16", "ort,fused_adam", "ort,zero1", "ort,zero1,fused_adam"]


@pytest.mark.slow
@pytest.mark.parametrize("mix", MIXES, ids=[m or "none" for m in MIXES])
def test_mix_trains_and_applies(runs, mix):
    result, _ = runs(mix)
    losses = result["losses"]
    assert len(losses) == STEPS
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.1, f"loss did not decrease: first {first:.3f}, last {last:.3f}"
    assert result["changed"] == result["trainable"], "every trainable parameter must change"
    requested = set(filter(None, mix.split(",")))
    for name, record in result["accelerations"].items():
        assert record["requested"] == (name in requested), record
        assert record["applied"] == (name in requested), record


@pytest.mark.slow
def test_ort_matches_eager_pytorch(runs):
    # Same seed, same data, dropout off (ORT's dropout RNG differs from torch's): the per-step losses of the
    # first 10 steps agree within 2e-3. Seen here: ~1e-5 or less.
    eager, _ = runs("")
    ort, _ = runs("ort")
    assert ort["accelerations"]["ort"]["applied"]
    diffs = [abs(a - b) for a, b in zip(eager["losses"][:10], ort["losses"][:10], strict=True)]
    assert max(diffs) < 2e-3, diffs


# bf16 keeps 8 bits of mantissa: the same run's losses drift apart a little over the steps (dropout's draws are
# the same; the matmuls round differently). The tolerance is the precision probe's and the tuner's (LOSS_RTOL,
# LOSS_ATOL: what ortlab accepts as "the same objective" when it switches bf16 on by itself).
@pytest.mark.slow
def test_bf16_trains_the_same_curve_as_fp32(runs):
    from ortlab.tune.judge import LOSS_ATOL, LOSS_RTOL

    fp32, _ = runs("")
    bf16, _ = runs("bf16")
    assert bf16["accelerations"]["bf16"]["applied"]
    for a, b in zip(fp32["losses"][:10], bf16["losses"][:10], strict=True):
        assert abs(a - b) <= LOSS_ATOL + LOSS_RTOL * abs(a), (fp32["losses"][:10], bf16["losses"][:10])
    assert bf16["losses"][:10] != fp32["losses"][:10], "bf16 computed exactly what fp32 did: it did not run"


@pytest.mark.slow
def test_metrics_stream_and_saved_model(runs):
    from transformers import BertForSequenceClassification

    result, out = runs("ort")
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    events = [r["event"] for r in lines]
    assert events[0] == "train_begin"
    assert events[-1] == "train_end"
    verified = [r for r in lines if r["event"] == "verified"]
    assert [r["step"] for r in verified] == [1], "what applied is recorded once, right after the first step"
    assert verified[0]["accelerations"]["ort"]["applied"] is True
    assert events.index("verified") == events.index("step") - 1, "written as step 1 ends, before its record"
    steps = [r for r in lines if r["event"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    for r in steps:
        for key in ("loss", "learning_rate", "samples_per_s", "tokens_per_s", "step_time_s", "peak_mem_mb", "epoch"):
            assert isinstance(r[key], (int, float)), (key, r)
        assert r["samples"] == 16
        assert r["tokens"] == 16 * 16
    evals = [r for r in lines if r["event"] == "eval"]
    assert len(evals) == 3
    assert all("eval_loss" in r for r in evals)
    end = lines[-1]
    assert end["summary"]["steady_samples_per_s"] > 0
    assert end["summary"]["warmup_steps"] == 2
    assert end["accelerations"]["ort"]["applied"] is True

    # The saved model is a plain transformers model, with the weights that were trained.
    import hashlib

    model = BertForSequenceClassification.from_pretrained(out)
    params = dict(model.named_parameters())
    digest = hashlib.sha256()
    for name in sorted(params):
        digest.update(params[name].detach().float().numpy().tobytes())
    assert digest.hexdigest() == result["weights_sha256"]
    assert model.config.use_cache is True, "use_cache is switched off for ORT training only, not in the saved model"
    saved = json.loads((out / "ortlab_accelerations.json").read_text())
    assert saved["feature"] == "sequence-classification"
    assert saved["accelerations"]["ort"]["applied"] is True


@pytest.mark.slow
@pytest.mark.multiprocess
def test_zero1_two_processes_partition_optimizer_state(runs, tmp_path):
    single, _ = runs("ort,zero1,fused_adam")
    proc = train(tmp_path, "ort,zero1,fused_adam", procs=2)
    ranks = sorted(_results(proc.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1]
    total = single["opt_state_numel"]
    assert total == single["params_numel"], "one process holds the whole optimizer state"
    alone = single["accelerations"]["zero1"]["details"]
    assert alone["optimizer_state_share"] == 1.0 and alone["label"] == "ZeRO-1"
    assert alone["note"].startswith("one process shards nothing")
    for r in ranks:
        share = r["opt_state_numel"] / total
        assert 0.45 < share < 0.55, f"rank {r['rank']} holds {share:.1%} of the optimizer state"
        assert r["accelerations"]["zero1"]["applied"]
        details = r["accelerations"]["zero1"]["details"]
        assert details["world_size"] == 2 and "note" not in details
        assert abs(details["optimizer_state_share"] - share) < 1e-9, "ortlab measures what the test counts"
        shares = [x["opt_state_numel"] / total for x in ranks]
        assert details["optimizer_state_share_by_rank"] == pytest.approx(shares), "every rank's share, on every rank"
        assert r["accelerations"]["ort"]["applied"]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"], "ranks must end with identical weights"
    # Each rank trained on its own shard of the data (so the per-rank losses differ) ...
    assert ranks[0]["losses"] != ranks[1]["losses"]
    # ... and the loss has the scale of one process (not multiplied by the number of processes).
    assert abs(ranks[0]["losses"][0] - single["losses"][0]) < 0.1
    # The step's recorded loss is every rank's mean, the same on both ranks (it was rank 0's own share alone).
    mean = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"], strict=True)]
    assert ranks[0]["step_losses"] == ranks[1]["step_losses"] == pytest.approx(mean, abs=1e-6)


@pytest.mark.slow
def test_seed_snippet_as_pasted(tmp_path):
    # The Optimum blog's snippet with only the import changed, around a tiny model and dataset.
    script = tmp_path / "seed.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(HELPER.parent)!r})
            from train_mix import Synthetic, tiny_bert
            model, train_dataset = tiny_bert(0), Synthetic(128)

            from ortlab import ORTTrainer, ORTTrainingArguments

            # Step 1: Define training arguments
            training_args = ORTTrainingArguments(
                output_dir={str(tmp_path / "out")!r},
                optim = "adamw_ort_fused",
                max_steps=8, report_to=[],
            )

            # Step 2: Create your ONNX Runtime Trainer
            trainer = ORTTrainer(
                model=model,
                args=training_args,
                train_dataset=train_dataset,
                feature="sequence-classification",
            )

            # Step 3: Use ONNX Runtime for training!
            trainer.train()

            import json
            print("APPLIED " + json.dumps(trainer.metrics_records[-1]["accelerations"]))
            """
        )
    )
    proc = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the record of what applied is the metrics stream's last record (and goes with each saved model); without a
    # run folder or logging_dir, the stream is kept in memory, and output_dir holds only what Trainer writes
    line = next(x for x in proc.stdout.splitlines() if x.startswith("APPLIED "))
    applied = json.loads(line[len("APPLIED ") :])
    assert all(p.name.startswith("checkpoint-") for p in (tmp_path / "out").iterdir())
    assert applied["ort"]["applied"] is True, applied["ort"]
    assert "fallback_reason" not in applied["ort"]["details"]
    assert applied["fused_adam"]["applied"] is True
    assert applied["fused_adam"]["details"]["implementation"].startswith("torch AdamW(fused=True)")


@pytest.mark.slow
def test_unexportable_model_is_reported_as_fallen_back(tmp_path):
    proc = train(tmp_path, "ort", "--model", "unexportable")
    result = _results(proc.stdout)[0]
    ort = result["accelerations"]["ort"]
    assert ort["requested"] is True
    assert ort["applied"] is False
    assert "export" in ort["details"]["fallback_reason"].lower()
    assert "ort was requested but is NOT applied" in proc.stderr
    events = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    flagged = [e for e in events if e["event"] == "acceleration"]
    assert [e["name"] for e in flagged] == ["ort"]
    assert events[-1]["accelerations"]["ort"]["applied"] is False


@pytest.mark.slow
def test_unexportable_model_fails_when_asked(tmp_path):
    proc = train(tmp_path, "ort", "--model", "unexportable", "--fallback", "error", check=False)
    assert proc.returncode != 0
    assert "ORTFallbackError" in proc.stderr
    assert "ort_fallback='error'" in proc.stderr


# --- impossible mixes: rejected when the arguments are built, in-process, before any model exists ---------------


def _args(**kw):
    from ortlab import ORTTrainingArguments

    return ORTTrainingArguments(output_dir="unused", report_to=[], **kw)


IMPOSSIBLE = [
    pytest.param({"fp16": True}, ["fp16 needs a CUDA device", "bf16"], id="fp16-without-cuda"),
    pytest.param({"torch_compile": True}, ["ort and torch_compile", "pick one"], id="ort+compile"),
    pytest.param({"use_ort": False, "torch_compile": True}, ["torch >= 2.7"], id="compile-on-torch-2.6"),
    pytest.param({"zero_stage": 3}, ["ZeRO stage 3", "zero_stage=1"], id="ort+zero3"),
    pytest.param(
        {"optim": "adamw_ort_fused", "deepspeed": {"zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW"}}},
        ["defines its own optimizer"],
        id="fused+deepspeed-optimizer",
    ),
    pytest.param(
        {"zero_stage": 2, "deepspeed": {"zero_optimization": {"stage": 1}}}, ["set only one"], id="two-stages"
    ),
]


@pytest.mark.parametrize(("kwargs", "expected"), IMPOSSIBLE)
def test_impossible_mix_is_rejected_fast_with_the_fix(kwargs, expected, monkeypatch):
    import torch
    from transformers import TrainingArguments

    from ortlab import MixError, ORTTrainingArguments

    if torch.cuda.is_available() and kwargs.get("fp16"):
        pytest.skip("fp16 is possible on this machine")

    # "Fast" means: refused before anything is set up (processes, devices, transformers' own checks). Those steps
    # raise here if reached, so a check moved after them fails this test instead of only slowing it down.
    def set_up(*args, **kwargs):
        raise AssertionError("set-up ran before the mix was checked")

    monkeypatch.setattr(ORTTrainingArguments, "_configure_processes", set_up)
    monkeypatch.setattr(TrainingArguments, "__post_init__", set_up)
    with pytest.raises(MixError) as info:
        _args(**kwargs)
    for text in expected:
        assert text in str(info.value)


def test_ort_on_a_torch_it_cannot_use_is_rejected(monkeypatch):
    from ortlab import MixError
    from ortlab.accel import ort

    real = ort.package_version
    monkeypatch.setattr(ort, "package_version", lambda d: "2.8.0" if d == "torch" else real(d))
    ort.availability.cache_clear()
    try:
        with pytest.raises(MixError, match=r"torch < 2\.7.*Fix: use torch 2\.6\.0"):
            _args()
    finally:
        ort.availability.cache_clear()


def test_bad_ort_option_is_rejected():
    with pytest.raises(ValueError, match="ort_fallback must be 'warn' or 'error'"):
        _args(ort_fallback="ignore")


def test_feature_must_match_the_model_head():
    from transformers import BertConfig, BertForTokenClassification

    from ortlab import ORTTrainer

    model = BertForTokenClassification(
        BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=40)
    )
    with pytest.raises(ValueError, match=r"ForSequenceClassification head.*AutoModelForSequenceClassification"):
        ORTTrainer(model=model, args=_args(), feature="sequence-classification")
    with pytest.raises(ValueError, match="unknown feature 'seq-cls'"):
        ORTTrainer(model=model, args=_args(), feature="seq-cls")


def test_plain_training_arguments_are_accepted(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification, TrainingArguments

    from ortlab import ORTTrainer, ORTTrainingArguments

    model = BertForSequenceClassification(
        BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=40)
    )
    trainer = ORTTrainer(model=model, args=TrainingArguments(str(tmp_path), learning_rate=1e-3, report_to=[]))
    assert isinstance(trainer.args, ORTTrainingArguments)
    assert trainer.args.learning_rate == 1e-3
    assert trainer.args.use_ort is True
    assert trainer.args.metrics_file is None, "no run folder, no logging_dir: the stream stays in memory"
    assert trainer.accelerations["ort"].requested


@pytest.mark.parametrize("data_seed", [None, 7])
def test_the_training_order_is_transformers_own_without_its_list(tmp_path, data_seed):
    """ORTTrainer's loader samples in the order a plain Trainer's does (accelerate's seedable sampler: the seed,
    or data_seed, plus the epoch), epoch after epoch, from a permutation tensor rather than a list of every index
    (ortlab.train.sampler)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    from ortlab import ORTTrainer
    from ortlab.train.sampler import PermutationSampler

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 70_000  # more than one slice of PermutationSampler

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": torch.tensor([i % 40]), "labels": torch.tensor(0)}

    def model():
        config = BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
        return BertForSequenceClassification(config)

    orders = []
    for cls in (Trainer, ORTTrainer):
        args = TrainingArguments(str(tmp_path / cls.__name__), report_to=[], seed=3, data_seed=data_seed)
        loader = cls(model=model(), args=args, train_dataset=Rows()).get_train_dataloader()
        sampler = loader.batch_sampler.sampler
        epochs = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            epochs.append(list(sampler))
        orders.append((type(sampler).__name__, epochs))
    (plain, plain_epochs), (ours, our_epochs) = orders
    assert plain == "SeedableRandomSampler" and ours == PermutationSampler.__name__
    assert our_epochs == plain_epochs and plain_epochs[0] != plain_epochs[1]
    assert sorted(our_epochs[0]) == list(range(70_000))
