"""GGUF export (ortlab.export.gguf, ggufcheck, modelfile): a tiny Llama-architecture chat model trained with LoRA for
a few steps is written as f16, bf16 and q8_0, read back by transformers and held against the trained model; the
Ollama Modelfile is parsed by a parser written from Ollama's documented grammar and its template rendered; a broken
writer (q/k left in HF's layout) is caught and its file is not published. The SmolLM2 numbers (20 prompts, 135M
parameters) come from benchmarks/bench_gguf.py, too slow for a test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # one tiny LoRA run (~10 s) and a few exports of a 2-layer model (seconds each)
PROMPTS, NEW_TOKENS = 6, 8


@pytest.fixture(scope="module")
def lora_run(tiny_chat_llama, tmp_path_factory) -> Path:
    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    spec = RunSpec.parse(
        {
            "name": "gguf-lora",
            "task": "causal-lm",
            "model": {"name": str(tiny_chat_llama)},
            "output_dir": str(tmp_path_factory.mktemp("gguf-runs")),
            "data": {"source": "embedded:rotten-tomatoes-chat", "max_train_samples": 32, "max_eval_samples": 12},
            "hyper": {"learning_rate": 1e-2, "batch_size": 8, "max_length": 96, "max_steps": 4, "logging_steps": 1},
            "accel": {"ort": False, "fused_adam": False, "precision": "fp32", "tune": "off"},
            "adapter": {"kind": "lora", "rank": 4, "alpha": 8, "dropout": 0.0},
            "generation": {"num_prompts": 1, "score_examples": 0, "max_new_tokens": 2},
        }
    )
    result = train_spec(spec, progress=False, log=lambda _: None)
    path = Path(result["run_dir"])
    assert (path / "model" / "adapter_config.json").is_file()
    return path


@pytest.fixture(scope="module")
def exported(lora_run):
    from ortlab.runner import Run

    report = Run(lora_run).export_gguf(quant=["f16", "bf16", "q8_0"], prompts=PROMPTS, max_new_tokens=NEW_TOKENS)
    return lora_run, report


def test_each_type_reads_back_as_the_trained_model(exported):
    run, report = exported
    saved = json.loads((run / "gguf" / "export.json").read_text())
    assert saved["good"] is True, saved
    assert set(saved["variants"]) == {"f16", "bf16", "q8_0"}
    assert "conversations" in report.prompts_from  # held-out chat rows, rendered with the template
    for quant, v in report.variants.items():
        assert (run / "gguf" / v.file).is_file()
        assert v.prompts == PROMPTS and v.tokenizer_identical == PROMPTS and v.chat_template_identical, quant
        assert v.max_abs_logit_diff <= v.tolerance, quant
        assert v.next_token_agreement > 0.95, quant
    f16 = report.variants["f16"]
    assert f16.prompts_identical == PROMPTS, f16.differ
    assert f16.tensor_types["F16"] > 0 and f16.tensor_types["F32"] > 0  # matrices f16, norms f32
    assert report.variants["q8_0"].tensor_types.get("Q8_0", 0) > 0
    # q8_0 is smaller than f16 (int8 + one fp16 scale per 32 values, against 2 bytes a value)
    assert report.variants["q8_0"].size_bytes < f16.size_bytes


def test_the_file_carries_llama_cpp_names_metadata_and_tokenizer(exported, tiny_chat_llama):
    import gguf
    from transformers import AutoTokenizer

    run, _ = exported
    reader = gguf.GGUFReader(run / "gguf" / "model.f16.gguf")
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output_norm.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight"} <= names
    assert "output.weight" not in names  # tied embeddings: llama.cpp reads the missing output as tied
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_llama)
    assert field("general.architecture") == "llama"
    assert field("llama.attention.head_count_kv") == 2
    assert field("tokenizer.ggml.model") == "gpt2"
    assert field("tokenizer.ggml.eos_token_id") == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert field("tokenizer.chat_template") == tokenizer.chat_template
    tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
    assert types[tokens.index("<|im_start|>")] == 3  # CONTROL: matched whole, never split
    assert len(field("tokenizer.ggml.merges")) > 100


def test_the_q_k_permutation_is_the_inverse_of_transformers_reader():
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    from ortlab.export.gguf import llama_cpp_permute

    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)  # 8 heads of dim 16
    for heads, kv in ((8, 8), (8, 2)):
        rows = w[: kv * 16]
        permuted = llama_cpp_permute(rows, heads, kv)
        assert not np.array_equal(permuted, rows)
        back = LlamaTensorProcessor()._reverse_permute_weights(permuted, heads, kv)
        assert np.array_equal(back, rows)


def test_a_broken_file_fails_its_check_and_is_not_published(lora_run, tmp_path, monkeypatch):
    """A writer bug (every matrix written 1.5x too large, as a lost quantization scale would) is caught by the
    check: the report says failed, no Modelfile is written, and publishing leaves the file out."""
    import shutil

    from ortlab.export import export_gguf, gguf
    from ortlab.publish import push_to_folder

    run = tmp_path / "copy"
    shutil.copytree(lora_run, run, ignore=shutil.ignore_patterns("gguf"))
    encode = gguf._encode
    monkeypatch.setattr(gguf, "_encode", lambda a, q: encode(a * 1.5 if a.ndim == 2 else a, q))
    report = export_gguf(run, quant="f16", prompts=PROMPTS, max_new_tokens=NEW_TOKENS)
    v = report.variants["f16"]
    assert not report.good and not v.good
    assert v.max_abs_logit_diff > v.tolerance
    assert report.modelfile is None and "parity" in report.modelfile_note
    assert json.loads((run / "gguf" / "export.json").read_text())["good"] is False
    assert (run / "gguf" / "model.f16.gguf").is_file()  # kept on this machine, to look at
    out = push_to_folder(run, tmp_path / "out")
    assert not list(Path(out).rglob("*.gguf")) and not (Path(out) / "gguf" / "Modelfile").exists()
    card = (Path(out) / "README.md").read_text()
    assert "FAILED the parity check: not published" in card


def test_q_and_k_must_be_permuted_for_the_reader(tiny_chat_llama, tmp_path, monkeypatch):
    """With sharp attention (q/k weights scaled up, unlike a freshly initialised model whose attention is nearly
    uniform whatever q and k are), the file reads back as the model only with llama.cpp's q/k permutation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ortlab.export import gguf

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_chat_llama, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(30)
            layer.self_attn.k_proj.weight.mul_(30)
    ids = tokenizer("Is this review fresh or rotten? A loud, long and pointless film.", return_tensors="pt").input_ids

    def read_back_diff(name: str) -> float:
        gguf.write_gguf(model, tokenizer, tmp_path / name, "f16", "t")
        back = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=name, dtype=torch.float32).eval()
        with torch.no_grad():
            return float((back(ids).logits - model(ids).logits).abs().max())

    assert read_back_diff("right.gguf") < 0.1
    monkeypatch.setattr(gguf, "llama_cpp_permute", lambda w, *a: w)
    assert read_back_diff("unpermuted.gguf") > 1.0


