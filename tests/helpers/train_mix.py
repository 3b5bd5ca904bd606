"""Train a tiny BERT (built here, no download) with one acceleration mix; print what happened as JSON.

The trainer tests run this in a subprocess per mix: DeepSpeed starts torch.distributed and ORTModule keeps
global state, so each mix gets a clean interpreter. Under torchrun, every rank prints its own line.

    python tests/helpers/train_mix.py --mix ort,fused_adam,zero1 --steps 30 --out DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import torch

MARKER = "TRAIN-MIX-RESULT "
SEQ, VOCAB = 16, 64


class Synthetic(torch.utils.data.Dataset):
    """Label 1 when the first token is in the lower half of the vocabulary: learnable in a few dozen steps."""

    def __init__(self, n: int, offset: int = 0):
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i + self.offset)
        ids = torch.randint(1, VOCAB, (SEQ,), generator=g)
        return {
            "input_ids": ids,
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            "labels": int(ids[0] < VOCAB // 2),
        }


class Unexportable(torch.nn.Module):
    """Uses erfcx, which has a gradient in PyTorch but no ONNX export: ORTModule must fall back (or fail)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, 2)

    def forward(self, input_ids=None, attention_mask=None, labels=None):
        h = torch.special.erfcx(self.emb(input_ids).mean(1))
        logits = self.head(h)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


def tiny_bert(seed: int):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config)


def innermost_optimizer(opt):
    while hasattr(opt, "optimizer") and opt.optimizer is not opt:
        opt = opt.optimizer
    return opt


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mix", default="")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--model", default="bert", choices=["bert", "unexportable"])
    p.add_argument("--fallback", default="warn")
    p.add_argument("--eval", action="store_true")
    a = p.parse_args()
    mix = set(filter(None, a.mix.split(",")))
    unknown = mix - {"ort", "fused_adam", "zero1", "bf16"}
    if unknown:
        sys.exit(f"unknown mix parts {unknown}")

    from ortlab import ORTTrainer, ORTTrainingArguments

    model = tiny_bert(a.seed) if a.model == "bert" else Unexportable()
    before = {n: q.detach().clone() for n, q in model.named_parameters()}
    args = ORTTrainingArguments(
        output_dir=a.out,
        metrics_path=os.path.join(a.out, "metrics.jsonl"),  # read by tests/test_trainer.py
        use_ort="ort" in mix,
        ort_fallback=a.fallback,
        optim="adamw_ort_fused" if "fused_adam" in mix else "adamw_torch",
        zero_stage=1 if "zero1" in mix else 0,
        bf16="bf16" in mix,
        max_steps=a.steps,
        per_device_train_batch_size=16,
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        logging_steps=10,
        eval_strategy="steps" if a.eval else "no",
        eval_steps=10,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=a.seed,
        data_seed=a.seed,
    )
    trainer = ORTTrainer(
        model=model,
        args=args,
        train_dataset=Synthetic(512),
        eval_dataset=Synthetic(64, offset=10_000) if a.eval else None,
        feature="sequence-classification" if a.model == "bert" else None,
    )
    trainer.train()
    trainer.save_model()
    params = dict(model.named_parameters())
    digest = hashlib.sha256()
    for name in sorted(params):
        digest.update(params[name].detach().cpu().float().numpy().tobytes())
    inner = innermost_optimizer(trainer.optimizer)
    state_numel = sum(s["exp_avg"].numel() for s in inner.state.values() if "exp_avg" in s)
    rank = int(os.environ.get("RANK", "0"))
    result = {
        "rank": rank,
        # this rank's own loss (its share of the batch), and the step's (every rank's mean) as the run records it
        "losses": [s["workers"][rank]["loss"] if "workers" in s else s["loss"] for s in trainer.step_metrics.steps],
        "step_losses": [s["loss"] for s in trainer.step_metrics.steps],
        "changed": sum(not torch.equal(before[n], q) for n, q in params.items() if q.requires_grad),
        "trainable": sum(1 for q in params.values() if q.requires_grad),
        "params_numel": sum(q.numel() for q in params.values()),
        "opt_state_numel": state_numel,
        "optimizer": type(inner).__name__,
        "weights_sha256": digest.hexdigest(),
        "accelerations": {k: v.to_dict() for k, v in trainer.accelerations.items()},
    }
    print(MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
