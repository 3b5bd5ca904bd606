"""The sections of a `RunSpec` (`ortlab.spec`): model, data, hyperparameters, generation, accelerations, adapter
and target, each a strict pydantic model that refuses unknown fields, non-finite numbers, control characters in
names and YAML 1.1's yes/no booleans. What holds between sections is checked by `RunSpec` itself."""

from __future__ import annotations

import re
import reprlib
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ortlab.addresses import credentials_problem, storage_folder, storage_problem, storage_scheme
from ortlab.assets import EMBEDDED_MODEL_ID
from ortlab.tasks import NAMES
from ortlab.toggles import FIELDS, TOGGLES, TUNED_FIELDS, off_value

# The task names, from the task records (`ortlab.tasks`): a task added there is offered by the schema, and so by
# every form and the CLI.
Task = Literal[NAMES]  # type: ignore[valid-type]
TASKS: tuple[str, ...] = NAMES


# Characters no name holds (a path, a column, a Hub id, an address): C0 controls and DEL. A NUL reached the os calls
# as "embedded null byte", a newline passed into logs and status files as a line of its own.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Fields of free text, where a newline is the writer's: generation prompts.
_FREE_TEXT = frozenset({"prompts"})


class _Strict(BaseModel):
    # allow_inf_nan=False: `learning_rate: .inf` passed `gt=0` and trained on NaN losses; nan failed only by accident.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _names_have_no_control_characters(cls, value: Any, info: Any) -> Any:
        """A name with a NUL, a newline or another control character is refused with the character named, before
        it reaches a path, a log line or a status file."""
        if info.field_name in _FREE_TEXT:
            return value
        for text in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
            found = _CONTROL.search(text) if isinstance(text, str) else None
            if found:
                raise ValueError(
                    f"{bounded_repr(text)} holds a control character ({found.group()!r} at position {found.start()}): "
                    "names, paths and addresses take printable characters only"
                )
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_true_or_false(cls, value: Any, info: Any) -> Any:
        """A boolean field takes true or false, nothing else: pydantic's lax mode reads 'yes', 'on', 'off', '1', 1
        and 0 as booleans, so `packing: 'no'` or a JSON `"ort": "false"` from a hand-written file meant something
        its writer may not have, silently. (Strict bool cannot be set on `bool | 'auto'`, a union: checked here.)"""
        choices = _bool_choices(cls.model_fields[info.field_name].annotation)
        if choices is None or isinstance(value, bool) or (isinstance(value, str) and value in choices):
            return value
        allowed = ", ".join(["true", "false", *(repr(c) for c in choices)])
        allowed = " or ".join(allowed.rsplit(", ", 1))
        raise ValueError(f"write {allowed} (got {bounded_repr(value)}; 'yes', 'on', 1 and the like are not read)")


def _bool_choices(annotation: Any) -> tuple[str, ...] | None:
    """For a field that takes a boolean (`bool`, `bool | Literal['auto']`): the strings it takes besides; else
    None."""
    args = get_args(annotation) if get_args(annotation) and get_origin(annotation) is not Literal else (annotation,)
    if bool not in args:
        return None
    return tuple(c for a in args if get_origin(a) is Literal for c in get_args(a) if isinstance(c, str))


class ModelSpec(_Strict):
    name: str = Field(EMBEDDED_MODEL_ID, description="Hugging Face Hub model id, or a local model folder.")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit); ignored for folders.")


