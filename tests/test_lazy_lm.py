"""Causal-LM data prepared as training reads it (`data.lazy` with `hyper.max_steps`, or `data.streaming`): raw text
cut into blocks and chat data templated and packed by datasets' IterableDataset, giving the same rows as the eager
path (same blocks, same labels, same order without shuffling, same losses), reading about what the steps need,
resuming at the same rows, counting the cut-off chat examples it drops, and naming a bad row found late.

Which rows were trained is recorded (every training step's input_ids), not inferred from the losses alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROWS, STEPS, BATCH, LENGTH, EVAL = 3000, 6, 4, 48, 8
WORDS = ["the", "film", "was", "slow", "but", "the", "actors", "were", "great", "and", "funny", "plot", "dull"]


def _text(path: Path, rows: int = ROWS) -> Path:
    """Raw text rows of different lengths (a few blank ones, as paragraphs have), numbered to tell them apart."""
    lines = []
    for i in range(rows):
        n = 3 + (i * 7) % 11
        lines.append(
            {"text": "" if i % 50 == 7 else f"line {i} " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n))}
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def _chat(path: Path, rows: int = ROWS, long_every: int = 10, bad_row: int | None = None) -> Path:
    """Conversations; every `long_every`-th has a prompt so long that max_length cuts off its whole answer."""
    out = []
    for i in range(rows):
        prompt = f"Is review {i} fresh or rotten? " + ("very " * 40 if i % long_every == 3 else "") + "Good film."
        turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": "fresh" if i % 2 else "rotten"}]
        out.append({"messages": turns[:1] if i == bad_row else turns})
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


def _spec(model: Path, source: Path, out: Path, name: str, lazy: bool, **data) -> dict:
    return {
        "name": name,
        "task": "causal-lm",
        "output_dir": str(out),
        "model": {"name": str(model)},
        "data": {"source": str(source), "lazy": lazy, "max_eval_samples": EVAL, **data},
        "hyper": {
            "learning_rate": 1e-3,
            "batch_size": BATCH,
            "max_length": LENGTH,
            "max_steps": STEPS,
            "save_steps": 3,
        },
        "accel": {"ort": False, "fused_adam": False, "precision": "fp32"},  # no lookup, no probe: the data alone
    }


class Trained:
    """Every training step's input_ids (and labels), in order, as the model received them."""

    def __init__(self) -> None:
        self.steps: list[dict[str, list]] = []

    def __enter__(self) -> Trained:
        from ortlab.train.trainer import ORTTrainer

        original = ORTTrainer.training_step
        steps = self.steps

        def recording(trainer, model, inputs, *args, **kwargs):
            steps.append({k: inputs[k].tolist() for k in ("input_ids", "labels") if k in inputs})
            return original(trainer, model, inputs, *args, **kwargs)

        self._patch = pytest.MonkeyPatch()
        self._patch.setattr(ORTTrainer, "training_step", recording)
        return self

    def __exit__(self, *exc) -> None:
        self._patch.undo()


def _losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r.get("event") == "step"}


def _train(spec: dict, log: list[str] | None = None) -> tuple[dict, Trained]:
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    with Trained() as trained:
        result = train_spec(
            RunSpec.model_validate(spec), progress=False, log=log.append if log is not None else (lambda _: None)
        )
    return result, trained


def _prepared(spec: dict, tokenizer_path: Path, lazy: bool):
    """The spec's data checked and tokenized, eagerly or lazily (as
    `fit.check_model_and_data` then `assemble.load_model_and_data` do)."""
    from transformers import AutoTokenizer

    from ortlab.data import load_and_check, tokenize
    from ortlab.data.lazylm import plan
    from ortlab.spec import RunSpec

    run = RunSpec.model_validate(spec)
    prepared = load_and_check(run.data, "causal-lm", run.seed)
    plan(prepared, "causal-lm", run.data.lazy, run.hyper.max_steps, run.seed, run.data.shuffle)
    assert prepared.lazy is lazy
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    train, evaluation = tokenize(prepared, tokenizer, "causal-lm", LENGTH)
    return prepared, train, evaluation


