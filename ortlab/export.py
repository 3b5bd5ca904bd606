"""Export a finished run's model to ONNX for inference, and prove it: parity with PyTorch, and latency.

Optimum's ORTTrainer could only dump *training* graphs; what ships is an inference model. ortlab exports the
trained model with its task head (dynamic batch and sequence axes), runs it with onnxruntime on the run's own
eval samples next to PyTorch, and reports the largest absolute difference of the logits and how often the
predictions agree. An export whose parity check fails says so and is not marked good (`export.json`:
`"good": false`). Optionally, ORT's graph optimizations and dynamic int8 quantization, with the accuracy change.

    <run>/onnx/model.onnx           the exported model (opset 17)
    <run>/onnx/model.opt.onnx       with ORT graph optimizations applied offline (--optimize)
    <run>/onnx/model.int8.onnx      dynamic int8 quantization of the weights (--quantize)
    <run>/onnx/export.json          parity, agreement, latency, and which files are good

A seq2seq (encoder-decoder) model is exported as two graphs, `encoder_model.onnx` (input_ids, attention_mask ->
encoder_hidden_states) and `decoder_model.onnx` (decoder_input_ids, encoder_hidden_states, encoder_attention_mask
-> logits), without past key values: generation is a loop around the decoder, so the encoder runs once per input
and the decoder once per generated token (`greedy_generate` is that loop in ONNX Runtime). Its parity check is
twofold: the teacher-forced logits against PyTorch's, and the greedy-generated tokens against PyTorch's
`generate(num_beams=1)` on the same inputs (`generation_agreement`: the share of sequences equal token for
token). Latency is that of greedy generation, PyTorch's `generate` against the ONNX loop.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ortlab import safeio
from ortlab.data import load_and_check, tokenize
from ortlab.errors import OrtlabError
from ortlab.runfolder.rundir import RunDir
from ortlab.spec import RunSpec
from ortlab.train.terminal import captured_output, no_progress_bars

# A float32 export of the same graph differs from PyTorch by rounding only; more than this is a broken export.
MAX_ABS_DIFF = 1e-3
MIN_AGREEMENT = 0.99


class ExportError(OrtlabError, RuntimeError):
    """The run cannot be exported (not finished, no model); the message says why."""


@dataclass
class Variant:
    """One ONNX file and how it compares with PyTorch on the eval samples."""

    file: str
    max_abs_diff: float
    agreement: float
    accuracy: float | None
    latency_ms: dict[str, float]
    good: bool
    generation_agreement: float | None = None  # seq2seq: share of greedy outputs equal to PyTorch's


@dataclass
class ExportReport:
    run_dir: str
    task: str
    samples: int
    pytorch_latency_ms: dict[str, float]
    pytorch_accuracy: float | None
    variants: dict[str, Variant] = field(default_factory=dict)
    generation: dict[str, Any] | None = None  # seq2seq: how the generation check was run

    @property
    def good(self) -> bool:
        return bool(self.variants) and self.variants["fp32"].good

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "good": self.good}


def _logits_only(model: Any) -> Any:
    """`model` as export should see it: tensors in, logits out (no dicts, no cache)."""
    import torch

    class LogitsOnly(torch.nn.Module):
        def __init__(self, inner: Any):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True
            ).logits

    return LogitsOnly(model)


def _eval_batch(run: Any, tokenizer: Any, n: int) -> tuple[dict[str, Any], Any]:
    """Up to `n` eval rows of the run's own data, tokenized and padded, and their labels (or None)."""
    import torch

    spec = RunSpec.from_run(run)
    prepared = load_and_check(spec.data, spec.task, spec.seed)
    if spec.task != "causal-lm":  # causal LM rows are lines, packed into blocks: select after tokenizing
        prepared.eval = prepared.eval.select(range(min(n, len(prepared.eval))))
    prepared.train = prepared.eval  # tokenize() works on both splits; only eval is used here
    _, evaluation = tokenize(prepared, tokenizer, spec.task, spec.hyper.max_length, spec.hyper.max_target_length)
    rows = [evaluation[i] for i in range(min(n, len(evaluation)))]
    padded = tokenizer.pad([{k: r[k] for k in ("input_ids", "attention_mask")} for r in rows], return_tensors="pt")
    labels = None
    if spec.task != "causal-lm":
        width = padded["input_ids"].shape[1]
        if spec.task == "seq2seq":  # the target's own length, padded with -100 as the training collator does
            width = max(len(r["labels"]) for r in rows)
        if spec.task == "sequence-classification":
            labels = torch.tensor([r["labels"] for r in rows])
        else:
            labels = torch.tensor([r["labels"] + [-100] * (width - len(r["labels"])) for r in rows])
    return {"input_ids": padded["input_ids"], "attention_mask": padded["attention_mask"]}, labels


