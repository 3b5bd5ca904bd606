"""Data discovery, inspection, checks and scores, on the embedded datasets and files written here."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortlab import scores
from ortlab.discover import inspect_dataset, search_datasets, search_models


@pytest.mark.parametrize(
    ("source", "task", "text", "label"),
    [
        ("embedded:rotten-tomatoes", "sequence-classification", "text", "label"),
        ("embedded:synthetic-ner", "token-classification", "tokens", "ner_tags"),
        ("embedded:hamlet", "causal-lm", "text", None),
    ],
)
def test_inspect_proposes_mapping_and_task(source, task, text, label):
    info = inspect_dataset(source)
    assert info.proposal["task"] == task
    assert info.proposal["text_column"] == text
    assert info.proposal["label_column"] == label
    assert len(info.rows) == 5
    assert sum(info.splits.values()) > 1000
    if source == "embedded:rotten-tomatoes":
        assert info.label_names == ["fresh", "rotten"]
        assert info.splits == {"train": 12808}


def test_a_model_search_reads_no_safetensors_header_a_folder_lies_about(tmp_path):
    """A found folder's `*.safetensors` claims a header of 2**60 bytes (a MemoryError once), or is a link to
    /dev/zero, or holds a header that is not a table of shapes: the candidate is listed with no parameter count."""
    import struct

    from ortlab.discover import search_models

    cases = {
        "huge-header": struct.pack("<Q", 2**60) + b"{}",
        "not-json": struct.pack("<Q", 4) + b"nope",
        "no-shape": struct.pack("<Q", 11) + b'{"w": "x"}\n',
    }
    for name, data in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"model_type": "bert"}')
        (tmp_path / name / "model.safetensors").write_bytes(data)
    (tmp_path / "zero").mkdir()
    (tmp_path / "zero" / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "zero" / "model.safetensors").symlink_to("/dev/zero")
    models, _ = search_models("", folders=[str(tmp_path)])
    found = {Path(m.id).name: m.parameters for m in models if m.where == "local"}
    assert found == {"huge-header": None, "not-json": None, "no-shape": None, "zero": None}


def test_offline_search_answers_at_once_with_local_candidates(tiny_bert, monkeypatch):
    import socket

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # "At once" means: no connection is tried (one would wait on the network's timeouts). Every attempt is recorded
    # and refused, so a search that tried and swallowed the error is caught too.
    tried: list = []

    def no_network(self, address, *args, **kwargs):
        tried.append(address)
        raise OSError("the offline search must not open a connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    models, note = search_models("", folders=[str(tiny_bert.parent)])
    datasets, _ = search_datasets("rotten")
    assert tried == []
    assert "offline" in note
    embedded = next(m for m in models if m.where == "embedded")
    assert embedded.id == "sentence-transformers/all-MiniLM-L6-v2"
    assert 22_000_000 < embedded.parameters < 23_500_000
    assert any(m.where == "local" and m.id == str(tiny_bert) for m in models)
    assert [d.id for d in datasets] == [
        "embedded:rotten-tomatoes",
        "embedded:rotten-tomatoes-chat",
        "embedded:rotten-tomatoes-pairs",
        "embedded:rotten-tomatoes-kto",
    ]


def test_classification_scores_by_hand():
    s = scores.classification([0, 1, 1, 0], [0, 1, 0, 0], num_labels=2)
    assert s["accuracy"] == 0.75
    # class 0: tp 2, fp 0, fn 1 -> 0.8; class 1: tp 1, fp 1, fn 0 -> 0.667
    assert abs(s["f1"] - (0.8 + 2 / 3) / 2) < 1e-9


def test_entity_scores_need_exact_spans():
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    assert scores.entities(gold, gold)["f1"] == 1.0
    partial = scores.entities([["B-PER", "O", "O", "B-LOC"]], gold)  # PER span cut short: wrong
    assert partial["precision"] == 0.5
    assert partial["recall"] == 0.5
    assert scores.spans(["I-ORG", "I-ORG", "O"]) == {("ORG", 0, 2)}
