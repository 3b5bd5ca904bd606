"""Numbers from names and values ortlab does not control are ASCII digits (issue #48, item 4).

`str.isdigit` says yes to '²' (superscript two), which `int` refuses, and to '٣' (Arabic-Indic three), which `int`
reads as 3: a `checkpoint-²` folder gave `ortlab resume` a traceback and the server's resume route a 500, a label '²'
a traceback after the data checks, a query's offset '٣' an answer from byte 3. `safeio.ascii_int` is the one reader.
"""

from __future__ import annotations

import json

import pytest

from ortlab.safeio import ascii_int

OTHER_DIGITS = ("²", "٣", "１", "3²")


@pytest.mark.parametrize(
    ("text", "signed", "expected"),
    [("0", False, 0), ("120", False, 120), ("-4", True, -4), ("-4", False, None), ("", False, None)]
    + [(t, True, None) for t in OTHER_DIGITS]
    + [("1" * 19, False, None), ("1.5", False, None), (" 7", False, None), ("7\n", False, None)],
)
def test_ascii_int_reads_ascii_digits_only(text, signed, expected):
    assert ascii_int(text, signed=signed) == expected


def _checkpoint(folder, name: str) -> None:
    path = folder / "checkpoints" / name
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": 1}))


@pytest.mark.parametrize("other", OTHER_DIGITS)
def test_a_checkpoint_named_with_other_digits_is_no_checkpoint(tmp_path, other):
    from ortlab.runfolder.rundir import RunDir
    from ortlab.runner import Run, RunError
    from ortlab.spec import RunSpec

    run = RunDir.create(tmp_path / "runs", RunSpec(name="planted"))
    run.set_status("running", step=0)
    run.set_status("stopped", step=1)
    _checkpoint(run.path, f"checkpoint-{other}")
    assert run.last_checkpoint() is None
    with pytest.raises(RunError, match="has no checkpoint to resume from"):
        Run(run.path).resume()
    _checkpoint(run.path, "checkpoint-4")
    assert run.last_checkpoint().name == "checkpoint-4"


def test_labels_that_look_like_digits_are_names_sorted_after_the_numbers():
    from datasets import Dataset

    from ortlab.data.checks import label_names

    train = Dataset.from_dict({"text": ["a", "b", "c", "d", "e"], "label": ["10", "²", "2", "٣", "-1"]})
    assert label_names(train, "label", "sequence-classification") == ["-1", "2", "10", "²", "٣"]