def _agreement(a: Any, b: Any, mask: Any, task: str) -> float:
    same = a.argmax(-1) == b.argmax(-1)
    if task == "sequence-classification":
        return float(same.float().mean())
    m = mask.bool()
    return float(same[m].float().mean())


def _accuracy(logits: Any, labels: Any) -> float | None:
    if labels is None:
        return None
    preds = logits.argmax(-1)
    keep = labels != -100
    return float((preds[keep] == labels[keep]).float().mean())


def _publish(run: Any, tmp: Path, report: ExportReport) -> None:
    """Write the report and put `tmp` in place of <run>/onnx: the folder appears whole, with its report, or not at
    all; a previous export stays in place until the new one is complete (moved aside, then removed), so a failed
    re-export loses nothing."""
    (tmp / "export.json").write_text(safeio.dumps(report.to_dict(), indent=2))  # NaN diffs as null: valid JSON
    out = run.path / "onnx"
    old = out.with_name(f".onnx-old-{os.getpid()}")
    if os.path.lexists(out):  # a planted link at onnx/ is moved aside like a folder, never followed
        out.rename(old)
    tmp.rename(out)
    if old.is_symlink():
        old.unlink()
    else:
        shutil.rmtree(old, ignore_errors=True)


def _time_ms(fn: Any, repeats: int = 10) -> float:
    fn()  # warm-up (allocations, first-run kernel selection)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def export_onnx(
    run: Any, samples: int = 64, optimize: bool = False, quantize: bool = False, batch_sizes: tuple[int, ...] = (1, 16)
) -> ExportReport:
    """Export `run` (a Run, RunDir or run folder) to ONNX, check parity and latency; write <run>/onnx/.

    What torch, onnxruntime and DeepSpeed print meanwhile (tracer warnings, CUDA notes) goes to the run's
    logs/run.log, not to the notebook or the terminal: the report says what matters."""

    folder = RunDir(getattr(run, "path", run))
    if not folder.path.is_dir():
        return _export_onnx(run, samples, optimize, quantize, batch_sizes)  # not a run: it says so
    with captured_output(folder.log_path), no_progress_bars():
        return _export_onnx(run, samples, optimize, quantize, batch_sizes)


