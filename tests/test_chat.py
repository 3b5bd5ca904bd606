"""Chat / instruction data for causal LMs: the chat template, the loss on the assistant's tokens only (checked token
by token), packing that never lets one example see another, the error for a model without a template, column
discovery, a real run that writes generations, and the escaping of model output wherever it is shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortlab.chat import IGNORE, encode, for_terminal, pack
from ortlab.data import DataError
from ortlab.spec import RunSpec, SpecError

CONVERSATION = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "Is this review fresh or rotten?\n\nA great film, funny and warm."},
    {"role": "assistant", "content": "fresh"},
    {"role": "user", "content": "Are you sure?"},
    {"role": "assistant", "content": "Yes, it is a great movie."},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_chat_llama):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_chat_llama)


def _runs(ids: list[int], labels: list[int]) -> list[list[int]]:
    """The unmasked label tokens as contiguous runs (one per assistant turn)."""
    runs, current = [], []
    for tok, lab in zip(ids, labels, strict=True):
        if lab != IGNORE:
            assert lab == tok  # a label is the token itself (the model shifts)
            current.append(tok)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def test_loss_covers_exactly_the_assistant_turns(tokenizer):
    enc = encode(tokenizer, CONVERSATION, max_length=256)
    runs = [tokenizer.decode(r) for r in _runs(enc["input_ids"], enc["labels"])]
    assert runs == ["fresh<|im_end|>\n", "Yes, it is a great movie.<|im_end|>\n"]
    masked = tokenizer.decode([t for t, lab in zip(enc["input_ids"], enc["labels"], strict=True) if lab == IGNORE])
    rendered = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert tokenizer.decode(enc["input_ids"]) == rendered  # the whole conversation, as the template lays it out
    # every other token (system, user turns, role headers) is masked
    assert masked == rendered.replace("fresh<|im_end|>\n<|im_start|>user", "<|im_start|>user").replace(
        "Yes, it is a great movie.<|im_end|>\n", ""
    )


def test_truncation_keeps_the_masking_right(tokenizer):
    full = encode(tokenizer, CONVERSATION, max_length=256)
    cut_at = full["labels"].index(next(t for t in full["labels"] if t != IGNORE)) + 2  # inside the first answer
    cut = encode(tokenizer, CONVERSATION, max_length=cut_at)
    assert len(cut["input_ids"]) == cut_at
    assert cut["labels"] == full["labels"][:cut_at] and cut["input_ids"] == full["input_ids"][:cut_at]
    assert sum(lab != IGNORE for lab in cut["labels"]) == 2


def test_packing_never_lets_one_example_see_another(tiny_chat_llama, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    from ortlab.chat import PackedCollator

    a = encode(tokenizer, CONVERSATION[1:3], 256)
    b = encode(tokenizer, [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi"}], 256)
    rows = pack([a["input_ids"], b["input_ids"]], [a["labels"], b["labels"]], max_length=256)
    assert len(rows["input_ids"]) == 1
    assert rows["position_ids"][0] == list(range(len(a["input_ids"]))) + list(range(len(b["input_ids"])))
    assert rows["labels"][0][len(a["input_ids"])] == IGNORE  # A's last token predicts nothing of B
    collate = PackedCollator(tokenizer.pad_token_id)
    perturbed = dict(rows, input_ids=[[(t * 7 + 3) % len(tokenizer) for t in a["input_ids"]] + b["input_ids"]])
    n_a, n_b = len(a["input_ids"]), len(b["input_ids"])
    for attn in ("eager", "sdpa"):
        model = AutoModelForCausalLM.from_pretrained(tiny_chat_llama, attn_implementation=attn).eval()
        with torch.no_grad():
            batch = collate([{k: v[0] for k, v in rows.items()}, {k: v[0] for k, v in perturbed.items()}])
            assert "attention_mask" not in batch
            # use_cache off, as in training (Trainer turns it off): with a cache, transformers does not look for
            # packed examples in position_ids, and the examples would see each other
            logits = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
            alone = model(input_ids=torch.tensor([b["input_ids"]])).logits[0]
        b_packed, b_after_change = logits[0, n_a : n_a + n_b], logits[1, n_a : n_a + n_b]
        assert not torch.allclose(logits[0, :n_a], logits[1, :n_a])  # A really changed
        assert torch.allclose(b_packed, b_after_change, atol=1e-5), attn  # B did not
        assert torch.allclose(b_packed, alone, atol=1e-4), attn  # B packed is B on its own


def test_packed_rows_fill_up_to_max_length(tokenizer):
    ex = encode(tokenizer, CONVERSATION[1:3], 256)
    n = len(ex["input_ids"])
    rows = pack([ex["input_ids"]] * 5, [ex["labels"]] * 5, max_length=2 * n + 1)
    assert [len(r) for r in rows["input_ids"]] == [2 * n, 2 * n, n]


@pytest.fixture(scope="module")
def chat_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("chat-data")
    rows = []
    for i in range(48):
        word = "fresh" if i % 2 else "rotten"
        rows.append(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": f"Is review {i} fresh or rotten?\n\nThe film was {'great' if i % 2 else 'bad'}.",
                    },
                    {"role": "assistant", "content": word},
                ]
            }
        )
    messages = folder / "chat.jsonl"
    messages.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pairs = folder / "pairs.csv"
    pairs.write_text("prompt,completion\n" + "".join(f'"Say {w}",{w}\n' for w in ["yes", "no"] * 20))
    bad = folder / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "no answer here"}]}) + "\n")
    return {"messages": messages, "pairs": pairs, "bad": bad}


def test_discovery_proposes_the_chat_columns(chat_files):
    from ortlab.discover import inspect_dataset

    info = inspect_dataset(str(chat_files["messages"]))
    assert info.proposal["task"] == "causal-lm" and info.proposal["messages_column"] == "messages"
    pairs = inspect_dataset(str(chat_files["pairs"])).proposal
    assert (pairs["task"], pairs["prompt_column"], pairs["response_column"]) == ("causal-lm", "prompt", "completion")


@pytest.mark.parametrize(
    ("data", "text"),
    [
        ({"task": "sequence-classification", "data": {"messages_column": "m"}}, "are for task causal-lm"),
        ({"task": "causal-lm", "data": {"prompt_column": "p"}}, "set both"),
        (
            {"task": "causal-lm", "data": {"messages_column": "m", "prompt_column": "p", "response_column": "r"}},
            "not both",
        ),
        ({"task": "causal-lm", "data": {"messages_column": "m", "text_column": "t"}}, "remove text_column"),
        ({"task": "sequence-classification", "data": {"packing": True}}, "packing is for causal-lm"),
        ({"task": "causal-lm", "data": {"packing": True}, "accel": {"ort": True}}, "ORTModule cannot export"),
        ({"task": "sequence-classification", "generation": {"prompts": ["hi"]}}, "causal-lm settings"),
    ],
)
def test_spec_refuses_chat_fields_that_do_not_fit(data, text):
    with pytest.raises(SpecError) as info:
        RunSpec.parse(data)
    assert text in str(info.value)


def test_bad_rows_and_raw_text_packing_fail_before_any_model(chat_files, tmp_path):
    from ortlab.data import load_and_check

    spec = RunSpec.parse(
        {"task": "causal-lm", "data": {"source": str(chat_files["bad"]), "messages_column": "messages"}}
    )
    with pytest.raises(DataError, match="row 0: the conversation has no assistant turn"):
        load_and_check(spec.data, "causal-lm", 0)
    text = tmp_path / "t.txt"
    text.write_text("some plain text\n" * 20)
    spec = RunSpec.parse({"task": "causal-lm", "data": {"source": str(text), "packing": True}})
    with pytest.raises(DataError, match=r"data.packing: .* raw text"):
        load_and_check(spec.data, "causal-lm", 0)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ([], "a conversation is a non-empty list"),
        ([{"role": "user", "content": "hi"}], "no assistant turn"),
        ([{"role": "critic", "content": "hi"}, {"role": "assistant", "content": "a"}], "role 'critic' is not one"),
        ([{"role": "user"}, {"role": "assistant", "content": "a"}], "'content' must be text"),
        (None, "a conversation is a non-empty list"),
    ],
)
def test_every_conversation_is_checked_in_arrow_and_a_bad_one_is_named_by_its_row(monkeypatch, bad, says):
    """Good chunks of a messages column pass in Arrow without a row read in Python; a chunk with a bad row is read
    row by row, and the error names that row (counted across chunks) in the words of `check_messages`."""
    import datasets

    from ortlab.chat import ChatDataError
    from ortlab.data import chatcolumns

    monkeypatch.setattr("ortlab.data.columnar.CHECK_CHUNK", 4)
    read = []
    rule = chatcolumns.check_messages
    monkeypatch.setattr(chatcolumns, "check_messages", lambda value, where: read.append(where) or rule(value, where))
    good = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    rows = [good] * 9 + [[{"role": "system", "content": "s"}, *good]] * 2
    chatcolumns.check_messages_column(datasets.Dataset.from_dict({"m": rows}), "m", "split")
    assert read == []
    ds = datasets.Dataset.from_dict({"m": [*rows[:9], bad, *rows[9:]]})
    with pytest.raises(ChatDataError, match=rf"split row 9(, turn \d)?: .*{says}"):
        chatcolumns.check_messages_column(ds, "m", "split")
    assert read[0] == "split row 8"  # only the chunk that failed in Arrow (rows 8 to 11) was read row by row


def test_a_model_without_chat_template_gets_the_fix(tiny_gpt2, chat_files):
    from ortlab.fit import check_model_and_data

    spec = RunSpec.parse(
        {"task": "causal-lm", "model": {"name": str(tiny_gpt2)}, "data": {"source": str(chat_files["messages"])}}
    )
    with pytest.raises(DataError) as info:
        check_model_and_data(spec, log=lambda s: None)
    message = str(info.value)
    assert "has no chat template" in message and "tokenizer.chat_template" in message and "text_column" in message


@pytest.fixture(scope="module")
def chat_run(tiny_chat_llama, chat_files, tmp_path_factory) -> dict:
    from ortlab.runner import train_spec

    spec = RunSpec.parse(
        {
            "task": "causal-lm",
            "model": {"name": str(tiny_chat_llama)},
            "data": {"source": str(chat_files["messages"]), "packing": True, "eval_fraction": 0.25},
            "hyper": {"max_steps": 6, "batch_size": 4, "eval_steps": 3, "learning_rate": 3e-3, "max_length": 96},
            "generation": {"num_prompts": 2, "score_examples": 6, "max_new_tokens": 4},
            "accel": {"tune": "off"},
            "output_dir": str(tmp_path_factory.mktemp("runs")),
        }
    )
    return train_spec(spec, progress=False, log=lambda s: None)


def test_a_chat_run_writes_generations_at_each_evaluation(chat_run):
    from ortlab.runfolder.rundir import RunDir

    run = RunDir(chat_run["run_dir"])
    records = [json.loads(line) for line in (run.path / "generations.jsonl").read_text().splitlines()]
    assert [(r["phase"], r["step"]) for r in records] == [
        ("before", 0),
        ("before", 0),
        ("during", 3),
        ("during", 3),
        ("during", 6),
        ("during", 6),
        ("after", 6),
        ("after", 6),
    ]
    assert all(r["reference"] in ("fresh", "rotten") and isinstance(r["output"], str) for r in records)
    assert records[0]["prompt"].startswith("Is review")
    events = [r for r in run.metrics() if r.get("event") == "generations"]
    assert len(events) == 4 and all(e["scored"] == 6 for e in events)
    assert 0.0 <= chat_run["eval_after"]["eval_exact_match"] <= 1.0
    assert "eval_exact_match" in chat_run["eval_before"]
    steps = [r for r in run.metrics() if r.get("event") == "step"]
    assert len(steps) == 6 and steps[-1]["loss"] < steps[0]["loss"]


def test_model_output_is_escaped_for_the_terminal():
    hostile = "fresh\x1b[2J\x1b]0;owned\x07\rrotten\u202egnirts\nnext"
    shown = for_terminal(hostile)
    assert "\x1b" not in shown and "\x07" not in shown and "\r" not in shown and "\u202e" not in shown
    assert shown.startswith("fresh?[2J?]0;owned??rotten?gnirts ⏎ next")
    assert for_terminal("x" * 500, limit=20) == "x" * 19 + "…"


HOSTILE = "<script>alert(1)</script> | **bold** [x](javascript:y)\x1b[31m"


def test_generations_are_escaped_in_the_workbench_and_the_card():
    from ortlab.publish import card_text
    from ortlab.ui.summary import generations_html

    records = [
        {"step": 4, "phase": "after", "prompt": HOSTILE, "output": HOSTILE, "reference": "fresh", "match": False}
    ]
    shown = generations_html(records, run_id="<b>run</b>")
    assert "<script>" not in shown and "&lt;script&gt;" in shown and "&lt;b&gt;run" in shown
    cell = card_text(HOSTILE + "\nline")
    assert cell.endswith("<br>line")
    head = cell[: -len("<br>line")]
    assert all(c not in head for c in "<>|*[]()`\x1b") and "&#60;script&#62;" in head


def test_follow_the_card_and_the_workbench_show_the_generations(chat_run):
    from typer.testing import CliRunner

    from ortlab.cli import app
    from ortlab.publish import model_card
    from ortlab.runfolder.rundir import RunDir
    from ortlab.ui.workbench import Workbench

    run_dir = Path(chat_run["run_dir"])
    out = CliRunner().invoke(app, ["follow", str(run_dir)]).output
    assert "generations after (step 6)" in out and "exact match" in out and "> Is review" in out
    card = model_card(RunDir(run_dir))
    assert "## Generations" in card and "Is review" in card
    wb = Workbench(
        spec={"task": "causal-lm", "data": {"source": "x.jsonl"}, "accel": {"ort": False}}, root=str(run_dir.parent)
    )
    try:
        assert "ortlab-generations" in wb.generations.value and "after step 6" in wb.generations.value
        assert wb.chat_box.layout.display is None  # the chat columns are offered for causal-lm
        wb.messages_column.value = "messages"
        assert wb.spec().data.messages_column == "messages"
    finally:
        wb.monitor.close()


def test_the_train_terminal_prints_generations_without_codes_or_markup():
    import io

    from rich.console import Console

    from ortlab.train.terminal import Terminal

    term = Terminal(progress=False)
    buffer = io.StringIO()
    term.console = Console(file=buffer, force_terminal=False, width=200)  # no codes of its own
    item = {
        "prompt": "[bold]Q[/bold]",
        "output": "A\x1b[2J\x1b]0;t\x07[red]x[/red]",
        "reference": "fresh",
        "match": False,
    }
    term.on_record(
        {"event": "generations", "step": 3, "phase": "during", "exact_match": 0.5, "scored": 4, "items": [item]}
    )
    shown = buffer.getvalue()
    assert "exact match 0.500 over 4" in shown and "[bold]Q[/bold]" in shown and "[red]x[/red]" in shown
    assert "\x1b[2J" not in shown and "\x07" not in shown and "expected fresh" in shown


def test_the_embedded_chat_dataset_is_rotten_tomatoes_as_conversations():
    from ortlab.assets import CHAT_QUESTION, embedded_dataset

    path, fmt = embedded_dataset("rotten-tomatoes-chat")
    plain, _ = embedded_dataset("rotten-tomatoes")
    lines = path.read_text(encoding="utf-8").splitlines()
    import csv

    with plain.open(encoding="utf-8", newline="") as f:
        labels = [row["label"] for row in csv.DictReader(f)]
    assert fmt == "json" and len(lines) == len(labels)
    assert [json.loads(line)["messages"][1]["content"] for line in lines[:50]] == labels[:50]
    first = json.loads(lines[0])["messages"]
    assert [t["role"] for t in first] == ["user", "assistant"]
    assert first[0]["content"].startswith(CHAT_QUESTION) and first[1]["content"] in ("fresh", "rotten")