@pytest.mark.parametrize("kind", ["text", "chat", "chat-packed"])
def test_lazy_and_eager_cut_the_same_rows_in_the_same_order(kind, tiny_gpt2, tiny_chat_llama, tmp_path):
    """Without shuffling, the lazy IterableDataset yields exactly the eager Dataset's rows: the same blocks (text),
    the same assistant-only labels and the same packed rows (chat), the same cut-off examples dropped."""
    model = tiny_gpt2 if kind == "text" else tiny_chat_llama
    source = _text(tmp_path / "t.jsonl") if kind == "text" else _chat(tmp_path / "c.jsonl")
    data = {"shuffle": False, **({"packing": True} if kind == "chat-packed" else {})}
    eager_spec = _spec(model, source, tmp_path, "e", lazy=False, **data)
    lazy_spec = _spec(model, source, tmp_path, "l", lazy=True, **data)
    eager, eager_train, eager_eval = _prepared(eager_spec, model, lazy=False)
    lazy, lazy_train, lazy_eval = _prepared(lazy_spec, model, lazy=True)
    assert not hasattr(lazy_train, "__len__")  # an IterableDataset: nothing prepared yet
    lazy_rows = list(lazy_train)
    assert len(lazy_rows) == len(eager_train) > 100
    assert lazy_rows == eager_train.to_list()
    assert lazy_eval.to_list() == eager_eval.to_list()
    if kind != "text":
        assert eager.dropped.read == lazy.dropped.read == len(eager.train)
        assert eager.dropped.dropped == lazy.dropped.dropped > 0  # every 10th answer cut off by max_length
        assert all(any(t != -100 for t in row["labels"]) for row in lazy_rows)


def test_a_lazy_run_reads_about_its_blocks_and_trains_as_the_eager_one(tiny_gpt2, tmp_path, monkeypatch):
    """Raw text, no shuffling: the lazy run tokenizes one batch of JOIN_ROWS rows (it cuts blocks from 1,000 rows at
    a time) instead of all 2,700, and its steps get the eager run's blocks, with the same losses."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    from ortlab.data.lazylm import JOIN_ROWS

    source = _text(tmp_path / "t.jsonl")
    original = PreTrainedTokenizerBase.__call__
    counted: list[int] = []

    def counting(tokenizer, text=None, *args, **kwargs):
        if isinstance(text, list) and kwargs.get("add_special_tokens", True):
            counted.append(len(text))
        return original(tokenizer, text, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", counting)
    runs = {}
    for name, lazy in (("eager", False), ("lazy", True)):
        counted.clear()
        result, trained = _train(_spec(tiny_gpt2, source, tmp_path / name, name, lazy, shuffle=False))
        runs[name] = {"read": sum(counted), "steps": trained.steps, "losses": _losses(Path(result["run_dir"]))}
    eager, lazy = runs["eager"], runs["lazy"]
    assert lazy["steps"] == eager["steps"] and len(lazy["steps"]) == STEPS
    assert sorted(lazy["losses"]) == list(range(1, STEPS + 1))
    for step, loss in eager["losses"].items():
        assert lazy["losses"][step] == pytest.approx(loss, abs=1e-6), step
    # eager: every training row; lazy: one batch of rows, the eval rows, the fit check's rows (until a block fills)
    assert eager["read"] > 0.9 * ROWS
    assert lazy["read"] <= JOIN_ROWS + 2 * EVAL + 100


def test_a_shuffled_lazy_run_resumes_at_the_same_rows(tiny_chat_llama, tmp_path):
    """Packed chat, shuffled: a copy of the run cut back to its step-3 checkpoint trains steps 4 to 6 on exactly
    the rows the uninterrupted run trained them on (transformers replays the iterable up to the checkpoint)."""
    from fake_runs import cut_back

    from ortlab.lifecycle.execute import execute

    source = _chat(tmp_path / "c.jsonl")
    log: list[str] = []
    result, whole = _train(_spec(tiny_chat_llama, source, tmp_path / "runs", "r", True, packing=True), log)
    assert any("dropped" in line and "training examples read" in line for line in log), log
    original = Path(result["run_dir"])
    run = cut_back(original, tmp_path / original.name, step=3, last_checkpoint=STEPS)
    with Trained() as resumed:
        execute(run, resume=True, progress=False, log=lambda _: None)
    assert len(resumed.steps) == 3 and resumed.steps == whole.steps[3:]
    again = _losses(tmp_path / original.name)
    for step in (4, 5, 6):
        assert again[step] == pytest.approx(_losses(original)[step], abs=1e-5), step


def test_an_eager_run_says_why_and_counts_the_dropped_examples(tiny_chat_llama, tmp_path):
    """Without max_steps a causal-lm run is prepared whole (epochs need the count of rows): the log says so, and
    the examples dropped for max_length are counted there too."""
    spec = _spec(tiny_chat_llama, _chat(tmp_path / "c.jsonl", rows=300), tmp_path, "e", True)
    spec["hyper"].update(max_steps=None, epochs=0.02, save_steps=None)
    log: list[str] = []
    _train(spec, log)
    assert any("prepared whole before step 1" in line and "hyper.max_steps" in line for line in log), log
    assert any(re.match(r"chat data: [1-9]\d of 270 training examples read were dropped", line) for line in log), log


def test_streamed_raw_text_and_chat_train(tiny_gpt2, tiny_chat_llama, tmp_path):
    """data.streaming: true now takes causal-lm data: checked on a head, eval held out first, trained as read."""
    for model, source in ((tiny_gpt2, _text(tmp_path / "t.jsonl")), (tiny_chat_llama, _chat(tmp_path / "c.jsonl"))):
        spec = _spec(model, source, tmp_path / "runs", source.stem, True, streaming=True, packing=source.stem == "c")
        spec["hyper"]["save_steps"] = None
        result, trained = _train(spec)
        assert len(trained.steps) == STEPS and sorted(_losses(Path(result["run_dir"]))) == list(range(1, STEPS + 1))


def test_a_bad_conversation_found_late_fails_with_its_position(tiny_chat_llama, tmp_path, monkeypatch):
    """A stream's checks read a head; row 150 has no assistant turn: the run fails when training reaches it."""
    from ortlab.data import DataError

    monkeypatch.setattr("ortlab.data.checks.HEAD_ROWS", 50)
    source = _chat(tmp_path / "bad.jsonl", rows=400, bad_row=150)
    spec = _spec(tiny_chat_llama, source, tmp_path, "bad", True, streaming=True, shuffle=False)
    spec["hyper"].update(max_steps=60, save_steps=None)
    with pytest.raises(DataError, match=r"row 150 of the 'train' split.*no assistant turn") as caught:
        _train(spec)
    assert "fix or drop that row" in str(caught.value)