def _export_onnx(run: Any, samples: int, optimize: bool, quantize: bool, batch_sizes: tuple[int, ...]) -> ExportReport:
    import numpy as np
    import onnxruntime as ort
    import torch

    from ortlab.tasks import load_model, load_tokenizer

    run = RunDir(getattr(run, "path", run))
    status = run.status()
    adapter = (run.model_dir / "adapter_config.json").exists()
    if status.get("state") != "completed" or not ((run.model_dir / "config.json").exists() or adapter):
        raise ExportError(f"run {run.id} is {status.get('state')}: only a completed run has a model to export")
    if foreign := run.model_not_own():
        raise ExportError(
            f"run {run.id}: {', '.join(foreign)}. Export loads only the run folder's own regular files (a link "
            "would have it read, and write into onnx/, any file of this machine): replace each with the file itself"
        )
    spec = RunSpec.from_run(run)
    result = run.result() or {}
    tokenizer = load_tokenizer(str(run.model_dir))
    if adapter:
        # An adapter run exports the model it trained: the base with the adapter merged into its weights (ONNX
        # Runtime has no notion of an adapter). model/merged/ when the run saved it, else merged here.
        merged_dir = run.model_dir / "merged"
        if (merged_dir / "config.json").exists():
            model = load_model(str(merged_dir), spec.task, result.get("label_names") or [])
        else:
            from ortlab.adapters import load_merged

            model = load_merged(str(run.model_dir), spec.task, result.get("label_names") or [])
    else:
        model = load_model(str(run.model_dir), spec.task, result.get("label_names") or [])
    model.eval()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")  # exports on every opset; SDPA's export varies with versions
    inputs, labels = _eval_batch(run, tokenizer, samples)
    if spec.task == "seq2seq":
        tmp = Path(tempfile.mkdtemp(prefix=".onnx-", dir=run.path))
        try:
            report = _export_seq2seq(run, spec, model, inputs, labels, tmp, optimize, quantize, batch_sizes)
            _publish(run, tmp, report)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return report
    wrapper = _logits_only(model).eval()

    tmp = Path(tempfile.mkdtemp(prefix=".onnx-", dir=run.path))
    try:
        fp32 = tmp / "model.onnx"
        with torch.no_grad():
            torch.onnx.export(
                wrapper,
                (inputs["input_ids"][:2], inputs["attention_mask"][:2]),
                str(fp32),
                input_names=["input_ids", "attention_mask"],
                output_names=["logits"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "sequence"},
                    "attention_mask": {0: "batch", 1: "sequence"},
                    "logits": {0: "batch", 1: "sequence"} if spec.task != "sequence-classification" else {0: "batch"},
                },
                opset_version=17,
                dynamo=False,
            )
            reference = wrapper(**inputs)

        def pytorch_call(batch: dict[str, Any]):
            with torch.no_grad():
                return wrapper(**batch)

        def subset(n: int) -> dict[str, Any]:
            return {k: v[:n] for k, v in inputs.items()}

        sizes = [b for b in batch_sizes if b <= len(inputs["input_ids"])]
        report = ExportReport(
            run_dir=str(run.path),
            task=spec.task,
            samples=len(inputs["input_ids"]),
            pytorch_latency_ms={f"batch_{b}": _time_ms(lambda b=b: pytorch_call(subset(b))) for b in sizes},
            pytorch_accuracy=_accuracy(reference, labels),
        )
        files = {"fp32": fp32}
        if optimize:
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.optimized_model_filepath = str(tmp / "model.opt.onnx")
            ort.InferenceSession(str(fp32), options, providers=["CPUExecutionProvider"])
            files["optimized"] = tmp / "model.opt.onnx"
        if quantize:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantize_dynamic(str(fp32), str(tmp / "model.int8.onnx"), weight_type=QuantType.QInt8)
            files["int8"] = tmp / "model.int8.onnx"

        feeds = {k: v.numpy().astype(np.int64) for k, v in inputs.items()}
        for name, path in files.items():
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            logits = torch.from_numpy(session.run(["logits"], feeds)[0])
            diff = float((logits - reference).abs().max())
            agreement = _agreement(logits, reference, inputs["attention_mask"], spec.task)
            latency = {
                f"batch_{b}": _time_ms(lambda b=b, s=session: s.run(["logits"], {k: v[:b] for k, v in feeds.items()}))
                for b in sizes
            }
            # int8 changes the numbers on purpose: it is judged by agreement, the fp32 files by both.
            good = agreement >= MIN_AGREEMENT and (name == "int8" or diff <= MAX_ABS_DIFF)
            report.variants[name] = Variant(path.name, diff, agreement, _accuracy(logits, labels), latency, good)

        _publish(run, tmp, report)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return report


# --- encoder-decoder models --------------------------------------------------------------------------------------


