"""Does the model fit the data (ortlab.fit): positions, unknown tokens, padding, checked before any weight loads.

The refusals a user meets through `ortlab train` are rows of tests/test_reliability.py's hostile-input table; these
are the rules underneath, and what is accepted rather than refused (a default max_length clipped, a decoder
classifier given a pad token).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ortlab.data import DataError
from ortlab.spec import RunSpec
from ortlab.tasks import ModelError


def test_positions_come_from_the_config_field_each_architecture_uses():
    from transformers import BertConfig, DebertaV2Config, GPT2Config, RobertaConfig, T5Config

    from ortlab.fit import model_positions

    assert model_positions(BertConfig()) == (512, "max_position_embeddings")
    assert model_positions(GPT2Config(n_positions=256)) == (256, "n_positions")
    # RoBERTa numbers positions from pad_token_id + 1: its 514 positions read 512 tokens.
    assert model_positions(RobertaConfig(max_position_embeddings=514, pad_token_id=1)) == (
        512,
        "max_position_embeddings",
    )
    # Relative positions only: nothing to run off the end of, whatever a stale field says.
    assert model_positions(T5Config(n_positions=512)) is None
    assert model_positions(DebertaV2Config(position_biased_input=False)) is None


def test_max_length_beyond_the_positions_is_refused_when_asked_and_clipped_when_default():
    from transformers import BartConfig, BertConfig

    from ortlab.fit import _max_length

    config, said = BertConfig(max_position_embeddings=64), []
    assert _max_length(config, RunSpec.parse({}), said.append) == 64  # the default 128 is no one's request
    assert said and "at most 64 tokens" in said[0]
    with pytest.raises(
        ModelError, match=r"hyper.max_length: 100 tokens .* positions for 64 .* set hyper.max_length to 64"
    ):
        _max_length(config, RunSpec.parse({"hyper": {"max_length": 100}}), said.append)
    seq2seq = RunSpec.parse({"task": "seq2seq", "hyper": {"max_length": 32, "max_target_length": 200}})
    with pytest.raises(ModelError, match=r"hyper.max_target_length: 200 tokens"):
        _max_length(BartConfig(max_position_embeddings=64), seq2seq, said.append)


@pytest.fixture
def positions_64(tiny_bert, tmp_path) -> Path:
    """The tiny BERT's folder saying it has 64 positions (the check reads the config and tokenizer only)."""
    folder = tmp_path / "bert-64"
    shutil.copytree(tiny_bert, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    return folder


def test_the_default_max_length_is_clipped_for_the_whole_run(positions_64, tmp_path):
    from ortlab.fit import check_model_and_data, fitted

    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "\n".join(f'"a good film {i}",{i % 2}' for i in range(20)) + "\n")
    spec = RunSpec.parse({"model": {"name": str(positions_64)}, "data": {"source": str(data)}})
    said: list[str] = []
    _, prepared = check_model_and_data(spec, said.append)
    assert prepared.max_length == 64 and any("at most 64 tokens" in s for s in said)
    assert fitted(spec, prepared).hyper.max_length == 64 and spec.hyper.max_length == 128


def test_unknown_tokens_are_measured_on_the_text(tiny_bert):
    from transformers import AutoTokenizer

    from ortlab.fit import unknown_share

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    english, counted = unknown_share(tokenizer, ["a good film with a funny story"] * 4)
    assert english == 0 and counted > 20
    cyrillic, _ = unknown_share(tokenizer, ["Съешь же ещё этих мягких французских булок"] * 4)
    assert cyrillic > 0.9


def test_a_decoder_classifier_gets_the_pad_token_it_lacks(tiny_gpt2):
    # GPT-2's config has no pad_token_id; its classifier refused any batch of 2+ rows after the model loaded.
    import torch

    from ortlab.tasks import load_model, load_tokenizer

    tokenizer = load_tokenizer(str(tiny_gpt2))
    model = load_model(str(tiny_gpt2), "sequence-classification", ["no", "yes"], pad_token_id=tokenizer.pad_token_id)
    batch = tokenizer(["a good film", "bad"], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, 2)
    assert model.config.pad_token_id == tokenizer.eos_token_id


def test_an_eval_split_without_rows_is_refused(monkeypatch):
    import datasets

    import ortlab.data
    import ortlab.data.checks

    rows = {"text": [f"review {i}" for i in range(10)], "label": [i % 2 for i in range(10)]}
    splits = {"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict({"text": [], "label": []})}
    # A Hub dataset with an empty split (local files are a single 'train' split): the loading is replaced, the
    # splits are real datasets.
    monkeypatch.setattr(ortlab.data.checks, "load_raw", lambda spec: (splits, []))
    spec = RunSpec.parse({"data": {"source": "someone/reviews", "eval_split": "test"}})
    with pytest.raises(DataError, match=r"data.eval_split: the 'test' split has no rows"):
        ortlab.data.load_and_check(spec.data, "sequence-classification", 0)