class DataSpec(_Strict):
    source: str = Field(
        "embedded:rotten-tomatoes",
        description="Hub dataset id, a local file or folder (csv, json/jsonl, parquet, txt), or embedded:NAME.",
    )
    format: Literal["auto", "csv", "json", "parquet", "text"] = Field(
        "auto", description="File format; 'auto' guesses from the file suffix."
    )
    config_name: str | None = Field(None, description="Hub dataset configuration name, if it has several.")
    train_split: str = Field("train", description="Split to train on.")
    eval_split: str | None = Field(
        None, description="Split to evaluate on; when missing, eval_fraction of the training split is held out."
    )
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="Share of the training rows held out for evaluation.")
    text_column: str | None = Field(None, description="Column with the text (tokens for token classification).")
    text_pair_column: str | None = Field(None, description="Optional second text column (sentence pairs).")
    label_column: str | None = Field(None, description="Column with the labels (tags for token classification).")
    source_column: str | None = Field(None, description="seq2seq: column with the input text (the encoder reads it).")
    target_column: str | None = Field(
        None, description="seq2seq: column with the text to produce (summary, translation, answer)."
    )
    messages_column: str | None = Field(
        None, description="causal-lm chat data: column of conversations, lists of {role, content} turns (TRL's format)."
    )
    prompt_column: str | None = Field(
        None, description="causal-lm instruction data: column with the user's prompt (TRL: prompt)."
    )
    response_column: str | None = Field(
        None, description="causal-lm instruction data: column with the answer to learn (TRL: completion)."
    )
    packing: bool = Field(
        False,
        description="causal-lm chat data: pack short examples into rows of hyper.max_length tokens (no attention "
        "across examples).",
    )
    lazy: bool = Field(
        True,
        description="Tokenize rows as training reads them, so step 1 comes in seconds at any size (false: every row "
        "before step 1, cached by datasets). Causal-lm data (raw text cut into blocks, chat data) is prepared as read "
        "when hyper.max_steps is set, else whole (epochs need the number of blocks).",
    )
    shuffle: bool = Field(
        True,
        description="Train on the rows in a seeded random order (false: in the data's order; causal-lm blocks and "
        "packed rows in the order they are cut).",
    )
    streaming: bool | Literal["auto"] = Field(
        "auto",
        description="Hub datasets: read as a stream (nothing downloaded whole). 'auto' streams those the Hub says are "
        "over 1 GB; local files are read in place either way.",
    )
    max_train_samples: int | None = Field(None, gt=0, description="Train on at most this many rows.")
    max_eval_samples: int | None = Field(None, gt=0, description="Evaluate on at most this many rows.")


class HyperSpec(_Strict):
    learning_rate: float = Field(
        1e-4, gt=0, description="Peak learning rate (AdamW); 1e-4 suits small models, 2e-5 to 5e-5 base-size ones."
    )
    epochs: float = Field(1.0, gt=0, description="Passes over the training data (ignored when max_steps is set).")
    max_steps: int | None = Field(None, gt=0, description="Stop after this many optimizer steps.")
    batch_size: int = Field(16, gt=0, description="Training batch size per process.")
    eval_batch_size: int = Field(32, gt=0, description="Evaluation batch size per process.")
    max_length: int = Field(
        128, gt=0, le=8192, description="Tokens per example, the source's for seq2seq (longer ones are truncated)."
    )
    max_target_length: int | None = Field(
        None, gt=0, le=8192, description="seq2seq: tokens per target (longer ones are truncated); default max_length."
    )
    warmup_ratio: float = Field(0.06, ge=0, lt=1, description="Share of steps with a linearly rising learning rate.")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay (not applied to biases and norms).")
    gradient_accumulation_steps: int = Field(1, gt=0, description="Micro-batches per optimizer step.")
    gradient_checkpointing: bool = Field(
        False,
        description="Keep only each layer's input and recompute the rest in the backward pass: less memory (most "
        "for LLMs and long sequences) for about one more forward pass of time. Not with ort: ORTModule runs the "
        "backward pass in its own graph, where PyTorch's recomputation does not apply.",
    )
    logging_steps: int = Field(10, gt=0, description="Steps between smoothed-loss log lines.")
    eval_steps: int | None = Field(None, gt=0, description="Evaluate every N steps (default: only at the end).")
    save_steps: int | None = Field(
        None, gt=0, description="Save a checkpoint every N steps (default: only when the run is stopped)."
    )


