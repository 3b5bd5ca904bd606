"""Optimum-era training scripts run by changing one import (issue #19).

The scripts in tests/dropin_scripts/ use Optimum's API the way its documentation and training examples do
(HfArgumentParser with ORTTrainingArguments, `tokenizer=`, `feature=`, `--logging_dir`, `--evaluation_strategy`,
`--overwrite_output_dir`, `--optim adamw_ort_fused`, a DeepSpeed config file) and import from
`optimum.onnxruntime`. Here that one line becomes `from ortlab import ...`; each script then runs on tiny offline
models and data, and must (1) really train under ORT, and (2) train what plain `transformers.Trainer` trains: the
same script with the import pointed at tests/dropin_scripts/reference_trainer.py (transformers' Trainer under
Optimum's names) and transformers-5 flags gives the same per-step losses, within the ORT/eager parity tolerance.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT

SCRIPTS = ROOT / "tests" / "dropin_scripts"
OPTIMUM_IMPORT = "from optimum.onnxruntime import "
PARITY = 2e-3
STEPS = 6


def _no_dropout(folder: Path, keys: tuple[str, ...]) -> Path:
    # ORT's dropout RNG is not torch's: the comparisons need dropout off (the scripts load these folders as is).
    config = json.loads((folder / "config.json").read_text())
    config.update(dict.fromkeys(keys, 0.0))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def assets(tmp_path_factory, tiny_bert, tiny_gpt2):
    from ortlab.assets import embedded_dataset

    root = tmp_path_factory.mktemp("dropin-assets")
    bert = _no_dropout(
        Path(shutil.copytree(tiny_bert, root / "bert")), ("hidden_dropout_prob", "attention_probs_dropout_prob")
    )
    gpt2 = _no_dropout(Path(shutil.copytree(tiny_gpt2, root / "gpt2")), ("resid_pdrop", "embd_pdrop", "attn_pdrop"))
    bart = _tiny_bart(tiny_bert, root / "bart")

    rt, _ = embedded_dataset("rotten-tomatoes")
    with open(rt, encoding="utf-8") as f:
        rows = [row for _, row in zip(range(64), csv.DictReader(f), strict=False)]
    labelled = [{"text": r["text"], "label": int(r["label"] == "fresh")} for r in rows]
    reviews = root / "reviews.csv"
    with reviews.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows(labelled)
    summaries = root / "summaries.jsonl"
    summaries.write_text(
        "".join(json.dumps({"text": r["text"], "summary": " ".join(r["text"].split()[:4])}) + "\n" for r in rows)
    )
    hamlet, _ = embedded_dataset("hamlet")
    text = root / "hamlet.txt"
    text.write_text("\n".join(Path(hamlet).read_text(encoding="utf-8", errors="ignore").splitlines()[:400]))
    return {"bert": bert, "gpt2": gpt2, "bart": bart, "reviews": reviews, "summaries": summaries, "text": text}


def _tiny_bart(tokenizer_folder: Path, folder: Path) -> Path:
    from tiny_models import tiny_bart
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    tiny_bart(tokenizer, layers=1, positions=128).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_script(name: str, tmp_path: Path, flags: list[str], reference: bool) -> Path:
    """Run tests/dropin_scripts/<name> with only its Optimum import changed; return its output_dir."""
    source = (SCRIPTS / name).read_text()
    target = "from reference_trainer import " if reference else "from ortlab import "
    changed = source.replace(OPTIMUM_IMPORT, target)
    differing = [a for a, b in zip(source.splitlines(), changed.splitlines(), strict=True) if a != b]
    assert len(differing) == 1, differing  # one line, the import
    kind = "reference" if reference else "ortlab"
    script = tmp_path / f"{kind}_{name}"
    script.write_text(changed)
    out = tmp_path / f"out-{kind}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # one-process torch.distributed, as a launcher would set it (DeepSpeed needs it; ortlab would set it itself)
    dist = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    path = os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")]))  # keep a checkout first
    env = {**os.environ, **dist, "PYTHONPATH": path}
    common = ["--output_dir", str(out), "--do_train", "--max_steps", str(STEPS), "--per_device_train_batch_size", "4"]
    common += ["--learning_rate", "1e-3", "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none"]
    common += ["--seed", "0", "--disable_tqdm", "true"]
    proc = subprocess.run(
        [PYTHON, str(script), *common, *flags], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, f"{kind} run of {name} failed:\n{proc.stderr[-5000:]}"
    return out


def losses(out: Path) -> list[float]:
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [h["loss"] for h in history if "loss" in h]


def compare(ortlab_out: Path, reference_out: Path, also_applied: tuple[str, ...] = ()) -> dict:
    record = json.loads((ortlab_out / "ortlab_accelerations.json").read_text())["accelerations"]
    for name in ("ort", *also_applied):
        assert record[name]["applied"] is True, record[name]
    ours, theirs = losses(ortlab_out), losses(reference_out)
    assert len(ours) == len(theirs) == STEPS
    assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) < PARITY, (ours, theirs)
    # output_dir holds what transformers writes, plus ortlab's record with the saved model; the metrics stream went
    # beside TensorBoard's logs (--logging_dir tb)
    extra = {p.name for p in ortlab_out.iterdir()} - {p.name for p in reference_out.iterdir()}
    assert extra == {"ortlab_accelerations.json"}, extra
    events = [json.loads(line)["event"] for line in (ortlab_out.parent / "tb" / "ortlab_metrics.jsonl").open()]
    assert events[0] == "train_begin" and events[-1] == "train_end", events
    return record


# The Optimum-era flags; for the reference, their transformers-5 spelling. adamw_ort_fused runs torch's fused
# AdamW where ORT's FusedAdam cannot (CPU): the reference asks for that one.
OPTIMUM_FLAGS = ["--overwrite_output_dir", "--logging_dir", "tb", "--evaluation_strategy", "no"]
OPTIMUM_FLAGS += ["--optim", "adamw_ort_fused", "--onnx_log_level", "ERROR"]
REFERENCE_FLAGS = ["--eval_strategy", "no", "--optim", "adamw_torch_fused"]


@pytest.mark.slow
def test_text_classification_script_with_a_deepspeed_config_file(assets, tmp_path):
    shutil.copy(SCRIPTS / "ds_config_zero_stage_1.json", tmp_path)
    flags = ["--model_name_or_path", str(assets["bert"]), "--train_file", str(assets["reviews"])]
    flags += ["--max_seq_length", "32"]
    deepspeed = ["--deepspeed", "ds_config_zero_stage_1.json"]
    ours = run_script("text_classification.py", tmp_path, flags + deepspeed + OPTIMUM_FLAGS, reference=False)
    # ZeRO-1 in one process shards nothing: plain Trainer without DeepSpeed trains the same
    theirs = run_script("text_classification.py", tmp_path, flags + REFERENCE_FLAGS, reference=True)
    record = compare(ours, theirs, also_applied=("zero1", "fused_adam"))
    assert record["zero1"]["details"]["stage"] == 1


@pytest.mark.slow
def test_causal_lm_script(assets, tmp_path):
    flags = ["--model_name_or_path", str(assets["gpt2"]), "--train_file", str(assets["text"]), "--block_size", "32"]
    flags += ["--label_smoothing_factor", "0.1"]  # the causal-LM label shift must survive ORT
    ours = run_script("causal_lm.py", tmp_path, flags + OPTIMUM_FLAGS, reference=False)
    theirs = run_script("causal_lm.py", tmp_path, flags + REFERENCE_FLAGS, reference=True)
    compare(ours, theirs, also_applied=("fused_adam",))


@pytest.mark.slow
def test_summarization_script(assets, tmp_path):
    flags = ["--model_name_or_path", str(assets["bart"]), "--train_file", str(assets["summaries"])]
    flags += ["--predict_with_generate", "--generation_max_length", "8", "--generation_num_beams", "2"]
    ours = run_script("summarization.py", tmp_path, flags + OPTIMUM_FLAGS, reference=False)
    theirs = run_script("summarization.py", tmp_path, flags + REFERENCE_FLAGS, reference=True)
    extra = {"generated_predictions.txt"}
    assert extra <= {p.name for p in ours.iterdir()}
    compare(ours, theirs, also_applied=("fused_adam",))
    # generation ran in PyTorch on the weights ORT trained: the same text as plain transformers generates
    assert (ours / "generated_predictions.txt").read_text() == (theirs / "generated_predictions.txt").read_text()
