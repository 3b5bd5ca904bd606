"""`ORTTrainingArguments`: `transformers.TrainingArguments` plus the acceleration mix.

Drop-in for Optimum's class of the same name: `optim="adamw_ort_fused"` (or `ORTOptimizerNames.ADAMW_ORT_FUSED`),
Optimum's own fields (`save_onnx`, `onnx_prefix`, `onnx_log_level`, `use_module_with_loss`) and the fields
transformers 5 removed that Optimum-era scripts still pass (`logging_dir`, `evaluation_strategy`, ...: see
`ortlab.train.compat`) are accepted, and by default the model trains inside ORTModule. Every rule about which
accelerations combine is checked here, when the arguments are built, i.e. before a model is trained (and, from a
RunSpec, before it is even loaded).
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, field

from transformers import TrainingArguments

from ortlab.accel import mix as mix_rules
from ortlab.accel import zero
from ortlab.accel.ort import ORTOptions
from ortlab.toggles import field_values_from
from ortlab.train.compat import OptimumEraFields, ORTOptimizerNames, accepts_optimum_era_arguments

__all__ = ["ORT_FUSED", "ORTOptimizerNames", "ORTTrainingArguments"]

logger = logging.getLogger("ortlab")

ORT_FUSED = ORTOptimizerNames.ADAMW_ORT_FUSED.value
METRICS_FILE = "ortlab_metrics.jsonl"  # in logging_dir, when one is given (see ORTTrainingArguments.metrics_file)


@accepts_optimum_era_arguments
@dataclass
class ORTTrainingArguments(OptimumEraFields, TrainingArguments):
    # A plain string, as Optimum declared it, so that `--optim adamw_ort_fused` passes HfArgumentParser (which
    # limits an enum-typed field to transformers' own names); transformers checks every other name as usual.
    optim: str = field(
        default=TrainingArguments.optim,
        metadata={"help": f"The optimizer: {ORT_FUSED!r} (ORT's fused AdamW, Optimum's name) or a transformers name."},
    )
    use_ort: bool = field(
        default=True,
        metadata={"help": "Train the model inside ONNX Runtime's ORTModule (the point of ORTTrainer)."},
    )
    ort_fallback: str = field(
        default="warn",
        metadata={
            "help": "What to do when ORTModule cannot run the model and would train it in PyTorch instead: "
            "'warn' (train on in PyTorch, reported loudly and recorded as not applied) or 'error' (fail)."
        },
    )
    ort_log_level: str = field(
        default="WARNING", metadata={"help": "ORTModule's log level: VERBOSE, INFO, WARNING, ERROR or FATAL."}
    )
    ort_save_onnx_path: str | None = field(
        default=None, metadata={"help": "Folder to save ORTModule's exported training graphs in (for inspection)."}
    )
    ort_check_forward: bool = field(
        default=True,
        metadata={
            "help": "Before ORT's first step, run one eager forward on the first batch (undone afterwards) and fall "
            "back to PyTorch if forward draws from Python's random/NumPy or changes buffers or attributes, which an "
            "exported graph would freeze. Turn off only for an effect you know is harmless."
        },
    )
    save_onnx: bool = field(
        default=False,
        metadata={
            "help": "Optimum's switch for keeping ORTModule's exported graphs: saves them in "
            "$ORTMODULE_SAVE_ONNX_PATH, else in output_dir (sets ort_save_onnx_path)."
        },
    )
    onnx_prefix: str | None = field(
        default=None, metadata={"help": "File name prefix of the saved ORTModule graphs (Optimum's name)."}
    )
    ort_memory_opt_level: int = field(
        default=0,
        metadata={"help": "ORTModule memory optimizer: 0 off, 1 layer-wise recompute, 2 also recompute compromised."},
    )
    fused_adam: bool = field(
        default=False,
        metadata={
            "help": f"Use the best fused AdamW of this runtime (set by optim={ORT_FUSED!r}): ORT's FusedAdam on "
            "CUDA, torch's AdamW(fused=True) elsewhere."
        },
    )
    tcmalloc: bool = field(
        default=False,
        metadata={
            "help": "This process was started with tcmalloc as its allocator (LD_PRELOAD; ortlab's launchers do it "
            "where it is installed): the trainer verifies it is loaded and reports it if not."
        },
    )
    zero_stage: int = field(
        default=0,
        metadata={
            "help": "DeepSpeed ZeRO stage (1: shard optimizer state). ortlab builds the DeepSpeed config from these "
            "arguments; pass `deepspeed=` instead to use your own."
        },
    )
    metrics_path: str | None = field(
        default=None,
        metadata={
            "help": "Append-only JSON-lines file for per-step metrics. By default never in output_dir (which holds "
            "only what transformers writes): <logging_dir>/ortlab_metrics.jsonl when logging_dir is given, else kept "
            "in memory (trainer.metrics_records). '' writes no stream at all."
        },
    )
    ortlab_config: dict | str | None = field(
        default=None,
        metadata={
            "help": "ortlab's description of the run (its spec, the mix it asked for and, after the first step, the "
            "mix that applied): experiment trackers record it with the run's config (see ortlab.trackers)."
        },
    )
    metrics_warmup_steps: int = field(
        default=2,
        metadata={"help": "Steps counted as warm-up (ORT export, graph build, allocator) in throughput summaries."},
    )

    def __post_init__(self) -> None:
        if self.save_onnx and not self.ort_save_onnx_path:
            self.ort_save_onnx_path = os.environ.get("ORTMODULE_SAVE_ONNX_PATH") or self.output_dir
        if str(getattr(self.optim, "value", self.optim)) == ORT_FUSED:
            # transformers validates `optim` against its own names; the fused choice is ortlab's (see fused_adam).
            self.fused_adam = True
            self.optim = "adamw_torch_fused"
        user_stage = zero.stage_of(self.deepspeed) if self.deepspeed else 0
        if self.deepspeed and self.zero_stage and self.zero_stage != user_stage:
            raise mix_rules.MixError(
                [f"zero_stage={self.zero_stage} but the DeepSpeed config says stage {user_stage}: set only one"]
            )
        self.zero_stage = self.zero_stage or user_stage
        self.ort_options  # noqa: B018 -- validates the ORT options early
        # Every combination rule, before anything is set up (no process group, no model).
        for warning in mix_rules.validate(self.mix):
            warnings.warn(warning, stacklevel=3)
            logger.warning(warning)
        self._configure_processes()
        super().__post_init__()
        self._count_cpu_deepspeed_processes()

    def _configure_processes(self) -> None:
        if self.zero_stage and not self.deepspeed:
            self.deepspeed = zero.deepspeed_config(self.zero_stage)
        import torch

        cuda = torch.cuda.is_available() and not self.use_cpu
        if self.deepspeed:
            zero.ensure_process_group_env()
        elif not cuda:
            # Without a GPU, say so: Accelerate only shards data across CPU processes with use_cpu, and
            # transformers refuses bf16 on CPU without it.
            self.use_cpu = True

    def _count_cpu_deepspeed_processes(self) -> None:
        """Work around Accelerate (1.15) starting DeepSpeed on CPU without naming a backend: it then records
        one process, and every rank would train on the same batches. Count the processes DeepSpeed started."""
        import torch.distributed as dist

        state = self.distributed_state
        if not self.deepspeed or state is None or state.backend is not None:
            return
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            state.backend = dist.get_backend()
            state.num_processes = dist.get_world_size()
            state.process_index = dist.get_rank()
            state.local_process_index = int(os.environ.get("LOCAL_RANK", dist.get_rank()))

    @property
    def metrics_file(self) -> str | None:
        """Where the metrics stream is written: `metrics_path` when given (a run folder's file); else beside
        Trainer's own logs, in `logging_dir`, when the script names one; else nowhere (the trainer keeps it in
        memory). Never in output_dir: transformers' own tests and users' scripts count what is there."""
        if self.metrics_path is not None:
            return self.metrics_path or None
        logging_dir = getattr(self, "logging_dir", None)  # Optimum-era field, set after __post_init__ (compat)
        return os.path.join(logging_dir, METRICS_FILE) if logging_dir else None

    @property
    def ort_options(self) -> ORTOptions:
        return ORTOptions(
            log_level=self.ort_log_level,
            save_onnx_path=self.ort_save_onnx_path,
            memory_opt_level=self.ort_memory_opt_level,
            fallback=self.ort_fallback,
            onnx_prefix=self.onnx_prefix or "ortlab",
        )

    @property
    def mix(self) -> mix_rules.Mix:
        ds = self.deepspeed
        if isinstance(ds, str):
            import json
            from pathlib import Path

            ds = json.loads(Path(ds).read_text())
        # What these arguments ask for, read back by the toggles' own mapping (`ortlab.toggles.field_values_from`).
        return mix_rules.mix_from(
            field_values_from(self),
            processes=int(os.environ.get("WORLD_SIZE", "1")),
            use_cpu=bool(self.use_cpu),
            deepspeed_defines_optimizer=bool(isinstance(ds, dict) and "optimizer" in ds),
        )


# Gradient checkpointing has two spellings across transformers 5: `activation_checkpointing` (+ `_kwargs`) since
# 5.23 (5.22 lacks it), `gradient_checkpointing` before (a deprecated alias after, to be removed in v6); the
# model's flag likewise (`is_activation_checkpointing` / `is_gradient_checkpointing`). These three functions are the
# only places ortlab names either, so every transformers 5 that pyproject.toml accepts gets the name it knows,
# without a deprecation warning on the newer ones.
def checkpointing_arguments(enabled: bool, kwargs: dict | None = None) -> dict:
    """The TrainingArguments keywords that switch gradient checkpointing on (or off), in the installed
    transformers' spelling (read from its dataclass fields)."""
    from dataclasses import fields

    names = {f.name for f in fields(TrainingArguments)}
    prefix = "activation" if "activation_checkpointing" in names else "gradient"
    return {f"{prefix}_checkpointing": enabled, f"{prefix}_checkpointing_kwargs": kwargs}


def checkpointing_requested(args: TrainingArguments) -> bool:
    """Whether these arguments ask for gradient checkpointing, by either spelling."""
    return bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None))


def checkpointing_on(model: object) -> bool:
    """The model's own flag that gradient checkpointing is switched on, by either spelling."""
    flag = getattr(model, "is_activation_checkpointing", None)
    if flag is None:
        flag = getattr(model, "is_gradient_checkpointing", False)
    return bool(flag)
