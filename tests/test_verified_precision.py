"""Precision is verified by what the forward computed in, not read from the configuration."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch


def _train(tmp_path, model, **args):
    from train_mix import SEQ, VOCAB

    from ortlab import ORTTrainer, ORTTrainingArguments

    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": torch.randint(5, VOCAB, (SEQ,), generator=g), "labels": i % 2} for i in range(24)]
    trainer = ORTTrainer(
        model=model,
        args=ORTTrainingArguments(
            output_dir=str(tmp_path),
            per_device_train_batch_size=8,
            max_steps=3,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
            use_ort=False,
            **args,
        ),
        train_dataset=data,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    return trainer.accelerations, [str(w.message) for w in caught]


@pytest.mark.parametrize("bf16", [False, True])
def test_the_precision_that_ran_is_observed(tmp_path, bf16):
    from train_mix import tiny_bert

    acc, _ = _train(tmp_path, tiny_bert(0), bf16=bf16)
    record = acc["bf16"]
    assert record.applied is bf16
    assert record.details["verified_by"].startswith("observed"), record.details
    assert record.details["observed"]["precision"] == ("bf16" if bf16 else "fp32")
    assert record.details["observed"]["autocast"] == [bf16]


def test_bf16_asked_for_but_not_computed_is_reported_loudly(tmp_path):
    from train_mix import tiny_bert

    model = tiny_bert(0)
    inner = model.forward

    @functools.wraps(inner)  # the same signature, so Trainer feeds it the same columns
    def fp32_forward(*args, **kwargs):
        # A model that turns autocast off in its own forward: the configuration still says bf16.
        with torch.autocast("cpu", enabled=False):
            return inner(*args, **kwargs)

    model.forward = fp32_forward
    acc, messages = _train(tmp_path, model, bf16=True)
    record = acc["bf16"]
    assert record.requested and not record.applied
    assert record.details["configured_precision"] == "bf16"
    assert record.details["active_precision"] == "fp32"
    assert any("bf16 was requested but is NOT applied: training runs in fp32 (observed" in m for m in messages), (
        messages
    )


def test_gradient_checkpointing_is_verified_by_what_recomputed(tmp_path):
    """Issue #48, Low: gradient checkpointing was recorded as the model's flag claimed. Now it is applied only when
    layers ran their forward again inside the backward pass, and reported loudly when asked and not applied."""
    from train_mix import tiny_bert

    acc, said = _train(tmp_path / "on", tiny_bert(0), activation_checkpointing=True)
    record = acc["gradient_checkpointing"]
    assert record.requested and record.applied, record
    assert record.details["recomputed_in_backward"] > 0 and record.details["verified_by"].startswith("observed")
    assert not any("gradient_checkpointing" in s for s in said)
    acc, _ = _train(tmp_path / "off", tiny_bert(0))
    assert "gradient_checkpointing" not in acc, "not asked: no record (as before)"


def test_gradient_checkpointing_claimed_but_not_done_is_reported_loudly(tmp_path):
    from train_mix import tiny_bert

    model = tiny_bert(0)
    enable = model.activation_checkpointing_enable

    def claims_only(*args, **kwargs):
        # Every layer's flag says on, but its checkpoint function just calls the layer: nothing is recomputed.
        enable(*args, **kwargs)
        for m in model.modules():
            if hasattr(m, "_gradient_checkpointing_func"):
                m._gradient_checkpointing_func = lambda fn, *a, **k: fn(*a, **k)

    model.activation_checkpointing_enable = claims_only
    acc, said = _train(tmp_path, model, activation_checkpointing=True)
    assert model.is_activation_checkpointing, "the model's flag says on"
    record = acc["gradient_checkpointing"]
    assert record.requested and not record.applied, record
    assert record.details["recomputed_in_backward"] == 0
    assert any(
        "gradient_checkpointing was requested but is NOT applied: no layer ran its forward again" in s for s in said
    )
