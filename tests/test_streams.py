"""Streamed data (`data.streaming`) beyond one process: several processes each train on their own rows of the
stream, `ortlab tune` measures from the stream's head, the workbench previews a large source from its head, and
the whole-column checks of a large local file run in bounded chunks.

The several-process test is a real torchrun of two CPU processes (gloo) running ortlab's own `execute`; each rank
records the rows that reached its model (`tests/helpers/stream_rank_rows.py`)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT
from tiny_models import write_reviews

BATCH, STEPS, EVAL = 8, 4, 5


def _reviews(path: Path, rows: int) -> Path:
    return write_reviews(path, rows, words=4)


def _spec(tiny_bert: Path, source: Path, out: Path, name: str, **extra) -> dict:
    return {
        "name": name,
        "output_dir": str(out),
        "model": {"name": str(tiny_bert)},
        "data": {"source": str(source), "streaming": True, "max_eval_samples": EVAL},
        "hyper": {"batch_size": BATCH, "max_length": 32, "max_steps": STEPS, "save_steps": None},
        "accel": {"ort": False, "fused_adam": False, "precision": "fp32"},
        **extra,
    }


def _row(text: str) -> int:
    found = re.match(r"review(\d+)", text)
    assert found, text
    return int(found.group(1))


def test_the_whole_column_checks_run_in_chunks_and_name_rows_across_them(tmp_path, monkeypatch):
    """With chunks of 7 rows: a missing text in a late chunk is named by its row, a label first seen in the last
    chunks is a class, a mostly-empty text column is counted across chunks, and the held-out split is the one
    datasets' train_test_split gives (same rows, same order) without its whole-list copy."""
    from ortlab.data import DataError, load_and_check
    from ortlab.data.columnar import hold_out
    from ortlab.spec import DataSpec

    monkeypatch.setattr("ortlab.data.columnar.CHECK_CHUNK", 7)
    source = _reviews(tmp_path / "r.csv", 100)
    lines = source.read_text().splitlines()
    lines[100] = ",c"  # data row 99 (the last chunk): no text, a third label
    source.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"1 of 100 row\(s\) of the 'train' split have no 'text' \(first: row 99\)"):
        load_and_check(DataSpec(source=str(source)), "sequence-classification", 42)
    lines[86:] = [f"late review {i},c" for i in range(85, 100)]  # a third class in the last chunks only
    source.write_text("\n".join(lines) + "\n")
    prepared = load_and_check(DataSpec(source=str(source), eval_fraction=0.2), "sequence-classification", 42)
    assert prepared.label_names == ["a", "b", "c"]
    full = list(prepared.train["text"]) + list(prepared.eval["text"])
    assert sorted(full) == sorted(line.rsplit(",", 1)[0] for line in lines[1:])

    blank = tmp_path / "blank.csv"
    blank.write_text("text,label\n" + "".join(f"{' ' if i % 3 else 'words'},{'ab'[i % 2]}\n" for i in range(60)))
    with pytest.raises(DataError, match=r"40 of 60 rows of the 'train' split have an empty 'text'"):
        load_and_check(DataSpec(source=str(blank)), "sequence-classification", 42)

    import datasets

    ds = datasets.Dataset.from_dict({"n": list(range(1001))})
    for fraction in (0.1, 0.37):
        train, evaluation = hold_out(ds, fraction, 7)
        split = ds.train_test_split(test_size=fraction, seed=7)
        assert train["n"][:] == split["train"]["n"][:] and evaluation["n"][:] == split["test"]["n"][:]


def test_a_split_of_a_many_chunked_column_reads_in_order_and_its_labels_leave_out_the_held_rows(monkeypatch):
    """A column stored in many Arrow chunks (as datasets stores a large CSV: one per 1,000 rows), read through a
    split's random indices: `column_chunks` gives every value in the split's order (gathered chunk by chunk, not
    by joining the column), and the training labels are those of the rows not held out (a label found only in
    held-out rows is not one, as reading the rest would say)."""
    import datasets
    import pyarrow as pa

    from ortlab.data.columnar import column_chunks, distinct_values, distinct_values_outside, hold_out

    monkeypatch.setattr("ortlab.data.columnar.CHECK_CHUNK", 13)
    labels = ["a", "b"] * 150 + ["rare"]
    tables = [pa.table({"n": list(range(i, min(i + 10, 301))), "label": labels[i : i + 10]}) for i in range(0, 301, 10)]
    ds = datasets.Dataset(datasets.table.InMemoryTable(pa.concat_tables(tables)))
    assert ds.data.column("n").num_chunks == 31
    train, held = hold_out(ds, 0.2, 3)
    got = [v for _, chunk in column_chunks(train, "n") for v in chunk.to_pylist()]
    assert got == train["n"][:] and sorted(got + held["n"][:]) == list(range(301))
    rare_held = 300 in held["n"][:]
    assert sorted(distinct_values_outside(ds, held, "label")) == sorted(distinct_values(train, "label"))
    assert ("rare" in distinct_values_outside(ds, held, "label")) is not rare_held
    assert distinct_values_outside(train, held, "label") is None  # a selection itself: the caller reads the rest


