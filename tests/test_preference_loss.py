"""ortlab's preference losses (ortlab.train.preference) and trainer (ortlab.train.preferencetrainer) against TRL's.

For the same tiny random Llama, batch, reference and beta, ortlab's DPO (sigmoid, IPO, cDPO), ORPO and KTO losses,
the rewards and log-probabilities TRL logs, and the policy's gradients equal those of TRL 1.16's own trainers
(`DPOTrainer`, `trl.experimental.orpo.ORPOTrainer`, `KTOTrainer`, promoted from trl.experimental in 1.16), computed
by TRL's code on TRL's collated batch, within 1e-5. TRL's tokenization makes the rows; ortlab's collator pads them.

trl is not one of ortlab's dependencies: the session fixture installs it into test-artifacts/trl-site (once per
clone, as benchmarks/bench_lora_trl.py takes it) and puts that folder on sys.path for these tests only.
"""

from __future__ import annotations

import copy
import gc
import math
import sys

import pytest
import torch
from trlsite import TRL_VERSION, trl_site

from ortlab.runfolder.records import unknown_fields
from ortlab.train.preference import IGNORE, dpo_loss, kto_kl, kto_loss, orpo_loss, sequence_logps
from ortlab.train.preferencebatch import PairCollator, UnpairedCollator
from ortlab.train.preferencetrainer import PreferenceTrainer, PreferenceTrainingArguments

TOL = 1e-5

WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "log", "is", "good", "bad", "yes", "no", "please"]
WORDS += ["answer", "what", "why", "how", "blue", "red", "sky", "grass"]
PAIRS = [
    {"prompt": "what is the sky", "chosen": " blue", "rejected": " red grass"},
    {"prompt": "the cat sat on the", "chosen": " mat", "rejected": " dog log"},
    {"prompt": "is grass red", "chosen": " no", "rejected": " yes please"},
    {"prompt": "why is the sky blue", "chosen": " good question", "rejected": " bad"},
]
UNPAIRED = [
    {"prompt": "what is the sky", "completion": " blue", "label": True},
    {"prompt": "the cat sat on the", "completion": " dog log", "label": False},
    {"prompt": "is grass red", "completion": " no", "label": True},
    {"prompt": "why is the sky blue", "completion": " bad", "label": False},
]


@pytest.fixture(scope="session")
def trl():
    """trl 1.16 from its own folder (installed there when missing), on sys.path for these tests only."""
    site = str(trl_site())
    sys.path.insert(0, site)
    try:
        import trl

        assert trl.__version__ == TRL_VERSION, f"{site} holds trl {trl.__version__}: remove it and rerun"
        yield trl
    finally:
        sys.path.remove(site)