def _encoder_decoder_graphs(model: Any) -> tuple[Any, Any]:
    """The encoder, and the decoder with its LM head, as modules export can trace: tensors in, one tensor out.

    The decoder is the whole model called with precomputed encoder outputs, so the model's own code applies its
    head (BART's final_logits_bias, T5's rescaling of tied embeddings, ...) and no architecture is special-cased
    here. No cache: every call sees the whole decoded prefix."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self, inner: Any):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            encoder = self.inner.get_encoder()
            return encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state

    class Decoder(torch.nn.Module):
        def __init__(self, inner: Any):
            super().__init__()
            self.inner = inner

        def forward(self, decoder_input_ids, encoder_hidden_states, encoder_attention_mask):
            return self.inner(
                encoder_outputs=(encoder_hidden_states,),
                attention_mask=encoder_attention_mask,
                decoder_input_ids=decoder_input_ids,
                use_cache=False,
                return_dict=True,
            ).logits

    return Encoder(model).eval(), Decoder(model).eval()


def greedy_generate(
    encoder: Any,
    decoder: Any,
    input_ids: Any,
    attention_mask: Any,
    decoder_start_token_id: int,
    eos_token_id: int | list[int] | None,
    pad_token_id: int,
    max_length: int,
) -> Any:
    """Greedy generation with the two exported graphs (onnxruntime InferenceSessions), on int64 numpy arrays.

    The same algorithm as transformers' `generate(num_beams=1, do_sample=False)` without logits processors:
    start from the decoder start token, append the most likely next token, pad a sequence once it has produced
    EOS, stop when every sequence has or when `max_length` tokens (the start token included) are there."""
    import numpy as np

    hidden = encoder.run(["encoder_hidden_states"], {"input_ids": input_ids, "attention_mask": attention_mask})[0]
    eos = np.asarray([] if eos_token_id is None else np.atleast_1d(eos_token_id), dtype=np.int64)
    out = np.full((input_ids.shape[0], 1), decoder_start_token_id, dtype=np.int64)
    done = np.zeros(input_ids.shape[0], dtype=bool)
    while out.shape[1] < max_length and not done.all():
        feeds = {"decoder_input_ids": out, "encoder_hidden_states": hidden, "encoder_attention_mask": attention_mask}
        logits = decoder.run(["logits"], feeds)[0]
        step = np.where(done, pad_token_id, logits[:, -1].argmax(-1)).astype(np.int64)
        out = np.concatenate([out, step[:, None]], axis=1)
        done |= np.isin(step, eos)
    return out


def _pad_to(ids: Any, width: int, pad: int) -> Any:
    import numpy as np

    return np.pad(ids, ((0, 0), (0, width - ids.shape[1])), constant_values=pad)


def _greedy_config(model: Any, max_length: int) -> Any:
    """Plain greedy decoding with the model's own special tokens and nothing else. A model's generation config can
    ask for logits processors (no_repeat_ngram_size, forced BOS/EOS, bad words, ...) that change which token wins;
    the check compares the graphs, so both sides decode plainly."""
    from transformers import GenerationConfig

    own, config = model.generation_config, model.config
    start = own.decoder_start_token_id
    if start is None:
        start = config.decoder_start_token_id
    if start is None:
        raise ExportError("the model names no decoder_start_token_id (config or generation config): set it and save")
    pad = own.pad_token_id if own.pad_token_id is not None else config.pad_token_id
    eos = own.eos_token_id if own.eos_token_id is not None else config.eos_token_id
    return GenerationConfig(
        decoder_start_token_id=start,
        bos_token_id=own.bos_token_id,
        eos_token_id=eos,
        pad_token_id=pad if pad is not None else 0,
        max_length=max_length,
        num_beams=1,
        do_sample=False,
    )


def _export_seq2seq(
    run: Any,
    spec: Any,
    model: Any,
    inputs: dict[str, Any],
    labels: Any,
    tmp: Path,
    optimize: bool,
    quantize: bool,
    batch_sizes: tuple[int, ...],
) -> ExportReport:
    import numpy as np
    import onnxruntime as ort
    import torch

    encoder, decoder = _encoder_decoder_graphs(model)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels=labels)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    max_length = spec.generation.max_length or spec.hyper.max_target_length or spec.hyper.max_length
    greedy = _greedy_config(model, max_length)
    model.generation_config = greedy  # nothing of the saved model's generation settings joins in (see above)
    with torch.no_grad():
        hidden = encoder(ids[:2], mask[:2])
        torch.onnx.export(
            encoder,
            (ids[:2], mask[:2]),
            str(tmp / "encoder_model.onnx"),
            input_names=["input_ids", "attention_mask"],
            output_names=["encoder_hidden_states"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "encoder_sequence"},
                "attention_mask": {0: "batch", 1: "encoder_sequence"},
                "encoder_hidden_states": {0: "batch", 1: "encoder_sequence"},
            },
            opset_version=17,
            dynamo=False,
        )
        torch.onnx.export(
            decoder,
            (decoder_input_ids[:2], hidden, mask[:2]),
            str(tmp / "decoder_model.onnx"),
            input_names=["decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask"],
            output_names=["logits"],
            dynamic_axes={
                "decoder_input_ids": {0: "batch", 1: "decoder_sequence"},
                "encoder_hidden_states": {0: "batch", 1: "encoder_sequence"},
                "encoder_attention_mask": {0: "batch", 1: "encoder_sequence"},
                "logits": {0: "batch", 1: "decoder_sequence"},
            },
            opset_version=17,
            dynamo=False,
        )
        reference = model(
            input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_input_ids, use_cache=False
        ).logits

    # Generation is checked on a few inputs (one decoder call per token and input); latency at the batch sizes.
    n_gen = min(8, len(ids))

    def pytorch_generate(n: int) -> Any:
        with torch.no_grad():
            return model.generate(input_ids=ids[:n], attention_mask=mask[:n], generation_config=greedy)

    expected = pytorch_generate(n_gen).numpy()
    sizes = [b for b in batch_sizes if b <= len(ids)]
    repeats = 3  # a generation is tens of model calls: fewer repeats than for one forward pass
    report = ExportReport(
        run_dir=str(run.path),
        task=spec.task,
        samples=len(ids),
        pytorch_latency_ms={f"batch_{b}": _time_ms(lambda b=b: pytorch_generate(b), repeats) for b in sizes},
        pytorch_accuracy=_accuracy(reference, labels),
        generation={
            "strategy": "greedy (num_beams=1), no logits processors",
            "max_length": max_length,
            "inputs": n_gen,
        },
    )
    files = {"fp32": ("encoder_model.onnx", "decoder_model.onnx")}
    if optimize:
        files["optimized"] = ("encoder_model.opt.onnx", "decoder_model.opt.onnx")
        for src, dst in zip(files["fp32"], files["optimized"], strict=True):
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.optimized_model_filepath = str(tmp / dst)
            ort.InferenceSession(str(tmp / src), options, providers=["CPUExecutionProvider"])
    if quantize:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        files["int8"] = ("encoder_model.int8.onnx", "decoder_model.int8.onnx")
        for src, dst in zip(files["fp32"], files["int8"], strict=True):
            quantize_dynamic(str(tmp / src), str(tmp / dst), weight_type=QuantType.QInt8)

    feeds = {k: v.numpy().astype(np.int64) for k, v in inputs.items()}
    start, eos, pad = greedy.decoder_start_token_id, greedy.eos_token_id, greedy.pad_token_id
    keep = labels != -100
    for name, (enc_file, dec_file) in files.items():
        enc = ort.InferenceSession(str(tmp / enc_file), providers=["CPUExecutionProvider"])
        dec = ort.InferenceSession(str(tmp / dec_file), providers=["CPUExecutionProvider"])
        hidden_np = enc.run(["encoder_hidden_states"], feeds)[0]
        dec_feeds = {
            "decoder_input_ids": decoder_input_ids.numpy().astype(np.int64),
            "encoder_hidden_states": hidden_np,
            "encoder_attention_mask": feeds["attention_mask"],
        }
        logits = torch.from_numpy(dec.run(["logits"], dec_feeds)[0])
        diff = float((logits - reference).abs().max())
        agreement = float((logits.argmax(-1) == reference.argmax(-1))[keep].float().mean())

        def onnx_generate(n: int, enc=enc, dec=dec) -> Any:
            return greedy_generate(
                enc, dec, feeds["input_ids"][:n], feeds["attention_mask"][:n], start, eos, pad, max_length
            )

        got = onnx_generate(n_gen)
        width = max(got.shape[1], expected.shape[1])  # finished sequences are padded: compare at one width
        same = (_pad_to(got, width, pad) == _pad_to(expected, width, pad)).all(axis=1)
        generation_agreement = float(same.mean())
        latency = {f"batch_{b}": _time_ms(lambda b=b: onnx_generate(b), repeats) for b in sizes}
        # fp32 graphs must match PyTorch's logits and generate exactly its tokens; int8 is judged by agreement.
        good = agreement >= MIN_AGREEMENT and (name == "int8" or (diff <= MAX_ABS_DIFF and generation_agreement == 1))
        report.variants[name] = Variant(
            "{encoder,decoder}_model" + enc_file.removeprefix("encoder_model"),  # both files, as a shell would
            diff,
            agreement,
            _accuracy(logits, labels),
            latency,
            good,
            generation_agreement,
        )
    return report
