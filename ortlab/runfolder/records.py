"""What each record of a run's `metrics.jsonl` holds, written once: per event, its fields, their types, units and
which views draw them.

This was written down in six places that had to agree: the writer's docstring and code
(`ortlab.train.metricswriter`), the event names (`events`), the fold (`stream.RunSummary`), the workbench's chart
panels (`ortlab.ui.charts.PANELS`), the server's drawn fields (`ortlab.server.runindex.DRAWN`, whose extremes
survive its downsampling) and the sidebar's types (`extension/src/api.ts`). Now the charts' panels and the server's
drawn fields are derived from `RECORDS` here, the sidebar receives it with the spec (`GET ortlab/api/spec`,
`records`), and tests hold the writers (a real tiny run, and the writer's code path) and the fold to it.

A field's `type` is its JSON type ("int", "float", "str", "bool", "object", "list"; "float" also takes an int,
and a number may be null where JSON cannot hold it: NaN and infinities are written as null). `unit` is what its
number counts ("s", "MB", "1/s", "TFLOP/s", "fraction" of 1, "%", "bytes"); `when` says when it is written
(empty: in every record of its event). `drawn` names the views that draw it: `CHARTS` (the workbench's live
charts, one panel per step field, titled `title`; an eval field is drawn on the panel of its name without
"eval_") and `SIDEBAR` (the JupyterLab sidebar's sparklines).

A record from a run folder may still carry anything (anyone can write one): readers pass over what they do not
know. This is what ortlab writes, not what a reader may assume. Standard library only: the server sends it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ortlab.runfolder import events

CHARTS = "charts"  # the workbench's live charts (`ortlab.ui.charts`)
SIDEBAR = "sidebar"  # the JupyterLab sidebar's sparklines (and so the numbers the server's downsampling keeps)
TYPES = ("int", "float", "str", "bool", "object", "list")


@dataclass(frozen=True)
class Field:
    """One field of a record: its name, JSON type, unit, what it means, when it is written, who draws it."""

    name: str
    type: str
    unit: str = ""
    doc: str = ""
    when: str = ""  # written only then; empty: in every record of its event
    drawn: tuple[str, ...] = ()  # CHARTS, SIDEBAR
    title: str = ""  # a chart panel's title (fields drawn in CHARTS)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "drawn": list(self.drawn)}


@dataclass(frozen=True)
class Record:
    """One event's record: its fields (after the two every record has, `COMMON`). `prefix`: any other field whose
    name starts so belongs to it too (an evaluation's metrics are named by the task, `eval_*`). `open`: why the
    record may hold fields not listed (empty: it holds only these)."""

    event: str
    doc: str
    fields: tuple[Field, ...]
    prefix: str = ""
    open: str = ""

    def all_fields(self) -> tuple[Field, ...]:
        return COMMON + self.fields

    def field(self, name: str) -> Field:
        for f in self.all_fields():
            if f.name == name:
                return f
        raise KeyError(f"a {self.event!r} record has no field {name!r}")

    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.all_fields())

    def unknown(self, record: dict[str, Any]) -> list[str]:
        """The fields of `record` this schema does not name (none for an open record)."""
        if self.open:
            return []
        names = set(self.names())
        return [k for k in record if k not in names and not (self.prefix and k.startswith(self.prefix))]

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "doc": self.doc,
            "fields": [f.to_dict() for f in self.all_fields()],
            "prefix": self.prefix,
            "open": self.open,
        }


def _cuda(name: str, doc: str, **kw: Any) -> Field:
    return Field(name, "float", "MB", doc, when="on CUDA", **kw)


COMMON = (
    Field("event", "str", doc="the record's kind: one of `ortlab.runfolder.events.EVENTS`"),
    Field("time", "float", "s", "when it was written (Unix time; set by the writer if the record has none)"),
)
_STEP = Field("step", "int", doc="the optimizer step (the Trainer's global_step) the record belongs to")
_PHASE = Field("phase", "str", doc='"before" training, "during" it, or "after" it')
_ACCELERATIONS = Field(
    "accelerations", "object", doc="by acceleration name: {name, requested, applied, details} (`accel.Applied`)"
)
# Preference training's numbers, named as TRL logs them (`ortlab.train.preference`): the step's mean over its
# micro-batches. A reward is beta times the policy's log-probability of an answer minus the reference's.
_PREF = "in preference training"
_PREFERENCE = (
    Field("rewards/chosen", "float", doc="mean reward of the chosen answers", when=_PREF),
    Field("rewards/rejected", "float", doc="mean reward of the rejected answers", when=_PREF),
    Field("rewards/margins", "float", doc="mean of chosen minus rejected reward", when=_PREF),
    Field("rewards/accuracies", "float", "fraction", "pairs whose chosen reward is above the rejected", when=_PREF),
    Field("logps/chosen", "float", doc="mean log-probability of the chosen answers", when=_PREF),
    Field("logps/rejected", "float", doc="mean log-probability of the rejected answers", when=_PREF),
    Field("nll_loss", "float", doc="ORPO's language-model term on the chosen answers", when="ORPO"),
    Field("log_odds_ratio", "float", doc="ORPO's mean log odds ratio of chosen over rejected", when="ORPO"),
    Field("log_odds_chosen", "float", doc="ORPO's mean log odds of the chosen answers", when="ORPO"),
    Field("kl", "float", doc="KTO's estimate of the policy's KL divergence from the reference", when="KTO"),
)
_CHECKPOINT = Field("checkpoint", "str", doc="the checkpoint's folder")

RECORDS: dict[str, Record] = {
    r.event: r
    for r in (
        Record(
            events.TRAIN_BEGIN,
            "training starts (again, on a resume): its size and what per-step device numbers rest on",
            (
                Field("max_steps", "int", doc="the optimizer steps training will take"),
                Field("world_size", "int", doc="training processes"),
                Field(
                    "device",
                    "object",
                    doc="type, name, the peak MFU is held against (mfu, on CUDA mfu_datasheet), flops (how the "
                    "model's FLOPs are counted), attention, gradient_checkpointing; on CUDA index, capability, "
                    "tf32_matmul, memory, gpu_util (`metricswriter.device_info`)",
                ),
                _ACCELERATIONS,
            ),
        ),
        Record(
            events.STEP,
            "one optimizer step's numbers, written as the step ends (rank 0; all processes together)",
            (
                _STEP,
                Field("epoch", "float", doc="epochs done, fractional"),
                Field(
                    "loss",
                    "float",
                    doc="the step's mean training loss over its micro-batches",
                    drawn=(CHARTS, SIDEBAR),
                    title="loss (train, eval)",
                ),
                Field("learning_rate", "float", doc="the learning rate of the step's optimizer update"),
                Field("samples", "int", doc="samples the step trained on"),
                Field("tokens", "int", doc="tokens the step trained on (padding left out)"),
                Field(
                    "samples_per_s", "float", "1/s", "samples / step_time_s", drawn=(CHARTS, SIDEBAR), title="samples/s"
                ),
                Field("tokens_per_s", "float", "1/s", "tokens / step_time_s"),
                Field(
                    "step_time_s",
                    "float",
                    "s",
                    "from step begin to step end: forward, backward, optimizer (no data loading, no evaluation)",
                    drawn=(CHARTS,),
                    title="step time (s)",
                ),
                Field(
                    "peak_mem_mb",
                    "float",
                    "MB",
                    "peak memory so far (mem_kind says which)",
                    drawn=(CHARTS,),
                    title="peak memory (MB)",
                ),
                Field("mem_kind", "str", doc='"cuda_max_allocated" (the CUDA allocator) or "cpu_peak_rss"'),
                Field(
                    "model_tflops_per_s",
                    "float",
                    "TFLOP/s",
                    "the model's FLOPs (a hand count, `ortlab.flops`) / step_time_s",
                    when="where the model's FLOPs are counted",
                ),
                Field(
                    "mfu",
                    "float",
                    "fraction",
                    "model FLOP/s over this machine's measured matmul peak (`ortlab.peak`), all processes' summed",
                    when="where the model's FLOPs are counted and the peak measured",
                    drawn=(CHARTS,),
                    title="MFU (model FLOPs / measured peak)",
                ),
                Field(
                    "mfu_datasheet",
                    "float",
                    "fraction",
                    "model FLOP/s over the GPU's datasheet peak",
                    when="on CUDA, where the GPU's datasheet peak is known",
                ),
                _cuda("gpu_mem_allocated_mb", "the CUDA allocator's memory in use at the step's end"),
                _cuda(
                    "gpu_mem_reserved_mb",
                    "the CUDA allocator's reserved memory at the step's end",
                    drawn=(CHARTS,),
                    title="GPU memory reserved (MB)",
                ),
                _cuda("gpu_mem_step_peak_mb", "the CUDA allocator's peak within the step"),
                Field("gpu_util_pct", "float", "%", "GPU utilisation (NVML)", when="on CUDA, with NVML installed"),
                Field(
                    "workers",
                    "list",
                    doc="by rank: {step_time_s (s), peak_mem_mb (MB), loss (its share)}: a straggler shows",
                    when="with several processes",
                ),
                *_PREFERENCE,
            ),
        ),
        Record(
            events.EVAL,
            "one evaluation's scores: the Trainer's eval_* metrics, as the task names them",
            (
                _STEP,
                _PHASE,
                Field("epoch", "float", doc="epochs done", when="when the Trainer logs it"),
                Field("eval_loss", "float", doc="the evaluation loss", when="where the task has one", drawn=(CHARTS,)),
                Field("eval_accuracy", "float", "fraction", when="classification tasks"),
                Field("eval_f1", "float", "fraction", when="classification tasks"),
                Field("eval_exact_match", "float", "fraction", when="question answering, chat"),
                Field("eval_token_f1", "float", "fraction", when="question answering"),
                Field("eval_perplexity", "float", doc="exp(eval_loss)", when="causal language models"),
                Field("eval_runtime", "float", "s", "the evaluation's wall time"),
                Field("eval_samples_per_second", "float", "1/s"),
                Field("eval_steps_per_second", "float", "1/s"),
            ),
            prefix="eval_",
        ),
        Record(
            events.LOG,
            "the Trainer's own log line (smoothed loss, grad_norm, ...; at the end train_runtime, train_loss, ...)",
            (
                _STEP,
                Field("epoch", "float", doc="epochs done"),
                Field("loss", "float", doc="the Trainer's loss, averaged since its last log line", when="in training"),
                Field("grad_norm", "float", doc="the gradient norm before clipping", when="in training"),
                Field("learning_rate", "float", when="in training"),
                Field("train_runtime", "float", "s", when="at the end"),
                Field("train_loss", "float", when="at the end"),
                Field("train_samples_per_second", "float", "1/s", when="at the end"),
                Field("train_steps_per_second", "float", "1/s", when="at the end"),
            ),
            open="the Trainer's log line is passed on as it is: transformers decides its keys",
        ),
        Record(
            events.VERIFIED,
            "what applied, checked after the first step",
            (_STEP, _ACCELERATIONS),
        ),
        Record(
            events.ACCELERATION,
            "one acceleration that was requested and did not apply, and why",
            (
                Field("name", "str", doc="the acceleration (`ortlab.toggles` names)"),
                Field("requested", "bool"),
                Field("applied", "bool"),
                Field("details", "object", doc="how it was checked, what was found"),
                Field("message", "str", doc="what the user reads"),
            ),
        ),
        Record(
            events.PARAMETERS,
            "how many parameters train, and what the optimizer holds (after the first step)",
            (
                _STEP,
                Field("trainable", "int", doc="parameters that train (a tied embedding counted once)"),
                Field("total", "int", doc="all parameters"),
                Field("trainable_share", "float", "fraction", "trainable / total"),
                Field("optimizer_state_bytes", "int", "bytes", "tensors in the optimizer's state"),
            ),
        ),
        Record(
            events.GENERATIONS,
            "a chat model's answers to the spec's prompts, scored",
            (
                _STEP,
                _PHASE,
                Field("exact_match", "float", "fraction", "answers equal to their reference (normalized)"),
                Field("scored", "int", doc="answers that had a reference"),
                Field("items", "list", doc="the first few: {prompt, output, reference?, match?}"),
            ),
        ),
        Record(
            events.AUTO,
            "what the spec's 'auto' accelerations became, and why",
            (
                Field("resolved", "object", doc="by field: the value chosen"),
                Field("why", "str"),
                Field("tuned", "bool", doc="measured here (a tune) rather than a default"),
                Field("choice", "object", doc="the mix chosen"),
                Field("table", "list", doc="the tune's measurements", when="when tuned"),
                Field("precision_probe", "object", doc="the precision check's result", when="when one ran"),
            ),
        ),
        Record(events.RESUME, "the run went on from a checkpoint", (_STEP, _CHECKPOINT)),
        Record(events.STOPPED, "the run stopped when asked, at a checkpoint", (_STEP, _CHECKPOINT)),
        Record(
            events.RESTART,
            "Ray Train restarted the worker group",
            (
                Field("attempt", "int"),
                Field("failed_workers", "list", doc="ranks"),
                Field("reason", "str"),
                Field("resumes_from_step", "int"),
            ),
        ),
        Record(
            events.TRAIN_END,
            "the run's summary and what applied",
            (
                _STEP,
                Field("summary", "object", doc="steady throughput and warm-up (`compare.summarize`), train_time_s"),
                _ACCELERATIONS,
            ),
        ),
    )
}


def record(event: str) -> Record:
    return RECORDS[event]


def drawn(event: str, view: str) -> tuple[str, ...]:
    """The fields of `event`'s records that `view` (CHARTS, SIDEBAR) draws, in order."""
    return tuple(f.name for f in RECORDS[event].fields if view in f.drawn)


def panels() -> tuple[tuple[str, str], ...]:
    """The workbench's chart panels: (step field, title), in the order they are laid out."""
    return tuple((f.name, f.title) for f in RECORDS[events.STEP].fields if CHARTS in f.drawn)


def unknown_fields(r: dict[str, Any]) -> list[str]:
    """The fields of a record that its event's schema lacks (every field of an event it does not know)."""
    schema = RECORDS.get(r.get("event"))  # type: ignore[arg-type]
    return list(r) if schema is None else schema.unknown(r)


def record_schema() -> list[dict[str, Any]]:
    """Every event's record as JSON, in `events.EVENTS` order: what the server sends the sidebar."""
    return [RECORDS[e].to_dict() for e in events.EVENTS]