def test_a_large_share_of_cut_off_examples_fails_the_lazy_run(tiny_chat_llama, tmp_path, monkeypatch):
    from ortlab.data import DataError

    # The run's own count, as training reads the rows: behind the check of the first rows before the model
    # (`fit.check_answers`, which refuses this file; tests/test_early_checks.py), for rows past them.
    monkeypatch.setattr("ortlab.fit.check_answers", lambda *args: None)

    source = _chat(tmp_path / "long.jsonl", rows=600, long_every=1)  # i % 1 is never 3: none too long yet
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    for r in rows[::3] + rows[1::3]:  # two thirds of the answers cut off
        r["messages"][0]["content"] += " very" * 40
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"training examples read were dropped.*more than 50%"):
        _train(_spec(tiny_chat_llama, source, tmp_path, "long", True))


def test_loader_workers_read_every_row_once_and_count_the_drops_together(tiny_chat_llama, tmp_path):
    """On a GPU the DataLoader has worker processes: each reads its own shards of the lazy split, and the cut-off
    examples they drop are counted in one place (shared memory), as the run's report needs."""
    import torch

    source = _chat(tmp_path / "c.jsonl", rows=600)
    eager, eager_train, _ = _prepared(_spec(tiny_chat_llama, source, tmp_path, "e", False), tiny_chat_llama, False)
    lazy, lazy_train, _ = _prepared(_spec(tiny_chat_llama, source, tmp_path, "l", True), tiny_chat_llama, True)
    loader = torch.utils.data.DataLoader(lazy_train, batch_size=4, num_workers=2, collate_fn=list)
    rows = [row for batch in loader for row in batch]
    key = lambda row: tuple(row["input_ids"])  # noqa: E731
    assert sorted(rows, key=key) == sorted(eager_train.to_list(), key=key)  # shuffled: the same rows, once each
    assert (lazy.dropped.read, lazy.dropped.dropped) == (eager.dropped.read, eager.dropped.dropped)
    assert lazy.dropped.dropped > 0