def test_publish_uploads_the_good_files_with_how_to_run_them(exported, tmp_path):
    from ortlab.publish import push_to_folder

    run, _ = exported
    out = Path(push_to_folder(run, tmp_path / "out"))
    assert sorted(p.name for p in (out / "gguf").iterdir()) == [
        "Modelfile",
        "export.json",
        "model.bf16.gguf",
        "model.f16.gguf",
        "model.q8_0.gguf",
    ]
    assert str(run) not in (out / "gguf" / "export.json").read_text()  # local paths scrubbed
    card = (out / "README.md").read_text()
    assert "## GGUF (llama.cpp, Ollama, LM Studio)" in card
    assert "llama-cli -m gguf/model.f16.gguf" in card and "ollama create gguf-lora -f Modelfile" in card
    assert "gguf" in card.split("---")[1]  # a Hub tag in the front matter


def test_the_cli_exports_gguf(lora_run, tmp_path):
    import shutil

    from typer.testing import CliRunner

    from ortlab.cli import app

    run = tmp_path / "cli-copy"
    shutil.copytree(lora_run, run, ignore=shutil.ignore_patterns("gguf"))
    result = CliRunner().invoke(app, ["export", str(run), "--format", "gguf", "--quant", "q8_0", "--prompts", "3"])
    assert result.exit_code == 0, result.output
    assert "/3" in result.output  # the greedy column: identical continuations out of 3 prompts
    assert (run / "gguf" / "model.q8_0.gguf").is_file() and (run / "gguf" / "Modelfile").is_file()
    bad = CliRunner().invoke(app, ["export", str(run), "--format", "gguf", "--quant", "q4_k"])
    assert bad.exit_code != 0 and "q4_k" in bad.output


