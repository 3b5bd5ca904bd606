"""The export of an encoder-decoder (seq2seq) model: two graphs, the encoder and the decoder with its LM head,
and `greedy_generate`, the generation loop around them in ONNX Runtime (see `ortlab.export`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortlab.export.parity import (
    MAX_ABS_DIFF,
    MIN_AGREEMENT,
    ExportError,
    ExportReport,
    Variant,
    _accuracy,
    _time_ms,
)


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