class GenerationSpec(_Strict):
    """How a seq2seq model is evaluated. Training never generates (teacher forcing: the loss on the target);
    evaluation can also generate, which is what the model will do in use, and is slower (one decoder pass per
    token). Generation runs in PyTorch on the trained weights, as transformers' Seq2SeqTrainer does."""

    predict_with_generate: bool = Field(
        True,
        description="seq2seq: generate at evaluation and score the text (exact match, token F1) besides the loss; "
        "off: the loss and the teacher-forced token accuracy only (faster).",
    )
    max_length: int | None = Field(
        None, gt=0, le=8192, description="seq2seq: longest generated output in tokens (default: max_target_length)."
    )
    num_beams: int = Field(1, ge=1, le=64, description="seq2seq: beams for generation (1 = greedy).")
    prompts: list[str] | None = Field(
        None,
        description="causal-lm: prompts to answer at each evaluation and at the end (default: the first eval "
        "conversations of chat data).",
    )
    num_prompts: int = Field(3, ge=0, le=50, description="causal-lm: generations kept and shown per evaluation.")
    score_examples: int = Field(
        16,
        ge=0,
        le=2000,
        description="causal-lm chat data: eval conversations whose generated answer is scored by exact match.",
    )
    max_new_tokens: int = Field(
        32, gt=0, le=2048, description="causal-lm: longest generated answer in tokens (greedy)."
    )

    def seq2seq_fields_set(self) -> bool:
        d = GenerationSpec()
        return (self.predict_with_generate, self.max_length, self.num_beams) != (
            d.predict_with_generate,
            d.max_length,
            d.num_beams,
        )

    def causal_fields_set(self) -> bool:
        d = GenerationSpec()
        return (self.prompts, self.num_prompts, self.score_examples, self.max_new_tokens) != (
            d.prompts,
            d.num_prompts,
            d.score_examples,
            d.max_new_tokens,
        )


