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

A causal LM is exported with its KV cache by default (`ortlab.export.kvcache`): `model.onnx` takes input_ids,
attention_mask, position_ids and `past_key_values.<layer>.key/value`, and returns the logits and
`present.<layer>.key/value`; one graph for the prompt (an empty past) and for each further token. Its config,
generation config and tokenizer are saved beside it, and `OnnxGenerator(<run>/onnx).stream(ids)` generates from it
(greedy or top-p). Parity then also covers greedy generation: each of 8 held-out prompts (16 tokens of an eval row)
must continue token for token as PyTorch's `generate(do_sample=False)`, timed per token on both sides.
`cache=False` writes the graph without the cache (the whole prefix re-run per token).

A seq2seq (encoder-decoder) model is exported as two graphs, `encoder_model.onnx` (input_ids, attention_mask ->
encoder_hidden_states) and `decoder_model.onnx` (decoder_input_ids, encoder_hidden_states, encoder_attention_mask
-> logits), without past key values: generation is a loop around the decoder, so the encoder runs once per input
and the decoder once per generated token (`greedy_generate` is that loop in ONNX Runtime). Its parity check is
twofold: the teacher-forced logits against PyTorch's, and the greedy-generated tokens against PyTorch's
`generate(num_beams=1)` on the same inputs (`generation_agreement`: the share of sequences equal token for
token). Latency is that of greedy generation, PyTorch's `generate` against the ONNX loop.

    ortlab.export.parity   the parity thresholds, `ExportReport` and `Variant`, the measures
    ortlab.export.graphs   `export_onnx`: one graph (classifier, tagger, causal LM)
    ortlab.export.kvcache  the causal LM's graph with past key values; the generation parity check
    ortlab.export.kvgen    `OnnxGenerator`: streaming generation over ONNX Runtime, with or without the cache
    ortlab.export.encdec   encoder and decoder graphs, `greedy_generate`

A causal LM of the llama family (SmolLM2) also exports to GGUF for llama.cpp, Ollama and LM Studio, written with
the `gguf` package (no llama.cpp build), each file read back and held against the trained model (`export_gguf`,
<run>/gguf/: the files, an Ollama Modelfile, export.json).

    ortlab.export.gguf       `write_gguf`: tensors, hyperparameters, tokenizer and chat template into one file
    ortlab.export.ggufcheck  `export_gguf`: write, read back, compare (logits, greedy continuations), report
    ortlab.export.modelfile  the Ollama Modelfile (ChatML as a Go template)
"""

from __future__ import annotations

from ortlab.export.encdec import greedy_generate
from ortlab.export.ggufcheck import GgufReport, export_gguf
from ortlab.export.graphs import export_onnx
from ortlab.export.kvgen import OnnxGenerator
from ortlab.export.parity import MAX_ABS_DIFF, MIN_AGREEMENT, ExportError, ExportReport, Variant

__all__ = [
    "MAX_ABS_DIFF",
    "MIN_AGREEMENT",
    "ExportError",
    "ExportReport",
    "GgufReport",
    "OnnxGenerator",
    "Variant",
    "export_gguf",
    "export_onnx",
    "greedy_generate",
]
