"""Lazy data (`data.lazy`, the default): a run of N steps tokenizes about N batches of rows, trains exactly as the
eager path does (same rows, same order, same losses), resumes at the same row, and names a bad row found late.

Every texts the tokenizer reads is recorded (the tokenizer class's `__call__` wrapped), so "how many rows were
prepared" and "which rows were trained" are counted, not inferred from timings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import write_reviews

ROWS, STEPS, BATCH, EVAL = 3000, 6, 8, 5


def _reviews(path: Path, rows: int = ROWS) -> Path:
    return write_reviews(path, rows, words=6)


def _spec(tiny_bert: Path, source: Path, out: Path, name: str, lazy: bool, **data) -> dict:
    return {
        "name": name,
        "output_dir": str(out),
        "model": {"name": str(tiny_bert)},
        "data": {"source": str(source), "lazy": lazy, "max_eval_samples": EVAL, **data},
        "hyper": {"learning_rate": 1e-3, "batch_size": BATCH, "max_length": 32, "max_steps": STEPS, "save_steps": 3},
        "accel": {"ort": False, "fused_adam": False, "precision": "fp32"},  # no precision probe: same start
    }


class Recorder:
    """The texts every tokenizer call reads (lists of texts: the batches), in order."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __enter__(self) -> Recorder:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase

        original = PreTrainedTokenizerBase.__call__
        calls = self.calls

        def recording(tokenizer, text=None, *args, **kwargs):
            if isinstance(text, list) and kwargs.get("add_special_tokens", True):  # not the unknown-token sample
                calls.append([t if isinstance(t, str) else str(t) for t in text])
            return original(tokenizer, text, *args, **kwargs)

        self._patch = pytest.MonkeyPatch()
        self._patch.setattr(PreTrainedTokenizerBase, "__call__", recording)
        return self

    def __exit__(self, *exc) -> None:
        self._patch.undo()

    def train_batches(self) -> list[list[str]]:
        """The batches the trainer read: those before the last evaluation (EVAL rows) and after the one before it
        (a fresh run evaluates before training; the acceleration lookup's batches come before that)."""
        evals = [i for i, c in enumerate(self.calls) if len(c) == EVAL]
        start = evals[-2] + 1 if len(evals) > 1 else 0
        return self.calls[start : evals[-1]]

    def rows_read(self) -> int:
        return sum(len(c) for c in self.calls)


def _losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r.get("event") == "step"}


@pytest.fixture(scope="module")
def runs(tiny_bert, tmp_path_factory):
    """The same spec trained eagerly and lazily, each with the tokenizer's reads recorded."""
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    tmp = tmp_path_factory.mktemp("lazy")
    source = _reviews(tmp / "reviews.csv")
    out = {}
    for name, lazy in (("eager", False), ("lazy", True)):
        with Recorder() as rec:
            spec = RunSpec.model_validate(_spec(tiny_bert, source, tmp / "runs", name, lazy))
            result = train_spec(spec, progress=False, log=lambda _: None)
        out[name] = {"result": result, "recorder": rec, "dir": Path(result["run_dir"])}
    out["source"], out["tmp"] = source, tmp
    return out


def test_a_lazy_run_of_n_steps_tokenizes_about_n_batches(runs):
    lazy, eager = runs["lazy"]["recorder"], runs["eager"]["recorder"]
    from ortlab.tune.auto import BATCHES

    # Eager: every training row (90 % of ROWS) before step 1. Lazy: the steps' batches (and the one the loader
    # fetches ahead), the eval rows (before and after), and the fixed few batches the acceleration lookup reads.
    assert eager.rows_read() > 0.85 * ROWS
    assert lazy.rows_read() <= (BATCHES + STEPS + 1) * BATCH + 2 * EVAL
    assert len(lazy.train_batches()) in (STEPS, STEPS + 1)
    assert all(len(batch) == BATCH for batch in lazy.train_batches())


def test_lazy_and_eager_train_the_same_rows_in_the_same_order_with_the_same_losses(runs):
    eager_losses, lazy_losses = _losses(runs["eager"]["dir"]), _losses(runs["lazy"]["dir"])
    assert sorted(lazy_losses) == list(range(1, STEPS + 1))
    for step, loss in eager_losses.items():
        assert lazy_losses[step] == pytest.approx(loss, abs=1e-6), step
    # The eager map tokenized all rows in file order; the trainer's sampler then drew from them. The lazy path's
    # batches are those draws: the same seed gives the same rows as the eager run's loss says it trained on.
    lazy_batches = runs["lazy"]["recorder"].train_batches()
    assert len({text for batch in lazy_batches for text in batch}) == len(lazy_batches) * BATCH  # no row twice
    assert runs["lazy"]["result"]["eval_after"]["eval_loss"] == pytest.approx(
        runs["eager"]["result"]["eval_after"]["eval_loss"], abs=1e-6
    )


def test_a_lazy_run_resumes_at_the_same_row(runs, tmp_path):
    """A copy of the lazy run, cut back to its step-3 checkpoint, reads exactly the rows of steps 4 to 6 again (the
    skipped steps' rows are not even tokenized: the sampler's indices are skipped, not the rows)."""
    from fake_runs import cut_back

    from ortlab.lifecycle.execute import execute

    source = runs["lazy"]["dir"]
    run_path = tmp_path / source.name
    run = cut_back(source, run_path, step=3, last_checkpoint=STEPS)
    with Recorder() as rec:
        execute(run, resume=True, progress=False, log=lambda _: None)
    assert rec.train_batches() == runs["lazy"]["recorder"].train_batches()[3:], "no row read twice or skipped"
    original, resumed = _losses(source), _losses(run_path)
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(original[step], abs=1e-5), step