class AccelSpec(_Strict):
    ort: bool | Literal["auto"] = Field(
        "auto",
        description="Train inside ONNX Runtime (ORTModule); 'auto' = when a measurement here found it faster "
        "(see tune).",
    )
    fused_adam: bool | Literal["auto"] = Field(
        "auto",
        description="Fused AdamW (ORT's on CUDA, torch's elsewhere); 'auto' = on where available, unless a "
        "measurement here found it slower.",
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(0, description="DeepSpeed ZeRO stage (1 shards the optimizer state).")
    precision: Literal["auto", "fp32", "fp16", "bf16"] = Field(
        "auto",
        description="Mixed precision; 'auto' = bf16/fp16 where a measurement here found it faster with the same "
        "loss (a few seconds' probe of the run's own model, cached), else fp32.",
    )
    torch_compile: bool = Field(False, description="torch.compile the model (needs a runtime with torch >= 2.7).")
    tf32: bool | Literal["auto"] = Field(
        "auto",
        description="TF32 tensor-core matmuls for the fp32 parts of training (NVIDIA Ampere or newer); 'auto' = on "
        "where the GPU has them, off elsewhere (CPUs have no TF32).",
    )
    tcmalloc: bool | Literal["auto"] = Field(
        "auto",
        description="Train with tcmalloc as the memory allocator instead of glibc's malloc (1.07-1.16x on a 2-core "
        "CPU, 12-16 % less memory); 'auto' = where it is installed and ortlab starts the training process.",
    )
    ort_fallback: Literal["warn", "error"] = Field(
        "warn", description="If ORT cannot run the model: train in PyTorch and report it ('warn'), or fail."
    )
    tune: Literal["auto", "measure", "off"] = Field(
        "auto",
        description="How the 'auto' fields are decided: 'measure' = measure the mixes on this run's model and "
        "batches first (about a minute; cached per model, shapes and machine); 'auto' = reuse such a "
        "measurement when one is cached, measure only for runs of 500+ steps, and otherwise probe the precision "
        "alone (seconds); 'off' = no measurement (PyTorch with fused AdamW, fp32).",
    )

    def auto_fields(self) -> list[str]:
        """The fields left to 'auto' that a measurement decides (the toggles that are `tuned`)."""
        return [f for f in TUNED_FIELDS if getattr(self, f) == "auto"]

    def resolved(self, choice: dict[str, Any]) -> AccelSpec:
        """'auto' replaced by `choice`: a measured one (ortlab.tune), or this machine's conservative default
        (`ortlab.accel.mix.resolve` supplies it: the spec describes, it never asks the machine); a field `choice`
        does not name is off. Explicit values are never changed."""
        update = {f: choice.get(f, off_value(f)) for f in FIELDS if getattr(self, f) == "auto"}
        if self.torch_compile and self.ort == "auto":
            update["ort"] = False  # the user asked for compile explicitly; 'auto' ORT yields
        switches = {t.field for t in TOGGLES if t.flag}
        return self.model_copy(update={f: bool(v) if f in switches else v for f, v in update.items()})


class AdapterSpec(_Strict):
    """Train an adapter instead of every weight (see `ortlab.adapters`): LoRA through peft. The base model stays
    frozen; the run folder keeps the adapter alone (a few MB), and with `save_merged` the merged model too."""

    kind: Literal["none", "lora"] = Field(
        "none", description="'lora': train LoRA adapters (peft) beside the frozen model; 'none': train every weight."
    )
    rank: int = Field(8, gt=0, le=1024, description="LoRA rank r: the width of the adapter matrices.")
    alpha: int = Field(16, gt=0, le=4096, description="LoRA alpha: the adapter's output is scaled by alpha / rank.")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the adapter's input (training only).")
    target_modules: list[str] | None = Field(
        None,
        description="Names of the Linear layers to adapt (e.g. q_proj, v_proj); default: the attention "
        "projections found from the architecture.",
    )
    save_merged: bool = Field(
        False, description="Also save the model with the adapter merged into its weights (model/merged/)."
    )

    @field_validator("target_modules")
    @classmethod
    def _module_names(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        if not names:
            raise ValueError("an empty list adapts nothing: name at least one Linear layer, or leave it unset")
        import re

        bad = [n for n in names if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", n)]
        if bad:
            raise ValueError(
                f"{bad[0][:80]!r} is not a layer name: use the last part of a module's name, e.g. q_proj "
                "(letters, digits and '_')"
            )
        return list(dict.fromkeys(names))


TRACKERS: tuple[str, ...] = ("trackio", "tensorboard", "mlflow", "wandb")


class TargetSpec(_Strict):
    python: str | None = Field(None, description="Python interpreter of another runtime to train in (default: this).")
    processes: int = Field(
        1,
        ge=1,
        le=64,
        description="Data-parallel training processes: torchrun ranks on this machine, Ray Train workers on a cluster.",
    )
    cluster: str | None = Field(
        None,
        description="Run as a job on a Ray cluster: its Jobs address (http://HOST:8265), or 'local' for the head "
        "`ortlab cluster start` starts. The mix is then checked by the cluster's doctor, not this machine's.",
    )
    gpus_per_process: float = Field(0, ge=0, le=64, description="Cluster runs: GPUs each training process asks for.")
    cpus_per_process: float = Field(1, gt=0, le=1024, description="Cluster runs: CPUs each training process asks for.")
    storage: str | None = Field(
        None,
        description="Cluster runs: where the remote run folder lives: a folder this machine and the cluster both "
        "mount, or an object store URI (s3://BUCKET/PREFIX, gs://...; credentials from each side's environment). "
        "Default for 'local': the head's own folder.",
    )
    max_failures: int = Field(
        0,
        ge=0,
        le=100,
        description="Cluster runs with several processes: how many times Ray Train restarts the workers from the "
        "run's last checkpoint after one of them fails, before the run ends failed.",
    )
    start_timeout_s: float = Field(
        300,
        gt=0,
        le=86400,
        description="Cluster runs: how long the job, or a group of its Ray Train workers, may wait for the CPUs and "
        "GPUs it asks for before the run ends failed, saying which are missing (an autoscaling cluster may need "
        "minutes to add a node).",
    )

    @field_validator("cluster")
    @classmethod
    def _cluster_address(cls, cluster: str | None) -> str | None:
        if cluster is None or cluster == "local":
            return cluster
        from urllib.parse import urlsplit

        # First: the message about a credential must not quote the address (problems are shown and logged).
        problem = credentials_problem(cluster)
        if problem:
            raise ValueError(problem)
        parts = urlsplit(cluster)
        bad = parts.path not in ("", "/") or parts.query or parts.fragment
        if parts.scheme not in ("http", "https") or not parts.hostname or bad:
            raise ValueError(
                "give a Ray Jobs address such as http://127.0.0.1:8265 (the dashboard's), or 'local' for the head "
                "that `ortlab cluster start` starts"
            )
        return cluster.rstrip("/")

    @field_validator("storage")
    @classmethod
    def _storage(cls, storage: str | None) -> str | None:
        if storage is None:
            return None
        problem = storage_problem(storage)
        if problem:
            raise ValueError(problem)
        return storage.rstrip("/") if storage_scheme(storage) else storage_folder(storage)

    @model_validator(mode="after")
    def _python_or_cluster(self) -> TargetSpec:
        if self.cluster and self.python:
            raise ValueError("python and cluster exclude each other (a cluster run uses the cluster's python)")
        if not self.cluster:
            # Each of these only means something to a Ray cluster; a local run would ignore it in silence (a
            # start_timeout_s written for a local run bounds nothing).
            fields = TargetSpec.model_fields
            cluster_only = ("storage", "gpus_per_process", "cpus_per_process", "max_failures", "start_timeout_s")
            given = [f for f in cluster_only if getattr(self, f) != fields[f].default]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: only for a cluster run (what a Ray job asks the cluster for); set "
                    "target.cluster, or leave them out for a run on this machine"
                )
        return self


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80  # each quoted value at most this long, whatever its size


def cut(text: str, limit: int = 80) -> str:
    """`text` as written (a field's name, a parser's message; the terminal's view strips what it must), at most
    `limit` characters of it."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bounded_repr(value: Any) -> str:
    """`repr(value)` cut to about 80 characters at every level, built without the whole: a value from a file may be
    a million-character string or a deep structure, and `repr(x)[:80]` would build all of it first."""
    return _REPR.repr(value)


class BudgetSpec(_Strict):
    """A run fitted to a budget at launch (`ortlab.estimator.budget.fit_budget`): the launch changes the spec as
    little as it can and writes what it changed into `fitted`; the run itself ends its training in time (its
    evaluation and save after it) should it go slower than predicted."""

    minutes: float | None = Field(
        None, gt=0, description="Wall-clock minutes for the whole run: the launch chooses max_steps to fit."
    )
    memory_gb: float | None = Field(
        None,
        gt=0,
        description="Peak memory per process in GB: the launch turns on gradient checkpointing, then halves the batch "
        "(with gradient accumulation), then shortens max_length, until the estimate fits.",
    )
    fitted: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Written by the launch: what it changed to fit the budget, and why (not an input).",
    )

    @property
    def asked(self) -> bool:
        """Is there a budget to fit (minutes, memory, or both)?"""
        return self.minutes is not None or self.memory_gb is not None

    @field_validator("fitted")
    @classmethod
    def _short_lines(cls, lines: list[str]) -> list[str]:
        # printed as the run starts (control characters are refused for every text field, by _Strict)
        if any(len(line) > 300 for line in lines):
            raise ValueError("budget.fitted: lines of at most 300 characters (ortlab writes them)")
        return lines


class PreferenceSpec(_Strict):
    """Task preference: the loss and its settings (`ortlab.train.preferencetrainer.PreferenceTrainingArguments`)."""

    loss: Literal["dpo", "ipo", "orpo", "kto"] = Field(
        "dpo",
        description="dpo (sigmoid), ipo, orpo (no reference model) or kto (answers labelled good or bad, unpaired).",
    )
    beta: float = Field(
        0.1,
        gt=0,
        description="DPO/KTO: how far the model may move from the reference (higher: less); IPO: its tau; ORPO: the "
        "weight of the odds-ratio term.",
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="DPO only (cDPO): the probability that a preference label is flipped."
    )
    reference: Literal["auto", "adapter", "precomputed", "copy"] = Field(
        "auto",
        description="The reference model: auto (with LoRA the base with the adapter off, else log-probabilities "
        "precomputed once; a frozen copy for KTO), adapter, precomputed or copy.",
    )

    @model_validator(mode="after")
    def _smoothing_is_dpo(self) -> PreferenceSpec:
        if self.label_smoothing and self.loss != "dpo":
            raise ValueError(f"preference.label_smoothing: cDPO applies to loss dpo, not {self.loss}; remove it")
        return self
