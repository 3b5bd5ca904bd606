"""Streamed data (`data.streaming`) beyond one process: several processes each train on their own rows of the
stream, `ortlab tune` measures from the stream's head, the workbench previews a large source from its head, and
the whole-column checks of a large local file run in bounded chunks.

The several-process test is a real torchrun of two CPU processes (gloo) running ortlab's own `execute`; each rank
records the rows that reached its model (`tests/helpers/stream_rank_rows.py`)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

BATCH, STEPS, EVAL = 8, 4, 5


def _reviews(path: Path, rows: int) -> Path:
    words = ["good", "bad", "film", "plot", "actor", "slow", "funny", "great", "dull", "scene"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(rows):
            w.writerow([f"review {i} " + " ".join(words[(i * 7 + k) % len(words)] for k in range(4)), "ab"[i % 2]])
    return path


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