def test_a_bad_row_found_late_fails_the_run_with_its_position(tiny_bert, tmp_path):
    """Token classification: row 150 has fewer tags than words. Every value passes the checks before the model
    (no missing tag, known labels); the row fails when training reaches it, and the error names it."""
    from ortlab.data import DataError
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    rows = [{"tokens": ["alice", "went", "to", "paris"], "tags": ["B-PER", "O", "O", "B-LOC"]} for _ in range(200)]
    rows[150] = {"tokens": ["bob", "saw", "rome", "today"], "tags": ["B-PER", "O"]}
    data = tmp_path / "ner.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = _spec(tiny_bert, data, tmp_path / "runs", "bad", True, text_column="tokens", label_column="tags")
    spec["task"] = "token-classification"
    spec["data"].pop("max_eval_samples")
    spec["hyper"].update(max_steps=30, save_steps=None)
    with pytest.raises(DataError, match=r"row 150 of the 'train' split.*IndexError") as caught:
        train_spec(RunSpec.model_validate(spec), progress=False, log=lambda _: None)
    assert "fix or drop that row" in str(caught.value)


def _streamed(tiny_bert: Path, source: Path, out: Path, name: str, **hyper) -> dict:
    spec = _spec(tiny_bert, source, out, name, True, streaming=True)
    spec["hyper"].update(save_steps=None, **hyper)
    return spec


def test_a_streamed_local_file_trains_reading_only_what_it_needs(tiny_bert, tmp_path):
    """data.streaming: true on a local CSV takes the path a large Hub dataset takes (datasets' streaming loader):
    the eval rows are the first max_eval_samples, the checks read a head, training tokenizes its batches only."""
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    source = _reviews(tmp_path / "reviews.csv")
    with Recorder() as rec:
        result = train_spec(RunSpec.model_validate(_streamed(tiny_bert, source, tmp_path, "s")), progress=False)
    assert sorted(_losses(Path(result["run_dir"]))) == list(range(1, STEPS + 1))
    from ortlab.data.inputs import STREAM_BATCH
    from ortlab.tune.auto import BATCHES

    # The acceleration lookup's batches (the stream's head) and the steps' rows, each in chunks of STREAM_BATCH,
    # and the eval rows twice.
    assert rec.rows_read() <= (BATCHES * BATCH + STREAM_BATCH) + 2 * STREAM_BATCH + 2 * EVAL
    assert all(not t.startswith(("review 0 ", "review 1 ", "review 4 ")) for b in rec.train_batches() for t in b)


def test_a_stream_without_max_steps_fails_before_the_model(tiny_bert, tmp_path):
    from ortlab.data import DataError
    from ortlab.fit import check_model_and_data
    from ortlab.spec import RunSpec

    spec = _streamed(tiny_bert, _reviews(tmp_path / "r.csv", 50), tmp_path, "s")
    spec["hyper"]["max_steps"] = None
    with pytest.raises(DataError, match=r"set hyper\.max_steps"):
        check_model_and_data(RunSpec.model_validate(spec), log=lambda _: None)


def test_a_streamed_file_says_its_shuffle_is_a_buffers(tiny_bert, tmp_path):
    """A stream's shuffle draws from a buffer (and its shards): a single local file is one shard, so rows far apart
    are never swapped, and the run's log says so with the way to a whole-split shuffle."""
    from ortlab.fit import check_model_and_data
    from ortlab.spec import RunSpec

    lines: list[str] = []
    check_model_and_data(
        RunSpec.model_validate(_streamed(tiny_bert, _reviews(tmp_path / "r.csv", 50), tmp_path, "s")), lines.append
    )
    said = [line for line in lines if "shuffled within a buffer" in line]
    assert len(said) == 1 and "one shard" in said[0] and "data.streaming: false" in said[0], lines


def test_a_streamed_label_the_head_did_not_show_fails_with_its_position(tiny_bert, tmp_path, monkeypatch):
    """The checks read a head of the stream; row 150 carries a class the head never showed: the run fails when
    training reaches it, naming the row, instead of training on it with a made-up class id."""
    import csv

    from ortlab.data import DataError
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    monkeypatch.setattr("ortlab.data.checks.HEAD_ROWS", 50)
    source = tmp_path / "late.csv"
    with open(source, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows([f"review {i} good film", "ab"[i % 2] if i != 150 else "zzz"] for i in range(200))
    spec = _streamed(tiny_bert, source, tmp_path, "late", max_steps=60, batch_size=16)
    with pytest.raises(DataError, match=r"row 150 of the 'train' split.*'zzz'"):
        train_spec(RunSpec.model_validate(spec), progress=False, log=lambda _: None)


@pytest.mark.parametrize(
    ("streaming", "fmt", "hub_bytes", "expected"),
    [
        ("auto", "hub", 5_000_000_000, True),  # the Hub says it is large: streamed
        ("auto", "hub", 50_000_000, False),
        ("auto", "hub", None, False),  # the Hub says nothing (or is unreachable): read whole, as before
        ("auto", "csv", 5_000_000_000, False),  # a local file is never asked about
        (True, "csv", None, True),
        (False, "hub", 5_000_000_000, False),
    ],
)
def test_streaming_auto_streams_only_hub_datasets_the_hub_says_are_large(
    monkeypatch, streaming, fmt, hub_bytes, expected
):
    from ortlab.data import load
    from ortlab.spec import DataSpec

    asked: list[str] = []
    monkeypatch.setattr(load, "hub_dataset_bytes", lambda source, config: asked.append(source) or hub_bytes)
    assert load.streams(DataSpec(source="someone/reviews", streaming=streaming), fmt) is expected
    assert asked == (["someone/reviews"] if streaming == "auto" and fmt == "hub" else [])