# --- the Modelfile against Ollama's documented grammar ----------------------------------------------------------

INSTRUCTIONS = {"from", "parameter", "template", "system", "adapter", "license", "message"}
PARAMETERS = {  # Ollama's Modelfile reference, "Valid Parameters and Values"
    "mirostat",
    "mirostat_eta",
    "mirostat_tau",
    "num_ctx",
    "repeat_last_n",
    "repeat_penalty",
    "temperature",
    "seed",
    "stop",
    "num_predict",
    "top_k",
    "top_p",
    "min_p",
}


def parse_modelfile(text: str) -> list[tuple[str, str]]:
    """(instruction, value) pairs, as Ollama's documented grammar reads them: `# comment` lines; `INSTRUCTION args`
    (case-insensitive); PARAMETER takes `name value`, MESSAGE `role value`; a value is the rest of the line, or
    "quoted", or \"\"\"triple-quoted\"\"\" over several lines. Anything else raises ValueError."""
    out, i = [], 0
    while i < len(text):
        line_end = text.find("\n", i)
        line_end = len(text) if line_end < 0 else line_end
        line = text[i:line_end]
        if not line.strip() or line.lstrip().startswith("#"):
            i = line_end + 1
            continue
        m = re.match(r"\s*([A-Za-z]+)[ \t]+", line)
        if not m or m.group(1).lower() not in INSTRUCTIONS:
            raise ValueError(f"not an instruction: {line!r}")
        name, j = m.group(1).lower(), i + m.end()
        if name in ("parameter", "message"):
            k = re.match(r"([A-Za-z0-9_]+)[ \t]+", text[j:line_end])
            if not k:
                raise ValueError(f"{name} needs a name and a value: {line!r}")
            key, j = k.group(1), j + k.end()
            if name == "parameter" and key not in PARAMETERS:
                raise ValueError(f"unknown parameter {key!r}")
            if name == "message" and key not in ("system", "user", "assistant"):
                raise ValueError(f"message role {key!r}")
            name = f"{name} {key}"
        if text.startswith('"""', j):
            end = text.find('"""', j + 3)
            if end < 0:
                raise ValueError("unterminated triple-quoted value")
            value, i = text[j + 3 : end], end + 3
            if text[i:].split("\n", 1)[0].strip():
                raise ValueError("text after a closing triple quote")
            i = text.find("\n", i) + 1 if "\n" in text[i:] else len(text)
        else:
            raw = text[j:line_end].strip()
            if raw.startswith('"'):
                if len(raw) < 2 or not raw.endswith('"'):
                    raise ValueError(f"unterminated quote: {line!r}")
                raw = raw[1:-1]
            value, i = raw, line_end + 1
        out.append((name, value))
    if not any(n == "from" for n, _ in out):
        raise ValueError("no FROM line")
    return out