@pytest.mark.slow
def test_two_processes_each_train_on_their_own_rows_of_a_stream(tiny_bert, tmp_path):
    """Rank 0 and rank 1 train on disjoint rows, and together on the stream's first STEPS x BATCH x 2 rows (in the
    order one process would read the shuffled stream): nothing trained twice, nothing skipped, batch x 2 per step,
    and each process read its rows itself."""
    from ortlab.data import load_and_check
    from ortlab.runfolder.rundir import RunDir
    from ortlab.spec import RunSpec

    source = _reviews(tmp_path / "reviews.csv", 400)
    spec = RunSpec.model_validate(_spec(tiny_bert, source, tmp_path / "runs", "ranks", target={"processes": 2}))
    run = RunDir.create(spec.output_dir, spec)
    out = tmp_path / "ranks"
    out.mkdir()
    helper = ROOT / "tests" / "helpers" / "stream_rank_rows.py"
    cmd = [PYTHON, "-m", "ortlab.runner.torchrun", "--nproc_per_node=2", str(helper), str(run.path), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    rows = [[[_row(t) for t in batch] for batch in rank["trained"]] for rank in ranks]
    assert [len(r) for r in rows] == [STEPS, STEPS] and all(len(b) == BATCH for r in rows for b in r)
    mine, theirs = ({i for b in r for i in b} for r in rows)
    assert not mine & theirs, "a row trained on both ranks"
    prepared = load_and_check(spec.data, spec.task, spec.seed)
    stream = [row["__ortlab_row__"] for row in prepared.train.take(STEPS * BATCH * 2)]
    assert mine | theirs == set(stream), "together, the ranks train on the stream's first rows"
    assert not (mine | theirs) & set(range(EVAL)), "the held-out eval rows are never trained on"
    # Each process read its rows itself (with accelerate's default, rank 1 was sent its batches by rank 0 and
    # tokenized no training row). One file: every process reads the stream in the same order and keeps its rows.
    for rank, trained in zip(ranks, (mine, theirs), strict=True):
        assert trained <= {_row(t) for t in rank["read"] if t.startswith("review")}
    # Process r keeps rows r, r + 2, r + 4, ... of the one order: each step's global batch is the stream's next
    # BATCH x 2 rows.
    for rank in (0, 1):
        assert [i for batch in rows[rank] for i in batch] == stream[rank::2], rank


def test_a_stream_of_several_files_is_split_by_files_unless_it_starts_after_a_held_out_head(tmp_path):
    """`for_process` (datasets' split_dataset_by_node): two files and two processes, each process reads only its
    own file; when the stream starts after held-out eval rows (a `skip`, which datasets would share out between
    the files), by rows of the one order instead: still disjoint, together the whole stream."""
    import datasets

    from ortlab.data.shards import for_process

    folder = tmp_path / "parts"
    folder.mkdir()
    _reviews(folder / "a.csv", 40)
    with open(folder / "b.csv", "w", encoding="utf-8") as f:
        f.write("text,label\n" + "".join(f"review {i} good,a\n" for i in range(100, 140)))
    files = [str(folder / "a.csv"), str(folder / "b.csv")]
    stream = datasets.load_dataset("csv", data_files={"train": files}, streaming=True)["train"]
    assert stream.num_shards == 2

    def rows(ds) -> list[int]:
        return [int(r["text"].split()[1]) for r in ds]

    by_files = [rows(for_process(stream, rank, 2, held_out_head=False)) for rank in (0, 1)]
    assert sorted(by_files) == [list(range(40)), list(range(100, 140))], "each process reads its own file"
    held = stream.skip(5)
    by_rows = [rows(for_process(held, rank, 2, held_out_head=True)) for rank in (0, 1)]
    whole = rows(held)
    assert by_rows == [whole[0::2], whole[1::2]] and 0 not in whole and 100 in whole
    assert for_process(stream, 0, 1, held_out_head=True) is stream


def _tokenized_stream(tiny_bert: Path, tmp_path: Path):
    from ortlab.data import collator, load_and_check, tokenize
    from ortlab.spec import RunSpec
    from ortlab.tasks import load_tokenizer

    spec = RunSpec.model_validate(_spec(tiny_bert, _reviews(tmp_path / "reviews.csv", 300), tmp_path, "s"))
    prepared = load_and_check(spec.data, spec.task, spec.seed)
    tokenizer = load_tokenizer(str(tiny_bert), None)
    train, _ = tokenize(prepared, tokenizer, spec.task, 32)
    return spec, train, collator(spec.task, tokenizer, prepared=prepared)


def test_the_measuring_batches_of_a_stream_are_its_head(tiny_bert, tmp_path):
    """`ortlab tune` and a run's acceleration lookup draw their batches from the run's data; a stream cannot be
    shuffled by a DataLoader (it refused with an error before), so they are the first batches the run trains."""
    from torch.utils.data import DataLoader

    from ortlab.tune.auto import batches_from

    spec, train, collate = _tokenized_stream(tiny_bert, tmp_path)
    batches = batches_from(train, collate, BATCH, spec.seed, n=3)
    head = [b for _, b in zip(range(3), DataLoader(train, batch_size=BATCH, collate_fn=collate), strict=False)]
    assert len(batches) == 3
    for got, want in zip(batches, head, strict=True):
        assert got["input_ids"].tolist() == want["input_ids"].tolist()
        assert got["labels"].tolist() == want["labels"].tolist()


@pytest.mark.slow
def test_ortlab_tune_measures_a_streamed_spec_and_caches_it(tiny_bert, tmp_path, monkeypatch):
    """`tune_spec` on streamed data measures (here the plain mix alone, to keep the test short) from the stream's
    head, and a second call finds the measurement in the cache."""
    from ortlab import tune
    from ortlab.spec import RunSpec

    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    real_plan = tune.candidate_mixes
    monkeypatch.setattr("ortlab.tune.measure.candidate_mixes", lambda *args, **kwargs: real_plan()[:1])
    source = _reviews(tmp_path / "reviews.csv", 400)
    spec = RunSpec.model_validate(_spec(tiny_bert, source, tmp_path / "runs", "tuned"))
    result = tune.tune_spec(spec, progress=lambda line: None)
    assert [m.name for m in result.candidates] == ["plain"] and result.chosen == "plain"
    assert result.candidates[0].samples_per_s > 0 and not result.cached
    again = tune.tune_spec(spec, progress=lambda line: None)
    assert again.cached and again.key == result.key


def test_a_streamed_run_decides_its_auto_accelerations_from_the_stream_head(tiny_bert, tmp_path, monkeypatch):
    """A streamed run's acceleration lookup used to be skipped ("the data is streamed"); it now draws its batches
    from the stream's head, as a run of a file does from its shuffle."""
    from ortlab.runfolder.rundir import RunDir
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    spec = _spec(tiny_bert, _reviews(tmp_path / "reviews.csv", 200), tmp_path / "runs", "auto")
    spec["accel"] = {}  # every acceleration 'auto'
    spec["hyper"]["max_steps"] = 2
    result = train_spec(RunSpec.model_validate(spec), progress=False, log=lambda line: None)
    auto = next(r for r in RunDir(Path(result["run_dir"])).metrics() if r.get("event") == "auto")
    assert "streamed" not in auto["why"] and "2 steps" in auto["why"], auto


def test_a_large_source_is_previewed_from_its_head(tmp_path, monkeypatch):
    """The workbench's preview of a large local file streams its first rows: a malformed line far into the file
    (which a whole read stops at) is never reached, the sizes say they were not counted, and the proposal is the
    one the whole file gives. A small file is read whole, as before (its sizes counted)."""
    from ortlab import discover
    from ortlab.data import DataError

    source = _reviews(tmp_path / "big.csv", 30_000)
    with open(source, "a", encoding="utf-8") as f:
        f.write('review late,"a",extra,fields\n')
    with pytest.raises(DataError):  # read whole, the bad line far in stops the preview
        discover.inspect_dataset(str(source))
    monkeypatch.setattr(discover, "PREVIEW_WHOLE_BYTES", source.stat().st_size - 1)
    info = discover.inspect_dataset(str(source))
    assert info.head == discover.PREVIEW_HEAD_ROWS and info.splits == {"train": None}
    assert "first 1,000 rows" in info.note and "split sizes unknown" in info.note
    assert [r["text"].split()[1] for r in info.rows] == ["0", "1", "2", "3", "4"]
    assert info.proposal["text_column"] == "text" and info.proposal["label_column"] == "label"
    assert info.label_names == ["a", "b"]

    small = discover.inspect_dataset(str(_reviews(tmp_path / "small.csv", 50)))
    assert small.splits == {"train": 50} and small.head is None and small.note is None