@pytest.fixture(scope="module")
def tokenizer():
    """A word-level tokenizer built here (nothing from the Hub): one token per word."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def tiny_llama(vocab_size: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def perturbed(model, scale: float = 0.05, seed: int = 1):
    """A reference that differs from the policy, so that the rewards are not all zero."""
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return ref


def ortlab_args(tmp_path, metrics_path: str | None = "", **kw):
    kw.setdefault("use_ort", False)
    return PreferenceTrainingArguments(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, metrics_path=metrics_path, **kw
    )


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def max_grad_diff(a, b) -> float:
    assert a.keys() == b.keys() and a
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _trl_config(cls, tmp_path, **kw):
    return cls(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False, **kw)


def _close(ours: dict, theirs: dict, keys) -> dict[str, float]:
    diffs = {k: abs(ours[k] - theirs[k]) for k in keys}
    assert all(d <= TOL for d in diffs.values()), diffs
    return diffs


# --- DPO -------------------------------------------------------------------------------------------------------------

DPO_CASES = {
    "sigmoid": ({"beta": 0.1}, {"beta": 0.1}),
    "sigmoid-beta0.5": ({"beta": 0.5}, {"beta": 0.5}),
    "ipo": ({"beta": 0.1, "preference_loss": "ipo"}, {"beta": 0.1, "loss_type": ["ipo"]}),
    # cDPO: TRL 1.16's "sigmoid" ignores label_smoothing; its "sigmoid" and "robust" losses, weighted, make cDPO:
    # cDPO = 2 (1 - eps) sigmoid - (1 - 2 eps) robust.
    "cdpo": (
        {"beta": 0.1, "label_smoothing": 0.2},
        {"beta": 0.1, "label_smoothing": 0.2, "loss_type": ["sigmoid", "robust"], "loss_weights": [1.6, -0.6]},
    ),
}


@pytest.mark.parametrize("case", sorted(DPO_CASES))
def test_dpo_equals_trl(trl, tokenizer, tmp_path, case):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    ours_kw, trl_kw = DPO_CASES[case]
    policy = tiny_llama(len(tokenizer))
    ref = perturbed(policy)
    our_policy, our_ref = copy.deepcopy(policy), copy.deepcopy(ref)
    theirs = DPOTrainer(
        model=policy, ref_model=ref, args=_trl_config(DPOConfig, tmp_path, per_device_train_batch_size=4, **trl_kw),
        train_dataset=Dataset.from_list(PAIRS), processing_class=tokenizer,
    )  # fmt: skip
    rows = [theirs.train_dataset[i] for i in range(len(PAIRS))]
    trl_batch = theirs.data_collator(rows)
    trl_loss = theirs.compute_loss(theirs.model, trl_batch)
    trl_loss.backward()
    trl_metrics = {k: v[-1] for k, v in theirs._metrics["train"].items()}

    pairs = [{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in rows]
    ours = PreferenceTrainer(our_policy, ortlab_args(tmp_path, **ours_kw), ref_model=our_ref, train_dataset=pairs)
    assert ours.reference == "model"
    batch = ours.data_collator(pairs)
    assert torch.equal(batch["input_ids"], trl_batch["input_ids"])
    assert torch.equal(batch["labels"], trl_batch["input_ids"].masked_fill(trl_batch["completion_mask"] == 0, IGNORE))
    loss = ours.compute_loss(our_policy, batch)
    loss.backward()
    metrics = {k: v[-1] for k, v in ours._metrics["train"].items()}

    keys = [
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
    ]
    diffs = {"loss": abs(loss.item() - trl_loss.item()), "grad": max_grad_diff(grads(our_policy), grads(policy))}
    diffs.update(_close(metrics, trl_metrics, keys))
    print(f"DPO {case} vs TRL: max abs differences {diffs}")
    assert diffs["loss"] <= TOL and diffs["grad"] <= TOL, diffs
    assert abs(metrics["rewards/chosen"]) > 1e-3  # the reference differs: the rewards are not trivially zero


def test_dpo_loss_from_its_definition():
    """The pure function on hand-made numbers: DPO's eq. 7, cDPO, and IPO's per-token form."""
    c, r, rc, rr = (
        torch.tensor([-3.0, -5.0]),
        torch.tensor([-4.0, -2.0]),
        torch.tensor([-3.5, -4.0]),
        torch.tensor([-3.0, -3.0]),
    )
    d = 0.5 * ((c - rc) - (r - rr))
    out = dpo_loss(c, r, rc, rr, beta=0.5)
    assert torch.allclose(out.losses, torch.log1p(torch.exp(-d)))
    assert torch.allclose(out.chosen_rewards, 0.5 * (c - rc)) and torch.allclose(out.rejected_rewards, 0.5 * (r - rr))
    smooth = dpo_loss(c, r, rc, rr, beta=0.5, label_smoothing=0.1).losses
    assert torch.allclose(smooth, 0.9 * torch.log1p(torch.exp(-d)) + 0.1 * torch.log1p(torch.exp(d)))
    n_c, n_r = torch.tensor([2, 4]), torch.tensor([1, 2])
    ipo = dpo_loss(c, r, rc, rr, beta=0.5, ipo=True, chosen_lengths=n_c, rejected_lengths=n_r).losses
    assert torch.allclose(ipo, ((c - rc) / n_c - (r - rr) / n_r - 1.0) ** 2)
    with pytest.raises(ValueError, match="chosen_lengths"):
        dpo_loss(c, r, rc, rr, ipo=True)


def test_sequence_logps_shift_and_mask():
    logits = torch.randn(2, 5, 7)
    labels = torch.tensor([[IGNORE, IGNORE, 3, 4, IGNORE], [IGNORE, 1, 2, 6, 0]])
    lp = logits.log_softmax(-1)
    want = torch.stack([lp[0, 1, 3] + lp[0, 2, 4], lp[1, 0, 1] + lp[1, 1, 2] + lp[1, 2, 6] + lp[1, 3, 0]])
    assert torch.allclose(sequence_logps(logits, labels), want)
    assert torch.allclose(sequence_logps(logits, labels, average=True), want / torch.tensor([2.0, 4.0]))


# --- ORPO ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_orpo_equals_trl(trl, tokenizer, tmp_path, beta):
    from datasets import Dataset
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    policy = tiny_llama(len(tokenizer), seed=3)
    our_policy = copy.deepcopy(policy)
    theirs = ORPOTrainer(
        model=policy, args=_trl_config(ORPOConfig, tmp_path, beta=beta, max_length=64, per_device_train_batch_size=4),
        train_dataset=Dataset.from_list(PAIRS), processing_class=tokenizer,
    )  # fmt: skip
    rows = [theirs.train_dataset[i] for i in range(len(PAIRS))]
    trl_loss, trl_metrics = theirs.get_batch_loss_metrics(theirs.model, theirs.data_collator(rows))
    trl_loss.backward()

    # ortlab takes TRL's rendered sequences (labels -100 over the prompt), the collator's second row shape
    keys = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")
    rendered = [{k: r[k] for k in keys} for r in rows]
    ours = PreferenceTrainer(
        our_policy, ortlab_args(tmp_path, preference_loss="orpo", beta=beta), train_dataset=rendered
    )
    assert ours.reference is None and ours.ref_model is None
    loss = ours.compute_loss(our_policy, ours.data_collator(rendered))
    loss.backward()
    metrics = {k: v[-1] for k, v in ours._metrics["train"].items()}
    names = ["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
             "logps/rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen"]  # fmt: skip
    diffs = {"loss": abs(loss.item() - trl_loss.item()), "grad": max_grad_diff(grads(our_policy), grads(policy))}
    diffs.update(_close(metrics, trl_metrics, names))
    print(f"ORPO beta={beta} vs TRL: max abs differences {diffs}")
    assert diffs["loss"] <= TOL and diffs["grad"] <= TOL, diffs


def test_orpo_loss_from_its_definition():
    c, r = torch.tensor([-0.5, -2.0]), torch.tensor([-1.0, -0.2])
    odds = lambda lp: torch.exp(lp) / (1 - torch.exp(lp))  # noqa: E731
    log_or = torch.log(odds(c) / odds(r))
    out = orpo_loss(c, r, torch.tensor(1.5), beta=0.3)
    assert torch.allclose(out.loss, 1.5 - 0.3 * torch.nn.functional.logsigmoid(log_or).mean())
    assert torch.allclose(out.extra["log_odds_chosen"], log_or.mean())


# --- KTO -------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 1.33)])
def test_kto_equals_trl(trl, tokenizer, tmp_path, weights):
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    policy = tiny_llama(len(tokenizer), seed=5)
    ref = perturbed(policy, scale=0.1, seed=6)
    our_policy, our_ref = copy.deepcopy(policy), copy.deepcopy(ref)
    config = _trl_config(
        KTOConfig, tmp_path, beta=0.1, per_device_train_batch_size=4, train_sampling_strategy="sequential",
        desirable_weight=weights[0], undesirable_weight=weights[1],
    )  # fmt: skip
    theirs = KTOTrainer(
        model=policy, ref_model=ref, args=config, train_dataset=Dataset.from_list(UNPAIRED), processing_class=tokenizer
    )
    rows = [theirs.train_dataset[i] for i in range(len(UNPAIRED))]
    trl_batch = theirs.data_collator(rows)
    trl_loss = theirs.compute_loss(theirs.model, trl_batch)
    trl_loss.backward()
    trl_metrics = {k: v[-1] for k, v in theirs._metrics["train"].items()}

    unpaired = [{k: r[k] for k in ("prompt_ids", "completion_ids", "label")} for r in rows]
    args = ortlab_args(
        tmp_path, preference_loss="kto", beta=0.1, desirable_weight=weights[0], undesirable_weight=weights[1]
    )
    ours = PreferenceTrainer(our_policy, args, ref_model=our_ref, train_dataset=unpaired)
    batch = ours.data_collator(unpaired)
    # the mismatched KL pairs are TRL's: row i's prompt with row i-1's answer
    assert torch.equal(batch["KL_input_ids"], trl_batch["KL_input_ids"])
    loss = ours.compute_loss(our_policy, batch)
    loss.backward()
    metrics = {k: v[-1] for k, v in ours._metrics["train"].items()}
    keys = ["kl", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"]
    diffs = {"loss": abs(loss.item() - trl_loss.item()), "grad": max_grad_diff(grads(our_policy), grads(policy))}
    diffs.update(_close(metrics, trl_metrics, keys))
    print(f"KTO weights={weights} vs TRL: max abs differences {diffs}, kl={metrics['kl']}")
    assert diffs["loss"] <= TOL and diffs["grad"] <= TOL, diffs
    assert metrics["kl"] > 0  # the KL estimate is exercised, not clipped to zero


def test_kto_loss_from_its_definition():
    logps, ref = torch.tensor([-2.0, -3.0, -1.0]), torch.tensor([-2.5, -2.0, -1.0])
    desirable = torch.tensor([True, False, True])
    kl = kto_kl(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.1]))
    assert kl.item() == pytest.approx(0.3)
    assert kto_kl(torch.tensor([-2.0]), torch.tensor([-1.0])).item() == 0  # clipped at zero
    out = kto_loss(logps, ref, desirable, kl, beta=2.0, undesirable_weight=1.5)
    r = logps - ref
    want = torch.cat(
        [1 - torch.sigmoid(2.0 * (r[desirable] - kl)), 1.5 * (1 - torch.sigmoid(2.0 * (kl - r[~desirable])))]
    )
    assert torch.allclose(out.losses, want) and torch.allclose(out.loss, want.mean())


# --- collators -------------------------------------------------------------------------------------------------------


def test_pair_collator_takes_pieces_or_rendered_rows_alike():
    pieces = [
        {"prompt_ids": [5, 6], "chosen_ids": [7, 2], "rejected_ids": [8, 9, 2]},
        {"prompt_ids": [5], "chosen_ids": [4], "rejected_ids": [3]},
    ]
    rendered = [
        {"chosen_input_ids": [5, 6, 7, 2], "chosen_labels": [IGNORE, IGNORE, 7, 2],
         "rejected_input_ids": [5, 6, 8, 9, 2], "rejected_labels": [IGNORE, IGNORE, 8, 9, 2]},
        {"chosen_input_ids": [5, 4], "chosen_labels": [IGNORE, 4],
         "rejected_input_ids": [5, 3], "rejected_labels": [IGNORE, 3]},
    ]  # fmt: skip
    a, b = PairCollator(0)(pieces), PairCollator(0)(rendered)
    assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "attention_mask", "labels"))
    assert a["input_ids"].tolist() == [[5, 6, 7, 2, 0], [5, 4, 0, 0, 0], [5, 6, 8, 9, 2], [5, 3, 0, 0, 0]]
    assert a["labels"][1].tolist() == [IGNORE, 4, IGNORE, IGNORE, IGNORE]
    with pytest.raises(ValueError, match="row 1: the rejected answer has no trained token"):
        PairCollator(0)([pieces[0], {"prompt_ids": [5], "chosen_ids": [4], "rejected_ids": []}])
    with pytest.raises(ValueError, match="row 0: max_length=2 cuts off the chosen answer"):
        PairCollator(0, max_length=2)(pieces)
    with pytest.raises(KeyError, match="preference row 0"):
        PairCollator(0)([{"prompt": "x"}])


def test_unpaired_collator_builds_the_mismatched_kl_batch():
    rows = [
        {"prompt_ids": [1, 2], "completion_ids": [3], "label": True},
        {"input_ids": [4, 5, 6], "labels": [IGNORE, 5, 6], "label": False},
        {"prompt_ids": [7], "completion_ids": [8, 9], "label": True},
    ]
    batch = UnpairedCollator(0)(rows)
    assert batch["label"].tolist() == [True, False, True]
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert batch["KL_input_ids"].tolist() == [[1, 2, 8, 9], [4, 3, 0, 0], [7, 5, 6, 0]]
    assert batch["KL_labels"].tolist() == [[IGNORE, IGNORE, 8, 9], [IGNORE, 3, IGNORE, IGNORE], [IGNORE, 5, 6, IGNORE]]
    assert "KL_input_ids" not in UnpairedCollator(0, kl=False)(rows)


# --- the reference: the adapter disabled (LoRA), precomputed (full) --------------------------------------------------


def test_lora_reference_is_the_base_with_the_adapter_disabled_and_no_copy(tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    base = tiny_llama(len(tokenizer), seed=7)
    pairs = [{"prompt_ids": [4, 6, 8], "chosen_ids": [11, 2], "rejected_ids": [12, 2]}] * 2
    batch = PairCollator(0)(pairs)
    with torch.no_grad():
        base_logps = sequence_logps(
            base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"]
        )
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    with torch.no_grad():  # an adapter that changes the outputs (B starts at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    params_before = {id(p) for p in model.parameters()}
    trainer = PreferenceTrainer(model, ortlab_args(tmp_path), train_dataset=pairs)
    assert trainer.reference == "adapter" and trainer.ref_model is None
    gc.collect()
    assert sum(isinstance(o, LlamaForCausalLM) for o in gc.get_objects()) == 1  # no second model anywhere
    assert {id(p) for p in trainer.model.parameters()} == params_before
    ref_logps = sequence_logps(
        trainer._reference_forward(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]),
        batch["labels"],
    )
    assert torch.allclose(ref_logps, base_logps, atol=1e-6)
    with torch.no_grad():
        policy_logps = sequence_logps(
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"]
        )
    assert (policy_logps - base_logps).abs().max() > 1e-3  # the adapter is on again afterwards
    trainer.compute_loss(trainer.model, batch).backward()
    assert all(p.grad is None for n, p in model.named_parameters() if "lora" not in n)  # fmt: skip


def test_full_model_reference_is_precomputed_once(tokenizer, tmp_path):
    model = tiny_llama(len(tokenizer), seed=9)
    pairs = [
        {"prompt_ids": [4, 6, 8], "chosen_ids": [11, 2], "rejected_ids": [12, 13, 2]},
        {"prompt_ids": [5], "chosen_ids": [7], "rejected_ids": [9]},
    ]
    trainer = PreferenceTrainer(model, ortlab_args(tmp_path), train_dataset=pairs)
    assert trainer.reference == "precomputed" and trainer.ref_model is None
    batch = trainer.data_collator(trainer.train_dataset)
    with torch.no_grad():
        want = sequence_logps(
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"]
        )
    assert torch.allclose(torch.cat([batch["ref_chosen_logps"], batch["ref_rejected_logps"]]), want, atol=1e-5)
    # before training the policy is the reference: every reward is 0 and the loss is log 2
    assert trainer.compute_loss(model, batch).item() == pytest.approx(math.log(2), abs=1e-6)
    # pairs given to evaluate() are scored before training; after it, the reference is gone: a clear error
    assert trainer.evaluate(eval_dataset=pairs)["eval_loss"] == pytest.approx(math.log(2), abs=1e-6)
    trainer.state.global_step = 1
    with pytest.raises(ValueError, match="training has started, so new pairs cannot be scored"):
        trainer.evaluate(eval_dataset=[dict(p) for p in pairs])
    with pytest.raises(ValueError, match="its rows were not scored before training"):
        trainer.compute_loss(model, trainer.data_collator(pairs))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"preference_loss": "simpo"}, "preference_loss='simpo': one of"),
        ({"reference": "twin"}, "reference='twin': one of"),
        ({"label_smoothing": 0.5}, r"label_smoothing=0.5: in \[0, 0.5\)"),
        ({"label_smoothing": 0.1, "preference_loss": "ipo"}, "applies to preference_loss='dpo', not 'ipo'"),
        ({"beta": 0.0}, "beta=0.0: must be above 0"),
        ({"orpo_nll": "prompt"}, "orpo_nll='prompt'"),
    ],
)
def test_arguments_refuse_what_cannot_train(tmp_path, kw, message):
    with pytest.raises(ValueError, match=message):
        ortlab_args(tmp_path, **kw)


def test_reference_choices_that_cannot_work_are_refused(tokenizer, tmp_path):
    pairs = [{"prompt_ids": [4], "chosen_ids": [5], "rejected_ids": [6]}]
    rows = [{"prompt_ids": [4], "completion_ids": [5], "label": True}]
    cases = [
        ({"reference": "adapter"}, pairs, "needs a peft \\(LoRA\\) model"),
        ({"reference": "model"}, pairs, "needs ref_model="),
        ({"reference": "precomputed", "preference_loss": "kto"}, rows, "cannot be precomputed"),
    ]
    for kw, data, message in cases:
        with pytest.raises(ValueError, match=message):
            PreferenceTrainer(tiny_llama(len(tokenizer)), ortlab_args(tmp_path, **kw), train_dataset=data)
    kto = PreferenceTrainer(
        tiny_llama(len(tokenizer)), ortlab_args(tmp_path, preference_loss="kto"), train_dataset=rows
    )
    assert kto.reference == "copy" and kto.ref_model is not kto.model
    assert all(not p.requires_grad for p in kto.ref_model.parameters())


def test_bf16_logits_are_scored_in_float32_row_by_row():
    logits = torch.randn(3, 6, 50)
    labels = torch.tensor([[IGNORE, IGNORE, 3, 4, 5, IGNORE], [IGNORE, 1, 2, 6, 0, 9], [IGNORE] * 4 + [7, 8]])
    want = sequence_logps(logits.bfloat16().float(), labels)
    got = sequence_logps(logits.bfloat16(), labels)
    assert got.dtype == torch.float32 and torch.allclose(got, want, atol=1e-5)


# --- a real (tiny) training run ------------------------------------------------------------------------------------


def test_dpo_training_raises_preference_accuracy(tokenizer, tmp_path):
    """A few DPO steps on the tiny model: the loss falls from log 2 and the chosen answers' reward overtakes the
    rejected ones' on the training pairs; the metrics reach the stream's step records and the eval logs."""
    model = tiny_llama(len(tokenizer), seed=11)
    ids = tokenizer.convert_tokens_to_ids
    pairs = [
        {"prompt_ids": ids(p.split()), "chosen_ids": [*ids(c.split()), 2], "rejected_ids": [*ids(r.split()), 2]}
        for p, c, r in [
            ("what is the sky", "blue", "red"), ("is grass red", "no", "yes"), ("the cat sat on the", "mat", "log"),
            ("what is grass", "good", "bad"), ("why is the sky blue", "good answer", "bad answer"),
            ("the dog ran on the", "grass", "sky"), ("is the sky blue", "yes", "no"), ("a cat is", "good", "bad"),
        ]
    ]  # fmt: skip
    args = ortlab_args(
        tmp_path, metrics_path=None, beta=0.5, learning_rate=5e-3, max_steps=15, per_device_train_batch_size=4,
        per_device_eval_batch_size=8, logging_steps=5, seed=0, lr_scheduler_type="constant", save_strategy="no",
    )  # fmt: skip
    trainer = PreferenceTrainer(model, args, train_dataset=pairs, eval_dataset=pairs)
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    steps = [r for r in trainer.metrics_records if r.get("event") == "step"]
    assert len(steps) == 15 and all("rewards/accuracies" in r and "rewards/margins" in r for r in steps)
    # What the step records hold is declared in the run folder's schema (`ortlab.runfolder.records`).
    assert not [f for r in steps for f in unknown_fields(r)]
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)
    print("before", before, "after", after)
    assert before["eval_rewards/accuracies"] == 0.0 and after["eval_rewards/accuracies"] >= 0.875
    assert after["eval_loss"] < before["eval_loss"] - 0.2
    assert after["eval_rewards/margins"] > 0.5
    logs = [r for r in trainer.metrics_records if r.get("event") == "log" and "rewards/chosen" in r]
    assert logs, "the trainer's log lines carry the preference metrics"


# --- the acceleration mix applies to the preference trainer as to any run --------------------------------------------


@pytest.mark.parametrize("mix", ["ort", "checkpointing"])
def test_lora_dpo_trains_under_the_mix(tokenizer, tmp_path, mix):
    """LoRA DPO (the reference: its adapter disabled) under ORTModule, or with gradient checkpointing, and fused
    AdamW in both: what was asked for is verified as applied, and the step losses equal plain PyTorch's."""
    from peft import LoraConfig, get_peft_model

    pairs = [
        {"prompt_ids": [4, 6, 8], "chosen_ids": [11, 2], "rejected_ids": [12, 13, 2]},
        {"prompt_ids": [5, 9], "chosen_ids": [7], "rejected_ids": [9, 10]},
    ] * 4

    def run(**kw):
        model = get_peft_model(
            tiny_llama(len(tokenizer), seed=13), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
        )
        args = ortlab_args(
            tmp_path, metrics_path=None, max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
            save_strategy="no", seed=0, optim="adamw_ort_fused", **kw,
        )  # fmt: skip
        trainer = PreferenceTrainer(model, args, train_dataset=pairs)
        trainer.train()
        assert trainer.reference == "adapter"
        return trainer, [r["loss"] for r in trainer.metrics_records if r.get("event") == "step"]

    if mix == "ort":
        trainer, losses = run(use_ort=True)
    else:
        trainer, losses = run(use_ort=False, gradient_checkpointing=True)
    applied = {k: v.applied for k, v in trainer.accelerations.items() if v.requested}
    assert applied == (
        {"ort": True, "fused_adam": True} if mix == "ort" else {"fused_adam": True, "gradient_checkpointing": True}
    )
    _, plain = run(use_ort=False)
    assert len(losses) == 3 and losses[0] == pytest.approx(math.log(2), abs=1e-5)
    assert losses == pytest.approx(plain, abs=1e-4)
