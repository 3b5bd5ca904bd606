"""Pairs scored with each prompt run once (ortlab.train.sharedprompt) equal the full rows: log-probabilities, the
DPO/IPO loss, the rewards, every trainable parameter's gradient (within 1e-5, float32) and three training steps;
where sharing is not exact or not supported the full rows run and `trainer.prompt_sharing` says why."""

from __future__ import annotations

import copy

import pytest
import torch
from test_preference_loss import grads, max_grad_diff, ortlab_args, perturbed, tiny_llama, tokenizer  # noqa: F401

from ortlab.train import sharedprompt
from ortlab.train.preference import sequence_logps
from ortlab.train.preferencebatch import PairCollator
from ortlab.train.preferencetrainer import PreferenceTrainer

TOL = 1e-5

# Prompts of different lengths, answers of different lengths: right padding in the prompts and in the answers.
PAIRS = [
    {"prompt_ids": [4, 6, 8, 9, 10, 5], "chosen_ids": [11, 2], "rejected_ids": [12, 13, 14, 15, 2]},
    {"prompt_ids": [5, 9], "chosen_ids": [7, 8, 9, 10, 11, 12, 2], "rejected_ids": [9]},
    {"prompt_ids": [5, 9, 12], "chosen_ids": [7], "rejected_ids": [9, 3, 2]},
]


class RowCounter:
    """The batch sizes a model's forward ran on (N rows: the prompts once; 2N: the full rows)."""

    def __init__(self, model):
        self.rows: list[int] = []
        model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        self.rows.append(kwargs["input_ids"].shape[0])


def _lora(model):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    with torch.no_grad():  # an adapter that changes the outputs (B starts at zero): rewards are not all 0
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model


def _trainer(tok, tmp_path, reference: str, share: bool, **kw):
    base = tiny_llama(len(tok), seed=21)
    model = _lora(base) if reference == "adapter" else base
    ref_model = perturbed(base) if reference == "model" else None
    trainer = PreferenceTrainer(
        model, ortlab_args(tmp_path, share_prompt=share, reference=reference, **kw), train_dataset=PAIRS,
        ref_model=ref_model,
    )  # fmt: skip
    if reference == "copy":  # the reference copied the policy: move the policy, so the rewards are not all 0
        with torch.no_grad():
            g = torch.Generator().manual_seed(3)
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return trainer


@pytest.mark.parametrize("loss", ["dpo", "ipo"])
@pytest.mark.parametrize("reference", ["adapter", "copy", "model"])
def test_shared_prompt_equals_full_rows(tokenizer, tmp_path, loss, reference):  # noqa: F811
    batch = PairCollator(0)(PAIRS)
    results = {}
    for share in (True, False):
        trainer = _trainer(tokenizer, tmp_path, reference, share, preference_loss=loss)
        counter = RowCounter(sharedprompt.causal_lm(trainer.model))
        out, metrics = trainer._pairs(trainer.model, batch)
        out.loss.backward()
        results[share] = out, metrics, grads(trainer.model), counter.rows, trainer.prompt_sharing
    (shared, shared_metrics, shared_grads, shared_rows, sharing), (full, full_metrics, full_grads, full_rows, _) = (
        results[True],
        results[False],
    )
    n = len(PAIRS)
    # the shared path ran: the prompts once (N rows), then the 2N answers; policy and reference alike
    assert sharing == {"applied": True, "reason": None, "fallback_batches": 0}
    policy_and_reference = 2 if reference == "adapter" else 1  # a separate reference model has its own forward
    assert shared_rows == [n, 2 * n] * policy_and_reference
    assert full_rows == [2 * n] * policy_and_reference
    assert abs(shared.loss.item() - full.loss.item()) <= TOL
    assert full.chosen_rewards.abs().max() > 1e-3 and full.rejected_rewards.abs().max() > 1e-3  # not all 0
    assert torch.allclose(shared.chosen_rewards, full.chosen_rewards, atol=TOL, rtol=0)
    assert torch.allclose(shared.rejected_rewards, full.rejected_rewards, atol=TOL, rtol=0)
    assert all(abs(shared_metrics[k] - full_metrics[k]) <= TOL for k in full_metrics)
    assert max_grad_diff(shared_grads, full_grads) <= TOL


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_pair_logps_equal_full_rows_for_llama_and_gpt2(family, attention):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if family == "llama":
        config = LlamaConfig(
            vocab_size=30, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, attn_implementation=attention,
        )  # fmt: skip
        model = LlamaForCausalLM(config).eval()
    else:
        config = GPT2Config(
            vocab_size=30, n_embd=32, n_layer=2, n_head=4, n_positions=64, attn_implementation=attention,
            bos_token_id=1, eos_token_id=2,
        )  # fmt: skip
        model = GPT2LMHeadModel(config).eval()
    assert sharedprompt.unsupported(model) is None
    batch = PairCollator(0)(PAIRS)
    full = sequence_logps(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                          batch["labels"])  # fmt: skip
    shared = sharedprompt.layout(batch["input_ids"], batch["attention_mask"], batch["labels"])
    chosen, rejected = sharedprompt.pair_logps(model, shared)
    assert torch.allclose(torch.cat([chosen, rejected]), full, atol=TOL, rtol=0)
    assert shared.positions_computed < batch["input_ids"].numel()


