"""`PreferenceTrainer`: DPO, IPO (and cDPO), ORPO and KTO on ortlab's `ORTTrainer`.

It overrides `compute_loss` (and `prediction_step`, so evaluation scores pairs too) and nothing of the training
loop, so the acceleration mix applies unchanged: fused AdamW, bf16, gradient checkpointing, ZeRO, ORT all act on
the one forward this trainer runs per batch (chosen and rejected padded together, `ortlab.train.preferencebatch`).
The losses are `ortlab.train.preference`'s, proved equal to TRL's by tests/test_preference_loss.py.

The reference model (DPO, IPO, KTO; ORPO has none), `reference=`:
- "adapter" (automatic with a peft model): the same model with its adapter disabled (`model.disable_adapter()`),
  which is the base model the LoRA started from: no second copy in memory, one extra forward without gradients.
- "precomputed" (the default for full fine-tuning with DPO/IPO on a map-style dataset): before training, the model
  (which is then the reference) scores every pair once; the log-probabilities are stored with the rows
  (`ref_chosen_logps`, `ref_rejected_logps`) and travel in the batches. Why the default: the reference never
  changes, so scoring it again at every step of every epoch is wasted work (about a quarter of a DPO step), and a
  frozen copy doubles the weights in memory, which under ZeRO would also have to be sharded. It costs one pass
  over the data before training, and pairs added after training has begun cannot be scored (an error says so).
- "copy": a frozen copy of the model, scored at every step; the fallback where rows cannot be annotated (an
  iterable dataset) and for KTO, whose KL pairs change with every shuffle, so they cannot be scored in advance.
- "model": the `ref_model=` passed in.
Which one ran is recorded in `trainer.reference`.

DPO, IPO and cDPO score each pair with its prompt computed once (`ortlab.train.sharedprompt`: the N prompts, then
the 2N answers on the prompts' KV cache) for the policy and for a reference that runs at every step, rather than
the 2N full rows that hold every prompt twice: the same log-probabilities, in fewer token positions. Where that is
not exact or not supported (gradient checkpointing, ORTModule, torch.compile, a model without a cache, a pair whose
two rows begin differently, `share_prompt=False`; ORPO, whose NLL may cover the prompt, and KTO, unpaired) the full
rows run, and `trainer.prompt_sharing` says why.

The metrics TRL logs (rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies, logps/chosen,
logps/rejected; ORPO's nll_loss, log_odds_ratio, log_odds_chosen; KTO's kl) go into every `step` record of the
metrics stream (averaged over the step's micro-batches) and into Trainer's logs (`log` events; `eval_`-prefixed
in evaluations, where rewards/accuracies is the held-out preference accuracy).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from ortlab.train.args import ORTTrainingArguments, checkpointing_on, checkpointing_requested
from ortlab.train.compat import accepts_optimum_era_arguments
from ortlab.train.preference import (
    IGNORE,
    PreferenceLoss,
    dpo_loss,
    kto_kl,
    kto_loss,
    kto_metric_sums,
    kto_metrics_from_sums,
    orpo_loss,
    pair_metrics,
    sequence_logps,
    token_logps,
)
from ortlab.train.preferencebatch import PairCollator, UnpairedCollator
from ortlab.train.sharedprompt import causal_lm, layout, pair_logps, unsupported
from ortlab.train.trainer import ORTTrainer

__all__ = ["LOSSES", "REFERENCES", "PreferenceTrainer", "PreferenceTrainingArguments"]

LOSSES = ("dpo", "ipo", "orpo", "kto")
REFERENCES = ("auto", "adapter", "precomputed", "copy", "model")
NO_CACHE_UNDER_CHECKPOINTING = "gradient checkpointing (transformers turns the KV cache off under it)"


@accepts_optimum_era_arguments
@dataclass
class PreferenceTrainingArguments(ORTTrainingArguments):
    """`ORTTrainingArguments` plus the preference loss and its parameters."""

    preference_loss: str = field(default="dpo", metadata={"help": f"One of {LOSSES}."})
    beta: float = field(
        default=0.1,
        metadata={
            "help": "DPO/KTO: how far the policy may move from the reference (higher: less); IPO: its tau; ORPO: "
            "the weight of the odds-ratio term (the paper's lambda, TRL's beta)."
        },
    )
    label_smoothing: float = field(
        default=0.0, metadata={"help": "DPO only (cDPO): the probability that a preference label is flipped."}
    )
    reference: str = field(default="auto", metadata={"help": f"The reference model: one of {REFERENCES}."})
    orpo_nll: str = field(
        default="sequence",
        metadata={
            "help": "ORPO's NLL term over the chosen 'sequence' (prompt and answer, as ORPO's authors and TRL do) or "
            "the 'answer' only (the assistant-only masking)."
        },
    )
    desirable_weight: float = field(default=1.0, metadata={"help": "KTO: lambda_D, the desirable answers' weight."})
    undesirable_weight: float = field(default=1.0, metadata={"help": "KTO: lambda_U, the undesirable answers' weight."})
    disable_dropout: bool = field(
        default=True, metadata={"help": "Dropout off in the policy (and a copied reference), so both score alike."}
    )
    max_length: int | None = field(default=None, metadata={"help": "Cut each sequence to this many tokens."})
    share_prompt: bool = field(
        default=True,
        metadata={
            "help": "DPO/IPO: run each pair's prompt once and both answers on its KV cache (the same numbers, less "
            "work); where it is not exact or not supported the full rows run and trainer.prompt_sharing says why."
        },
    )
    # Trainer would drop every column its model's forward does not name (prompt_ids, chosen_ids, ...).
    remove_unused_columns: bool = field(default=False, metadata={"help": "Keep the preference columns."})

    def __post_init__(self) -> None:
        if self.preference_loss not in LOSSES:
            raise ValueError(f"preference_loss={self.preference_loss!r}: one of {LOSSES}")
        if self.reference not in REFERENCES:
            raise ValueError(f"reference={self.reference!r}: one of {REFERENCES}")
        if self.orpo_nll not in ("sequence", "answer"):
            raise ValueError(f"orpo_nll={self.orpo_nll!r}: 'sequence' or 'answer'")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing={self.label_smoothing}: in [0, 0.5)")
        if self.label_smoothing and self.preference_loss != "dpo":
            raise ValueError(f"label_smoothing (cDPO) applies to preference_loss='dpo', not {self.preference_loss!r}")
        if self.beta <= 0:
            raise ValueError(f"beta={self.beta}: must be above 0")
        super().__post_init__()


def _peft_model(model: Any) -> Any:
    """The peft model inside `model` (ORT's or DDP's wrapper around it), or None."""
    for candidate in (model, getattr(model, "module", None)):
        if candidate is not None and hasattr(candidate, "disable_adapter") and hasattr(candidate, "peft_config"):
            return candidate
    return None


def _map_style(dataset: Any) -> bool:
    return dataset is not None and (isinstance(dataset, list) or hasattr(dataset, "add_column"))


class PreferenceTrainer(ORTTrainer):
    """`PreferenceTrainer(model, args=PreferenceTrainingArguments(...), train_dataset=..., processing_class=...)`.

    Rows as `ortlab.train.preferencebatch` describes them; the collator is chosen from the loss unless one is
    passed. `ref_model=` gives the reference explicitly (reference="model").
    """

    _args_class = PreferenceTrainingArguments

    def __init__(self, model: Any = None, args: Any = None, *, ref_model: Any = None, **kwargs: Any):
        from ortlab.train.trainer import _as_ort_args

        args = _as_ort_args(args, self._args_class)
        # Trainer would drop every column its model's forward does not name (prompt_ids, chosen_ids, ...).
        args.remove_unused_columns = False
        if model is not None and args.disable_dropout:
            _disable_dropout(model)
        if kwargs.get("data_collator") is None:
            pad = _pad_token_id(kwargs.get("processing_class"), model)
            if args.preference_loss == "kto":
                kwargs["data_collator"] = UnpairedCollator(pad, max_length=args.max_length)
            else:
                kwargs["data_collator"] = PairCollator(pad, max_length=args.max_length)
        super().__init__(model, args, **kwargs)
        # compute_loss returns a mean over the micro-batch: Trainer must divide it by the accumulation steps.
        self.model_accepts_loss_kwargs = False
        self.loss_is_scaled_for_ga = False
        self.method = args.preference_loss
        self._metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._step_metrics: dict[str, list[float]] = defaultdict(list)
        self.ref_model: Any = None
        self.reference = self._choose_reference(args.reference, ref_model)
        if self.reference == "copy":
            self.ref_model = _frozen_copy(self.model)
        elif self.reference == "model":
            self.ref_model = ref_model.to(self.args.device).eval().requires_grad_(False)
            if args.disable_dropout:
                _disable_dropout(self.ref_model)
        self.prompt_sharing = self._prompt_sharing_at_start()
        if self.reference == "precomputed":
            self.train_dataset = self.precompute_reference(self.train_dataset)
            if isinstance(self.eval_dataset, dict):
                self.eval_dataset = {k: self.precompute_reference(v) for k, v in self.eval_dataset.items()}
            elif self.eval_dataset is not None:
                self.eval_dataset = self.precompute_reference(self.eval_dataset)

    def _choose_reference(self, asked: str, ref_model: Any) -> str | None:
        if self.method == "orpo":
            return None
        if ref_model is not None:
            if asked not in ("auto", "model"):
                raise ValueError(f"ref_model= was passed, so reference must be 'auto' or 'model', not {asked!r}")
            return "model"
        if asked == "model":
            raise ValueError("reference='model' needs ref_model=")
        lora = _peft_model(self.model) is not None
        if asked == "adapter" and not lora:
            raise ValueError("reference='adapter' needs a peft (LoRA) model: the reference is its adapter disabled")
        if asked == "precomputed" and self.method == "kto":
            raise ValueError("KTO's KL pairs change with every batch: its reference cannot be precomputed (use 'copy')")
        if asked == "precomputed" and not _map_style(self.train_dataset):
            raise ValueError(
                "reference='precomputed' annotates the rows: it needs a datasets.Dataset or a list of rows"
            )
        if asked != "auto":
            return asked
        if lora:
            return "adapter"
        return "precomputed" if self.method != "kto" and _map_style(self.train_dataset) else "copy"

    # --- each prompt computed once (`ortlab.train.sharedprompt`) ---------------------------------------------------

    def _prompt_sharing_at_start(self) -> dict[str, Any]:
        """Whether pairs share their prompt in this run, and if not why: what is known before the first batch."""
        args = self.args
        if not args.share_prompt:
            reason = "share_prompt=False"
        elif self.method not in ("dpo", "ipo"):
            reason = f"{self.method} scores full rows (ORPO's NLL may cover the prompt; KTO's rows are unpaired)"
        elif checkpointing_requested(args):
            reason = NO_CACHE_UNDER_CHECKPOINTING
        elif args.use_ort:
            reason = "ORTModule (its exported graph has no KV cache)"
        elif args.torch_compile:
            reason = "torch.compile (the cached second forward would recompile)"
        else:
            reason = unsupported(self.model) or (unsupported(self.ref_model) if self.ref_model is not None else None)
        return {"applied": reason is None, "reason": reason, "fallback_batches": 0}

    def preference_record(self) -> dict[str, Any]:
        """What result.json says of this run's pairs: the reference that scored them and the prompt sharing."""
        return {"reference": self.reference, "prompt_sharing": dict(self.prompt_sharing)}

    def _layout(self, model: Any, inputs: dict[str, Any]) -> Any:
        """The batch as prompts and answers, or None (the full rows run; the first reason is recorded)."""
        sharing = self.prompt_sharing
        if not sharing["applied"]:
            return None
        if type(model).__name__ == "ORTModule" or hasattr(model, "_orig_mod"):
            sharing.update(applied=False, reason=f"the model runs as {type(model).__name__}")
            return None
        if checkpointing_on(causal_lm(self.model)):
            sharing.update(applied=False, reason=NO_CACHE_UNDER_CHECKPOINTING)
            return None
        found = layout(inputs["input_ids"], inputs["attention_mask"], inputs["labels"])
        if isinstance(found, str):
            sharing["fallback_batches"] += 1
            sharing["reason"] = sharing["reason"] or f"a batch ran full rows: {found}"
            return None
        return found

    def _policy_pair_logps(self, model: Any, inputs: dict[str, Any], shared: Any) -> tuple[torch.Tensor, ...]:
        found = pair_logps(model, shared) if shared is not None else None
        if found is None:
            logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False)
            found = sequence_logps(logits.logits, inputs["labels"]).chunk(2)
        return found

    def _reference_pair_logps(self, inputs: dict[str, Any], shared: Any) -> tuple[torch.Tensor, ...]:
        """The reference's (chosen, rejected) log-probabilities: its prompts once if `shared`, else the full rows."""
        found = None
        if shared is not None and self.reference != "precomputed":
            with torch.no_grad():
                if self.reference == "adapter":
                    with _peft_model(self.model).disable_adapter():
                        found = pair_logps(self.model, shared)
                else:
                    found = pair_logps(self.ref_model, shared)
        if found is None:
            logits = self._reference_forward(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
            found = sequence_logps(logits, inputs["labels"]).chunk(2)
        return found

    # --- the reference's log-probabilities ----------------------------------------------------------------------

    def _reference_forward(self, **inputs: Any) -> torch.Tensor:
        """The reference's logits (no gradients): the base with the adapter disabled, or the reference model."""
        if self.reference == "precomputed":
            raise ValueError(
                "reference='precomputed' but this batch has no ref_chosen_logps/ref_rejected_logps: its rows were not "
                "scored before training (trainer.precompute_reference(rows) does it, before the first step)"
            )
        with torch.no_grad():
            if self.reference == "adapter":
                with _peft_model(self.model).disable_adapter():
                    return self.model(**inputs, use_cache=False).logits
            return self.ref_model(**inputs, use_cache=False).logits

    def precompute_reference(self, dataset: Any) -> Any:
        """The rows with `ref_chosen_logps` / `ref_rejected_logps` added: the model as it is now (before training,
        the reference) scores each pair once, in the precision training runs in (each prompt once where pairs share
        their prompt, as in training)."""
        if dataset is None or not _map_style(dataset):
            return dataset
        rows = dataset if isinstance(dataset, list) else None
        if (rows[0] if rows else dataset[0]).get("ref_chosen_logps") is not None:
            return dataset
        if self.state.global_step > 0:
            raise ValueError(
                "reference='precomputed' scores the pairs with the model before it trains; training has started, so "
                "new pairs cannot be scored: pass them as eval_dataset at the start, or use reference='copy'"
            )
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=self.args.per_device_eval_batch_size, collate_fn=self.data_collator, shuffle=False
        )
        chosen, rejected = [], []
        was_training = self.model.training
        self.model.eval()
        try:
            for batch in loader:
                batch = {k: v.to(self.args.device) for k, v in batch.items()}
                with torch.no_grad(), self.compute_loss_context_manager():
                    c, r = self._policy_pair_logps(self.model, batch, self._layout(self.model, batch))
                chosen += c.float().cpu().tolist()
                rejected += r.float().cpu().tolist()
        finally:
            self.model.train(was_training)
        if rows is not None:
            return [
                {**row, "ref_chosen_logps": c, "ref_rejected_logps": r}
                for row, c, r in zip(rows, chosen, rejected, strict=True)
            ]
        return dataset.add_column("ref_chosen_logps", chosen).add_column("ref_rejected_logps", rejected)

    def evaluate(self, eval_dataset: Any = None, *args: Any, **kwargs: Any) -> dict[str, float]:
        """As Trainer's; pairs passed here get their reference log-probabilities first (precomputed reference)."""
        if self.reference == "precomputed" and eval_dataset is not None and not isinstance(eval_dataset, str):
            if isinstance(eval_dataset, dict):
                eval_dataset = {k: self.precompute_reference(v) for k, v in eval_dataset.items()}
            else:
                eval_dataset = self.precompute_reference(eval_dataset)
        return super().evaluate(eval_dataset, *args, **kwargs)

    # --- the losses ------------------------------------------------------------------------------------------

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch=None):
        mode = "train" if self.model.training else "eval"
        if self.method == "kto":
            out, metrics = self._kto(model, inputs)
        else:
            out, metrics = self._pairs(model, inputs)
        self._record(mode, metrics)
        return (out.loss, {"losses": out.losses}) if return_outputs else out.loss

    def _pairs(self, model: Any, inputs: dict[str, Any]) -> tuple[PreferenceLoss, dict[str, float]]:
        ids, mask, labels = inputs["input_ids"], inputs["attention_mask"], inputs["labels"]
        args = self.args
        if self.method == "orpo":
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            logps = sequence_logps(logits, labels, average=True)
            chosen, rejected = logps.chunk(2)
            half = ids.shape[0] // 2
            nll_labels = ids.masked_fill(mask == 0, IGNORE) if args.orpo_nll == "sequence" else labels
            tok, tok_mask = token_logps(logits[:half], nll_labels[:half])
            nll = -tok.sum() / tok_mask.sum().clamp(min=1)
            out = orpo_loss(chosen, rejected, nll, beta=args.beta)
        else:
            shared = self._layout(model, inputs)
            chosen, rejected = self._policy_pair_logps(model, inputs, shared)
            if "ref_chosen_logps" in inputs:
                ref_chosen = inputs["ref_chosen_logps"].to(chosen)
                ref_rejected = inputs["ref_rejected_logps"].to(chosen)
            else:
                ref_chosen, ref_rejected = self._reference_pair_logps(inputs, shared)
            lengths = (labels[:, 1:] != IGNORE).sum(-1)
            chosen_len, rejected_len = lengths.chunk(2)
            out = dpo_loss(
                chosen, rejected, ref_chosen, ref_rejected, beta=args.beta, label_smoothing=args.label_smoothing,
                ipo=self.method == "ipo", chosen_lengths=chosen_len, rejected_lengths=rejected_len,
            )  # fmt: skip
        gathered = PreferenceLoss(
            loss=out.loss,
            losses=out.losses,
            chosen_rewards=self._gather(out.chosen_rewards),
            rejected_rewards=self._gather(out.rejected_rewards),
            extra={k: self._gather(v.reshape(1)).mean() for k, v in out.extra.items()},
        )
        return out, pair_metrics(gathered, self._gather(chosen.detach()), self._gather(rejected.detach()))

    def _kto(self, model: Any, inputs: dict[str, Any]) -> tuple[PreferenceLoss, dict[str, float]]:
        ids, mask, labels = inputs["input_ids"], inputs["attention_mask"], inputs["labels"]
        desirable = inputs["label"].bool()
        kl_inputs = {"input_ids": inputs["KL_input_ids"], "attention_mask": inputs["KL_attention_mask"]}
        with torch.no_grad():
            kl_logps = sequence_logps(model(**kl_inputs, use_cache=False).logits, inputs["KL_labels"])
        logps = sequence_logps(model(input_ids=ids, attention_mask=mask, use_cache=False).logits, labels)
        if "ref_logps" in inputs:
            raise ValueError("KTO's reference is scored at every step (its KL pairs change): drop ref_logps")
        ref_kl_logps = sequence_logps(self._reference_forward(**kl_inputs), inputs["KL_labels"])
        ref_logps = sequence_logps(self._reference_forward(input_ids=ids, attention_mask=mask), labels)
        if self.accelerator.num_processes == 1:
            kl = kto_kl(kl_logps, ref_kl_logps)
        else:  # z0 over every process's batch, clipped after averaging (as TRL does)
            kl = self._gather((kl_logps - ref_kl_logps).mean().detach().reshape(1)).mean().clamp(min=0)
        args = self.args
        out = kto_loss(
            logps, ref_logps, desirable, kl, beta=args.beta,
            desirable_weight=args.desirable_weight, undesirable_weight=args.undesirable_weight,
        )  # fmt: skip
        sums = kto_metric_sums(out, logps, desirable)
        if self.accelerator.num_processes > 1:
            sums = self.accelerator.reduce(sums, reduction="sum")
        return out, kto_metrics_from_sums(sums, kl)

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        return self.accelerator.gather_for_metrics(t) if self.accelerator.num_processes > 1 else t

    # --- evaluation scores pairs as training does ---------------------------------------------------------------

    def prediction_step(self, model: Any, inputs: dict[str, Any], prediction_loss_only: bool, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    # --- the metrics: into each step record and into Trainer's logs ----------------------------------------------

    def _record(self, mode: str, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)
            if mode == "train":
                self._step_metrics[key].append(value)

    def _reset_step_counters(self) -> None:
        super()._reset_step_counters()
        if hasattr(self, "_step_metrics"):
            self._step_metrics.clear()

    def _step_extras(self) -> dict[str, float]:
        return {k: sum(v) / len(v) for k, v in self._step_metrics.items() if v}

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        prefix = "eval_" if mode == "eval" else ""
        logs.update({f"{prefix}{k}": sum(v) / len(v) for k, v in self._metrics[mode].items() if v})
        self._metrics[mode].clear()
        super().log(logs, start_time)


def _frozen_copy(model: Any) -> Any:
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


def _disable_dropout(model: Any) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def _pad_token_id(processing_class: Any, model: Any) -> int:
    """The padding id (its value never matters: padding is masked out of attention and labels)."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    for value in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "config", None), "pad_token_id", None),
    ):
        if isinstance(value, int):
            return value
    return 0