def render_go(template: str, system: str | None, messages: list[dict[str, str]]) -> str:
    """Ollama's side, for the subset of Go's text/template a Modelfile of ortlab uses: `{{- ... -}}` trimming,
    `range .Messages`, `if .System`, `end`, and the fields .Role .Content .System. Ollama puts the Modelfile's
    SYSTEM first as a system message when the conversation has none. Any other action raises."""
    if system and (not messages or messages[0]["role"] != "system"):
        messages = [{"role": "system", "content": system}, *messages]
    parts = re.split(r"({{-?\s*.*?\s*-?}})", template)
    for n, part in enumerate(parts):  # whitespace trimming, as Go does it
        if part.startswith("{{-") and n > 0:
            parts[n - 1] = parts[n - 1].rstrip()
        if part.endswith("-}}") and n + 1 < len(parts):
            parts[n + 1] = parts[n + 1].lstrip()
    actions = [(p.strip("{}- \t\n") if p.startswith("{{") else None, p) for p in parts]

    def run(at: int, dot: dict[str, str] | None) -> tuple[str, int]:
        out = ""
        while at < len(actions):
            action, text = actions[at]
            if action is None:
                out += text
            elif action == "end":
                return out, at
            elif action == "range .Messages":
                end = at
                for m in messages:
                    body, end = run(at + 1, m)
                    out += body
                at = end if messages else _skip(at + 1)
            elif action == "if .System":
                body, end = run(at + 1, dot)
                out += body if system else ""
                at = end
            elif action in (".Role", ".Content"):
                out += dot[action[1:].lower()]
            elif action == ".System":
                out += system or ""
            else:
                raise ValueError(f"action not in the subset: {action!r}")
            at += 1
        return out, at

    def _skip(at: int) -> int:
        depth = 0
        while True:
            action = actions[at][0]
            if action in ("range .Messages", "if .System"):
                depth += 1
            elif action == "end":
                if depth == 0:
                    return at
                depth -= 1
            at += 1

    return run(0, None)[0]


SMOL_STYLE = (  # SmolLM2's template shape: ChatML with a default system prompt when the conversation has none
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant named Tiny.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "Is this review fresh or rotten?\n\nA delight."}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Fresh?"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": 'Say "rotten"'},
    ],
]


@pytest.mark.parametrize("template", ["tiny", "smol"])
def test_the_modelfile_parses_and_renders_as_the_chat_template(tiny_chat_llama, template):
    from transformers import AutoTokenizer

    from ortlab.export.modelfile import modelfile

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_llama)
    if template == "smol":
        tokenizer.chat_template = SMOL_STYLE
    text = modelfile("model.q8_0.gguf", tokenizer, 8192, {"temperature": 0.0})
    commands = parse_modelfile(text)
    values = dict(commands)
    assert values["from"] == "./model.q8_0.gguf"
    stops = [v for n, v in commands if n == "parameter stop"]
    assert "<|im_end|>" in stops
    assert values["parameter num_ctx"] == "4096" and values["parameter temperature"] == "0"
    assert ("system" in values) == (template == "smol")
    for conversation in CONVERSATIONS:
        expected = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        assert render_go(values["template"], values.get("system"), conversation) == expected


def test_the_parser_rejects_what_ollama_rejects():
    good = 'FROM ./m.gguf\nPARAMETER stop "<|im_end|>"\nTEMPLATE """a\nb"""\n'
    assert parse_modelfile(good)[-1] == ("template", "a\nb")
    for bad, why in (
        ("PARAMETER temperature 0\n", "no FROM"),
        ("FROM ./m.gguf\nPARAMETER warmth 1\n", "unknown parameter"),
        ('FROM ./m.gguf\nTEMPLATE """never closed\n', "unterminated"),
        ("FROM ./m.gguf\nMESSAGE robot hi\n", "role"),
        ("FROM ./m.gguf\nRUN echo\n", "not an instruction"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_modelfile(bad)


def test_a_template_that_is_not_chatml_gets_no_modelfile(tiny_chat_llama):
    from transformers import AutoTokenizer

    from ortlab.export.modelfile import is_chatml

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_llama)
    assert is_chatml(tokenizer) is None
    tokenizer.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    assert "not ChatML" in is_chatml(tokenizer)
    tokenizer.chat_template = None
    assert "no chat template" in is_chatml(tokenizer)


def test_other_architectures_are_refused_with_the_way_out():
    from transformers import GPT2Config, LlamaConfig

    from ortlab.export.gguf import check_supported
    from ortlab.export.parity import ExportError

    check_supported(LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1))
    with pytest.raises(ExportError, match="ONNX"):
        check_supported(GPT2Config())
    scaled = LlamaConfig(hidden_size=64, num_attention_heads=4, rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ExportError, match="rope"):
        check_supported(scaled)