@pytest.mark.parametrize("loss", ["dpo", "ipo"])
def test_three_training_steps_equal_with_and_without_sharing(tokenizer, tmp_path, loss):  # noqa: F811
    def run(share: bool) -> list[float]:
        model = _lora(tiny_llama(len(tokenizer), seed=13))
        args = ortlab_args(
            tmp_path, metrics_path=None, max_steps=3, per_device_train_batch_size=3, learning_rate=1e-2,
            save_strategy="no", seed=0, share_prompt=share, preference_loss=loss,
        )  # fmt: skip
        trainer = PreferenceTrainer(model, args, train_dataset=PAIRS * 3)
        trainer.train()
        assert trainer.prompt_sharing["applied"] is share
        return [r["loss"] for r in trainer.metrics_records if r.get("event") == "step"]

    shared, full = run(True), run(False)
    assert len(shared) == 3 and len(set(shared)) > 1
    assert shared == pytest.approx(full, abs=TOL)


def test_gradient_checkpointing_runs_full_rows_and_says_why(tokenizer, tmp_path):  # noqa: F811
    trainer = _trainer(tokenizer, tmp_path, "adapter", True, gradient_checkpointing=True)
    assert trainer.prompt_sharing["applied"] is False
    assert "gradient checkpointing" in trainer.prompt_sharing["reason"]
    counter = RowCounter(sharedprompt.causal_lm(trainer.model))
    trainer._pairs(trainer.model, PairCollator(0)(PAIRS))
    assert counter.rows == [2 * len(PAIRS)] * 2
    # turned on on the model itself (not through the arguments): noticed at the batch
    trainer = _trainer(tokenizer, tmp_path, "adapter", True)
    sharedprompt.causal_lm(trainer.model).gradient_checkpointing_enable()
    trainer._pairs(trainer.model, PairCollator(0)(PAIRS))
    assert trainer.prompt_sharing["applied"] is False and "gradient checkpointing" in trainer.prompt_sharing["reason"]


def test_a_pair_whose_prompts_differ_runs_full_rows_and_says_why(tokenizer, tmp_path):  # noqa: F811
    rows = [
        {"chosen_input_ids": [4, 6, 8, 11], "chosen_labels": [-100, -100, -100, 11],
         "rejected_input_ids": [4, 7, 8, 12], "rejected_labels": [-100, -100, -100, 12]},
        {"chosen_input_ids": [5, 9, 7], "chosen_labels": [-100, -100, 7],
         "rejected_input_ids": [5, 9, 9, 3], "rejected_labels": [-100, -100, 9, 3]},
    ]  # fmt: skip
    batch = PairCollator(0)(rows)
    assert "different prompt tokens" in sharedprompt.layout(batch["input_ids"], batch["attention_mask"],
                                                            batch["labels"])  # fmt: skip
    trainer = _trainer(tokenizer, tmp_path, "adapter", True)
    counter = RowCounter(sharedprompt.causal_lm(trainer.model))
    out, _ = trainer._pairs(trainer.model, batch)
    assert counter.rows == [2 * len(rows)] * 2
    assert trainer.prompt_sharing["fallback_batches"] == 1
    assert "different prompt tokens" in trainer.prompt_sharing["reason"]
    full = _trainer(tokenizer, tmp_path, "adapter", False)
    assert out.loss.item() == pytest.approx(full._pairs(full.model, batch)[0].loss.item(), abs=TOL)
    # a chat rendering whose two prompts are the same is shared
    same = [dict(rows[0], rejected_input_ids=[4, 6, 8, 12])]
    trainer._pairs(trainer.model, PairCollator(0)(same))
    assert trainer.prompt_sharing["fallback_batches"] == 1


def test_where_sharing_does_not_apply_it_says_why(tokenizer, tmp_path):  # noqa: F811
    assert _trainer(tokenizer, tmp_path, "adapter", False).prompt_sharing["reason"] == "share_prompt=False"
    orpo = PreferenceTrainer(
        tiny_llama(len(tokenizer)), ortlab_args(tmp_path, preference_loss="orpo"), train_dataset=PAIRS
    )
    assert orpo.prompt_sharing["applied"] is False and orpo.prompt_sharing["reason"].startswith("orpo")
    record = orpo.preference_record()
    assert record == {"reference": None, "prompt_sharing": orpo.prompt_sharing}
    left = PairCollator(0)(PAIRS)
    left["attention_mask"] = left["attention_mask"].flip(-1)
    assert (
        sharedprompt.layout(left["input_ids"], left["attention_mask"], left["labels"])
        == "the rows are not right-padded"
    )
    window = copy.deepcopy(tiny_llama(len(tokenizer)))
    window.config.sliding_window = 4
    assert "sliding-window" in sharedprompt.unsupported(window)
