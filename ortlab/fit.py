"""Does the model fit the data? Its tokenizer, its positions and its padding, checked before any weight loads.

A model folder and a dataset can each be fine alone and still not fit together, and transformers rarely says so:
- a folder without its tokenizer files still "loads" a tokenizer: transformers builds the model type's default
  one with an empty vocabulary, every word becomes [UNK], and a run trains to `completed` on nothing;
- a tokenizer from another model gives ids the embeddings do not have (an index error after the model loaded) or
  ids that mean other words (a silent mess);
- text the tokenizer does not know (another script or language) is mostly [UNK];
- `hyper.max_length` beyond the model's position embeddings fails inside the model, on the first long row;
- a tokenizer with no pad token cannot batch examples of different lengths.

Each check needs the tokenizer and the config only (kilobytes to a few MB, well under a second), never the weights,
so `check_model_and_data` (below) runs them after the data checks and before any model is materialised. The thresholds
are in constants below, each with the reason for its value.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortlab.data import DataError, Prepared, load_and_check
from ortlab.data import checks as data_checks
from ortlab.data.lazylm import plan
from ortlab.spec import RunSpec
from ortlab.tasks import ModelError, check_model_fits_task, load_tokenizer, resolve_model

# A model's own tokenizer fills its embedding matrix but for a few rows (models round the matrix up to a multiple
# of 64 or 128: T5 32,100 of 32,128, Qwen2.5 151,665 of 151,936, Phi-2 50,295 of 51,200, all above 95%). Below
# half, the tokenizer is another model's (or an empty default one); between half and 90% a note says so.
VOCAB_REFUSED_BELOW = 0.5
VOCAB_NOTED_BELOW = 0.9
# Unknown tokens in a sample of the training rows: English text through an English tokenizer has well under 1%;
# more than half means the tokenizer cannot read this text (another script, another model's vocabulary).
UNKNOWN_REFUSED_ABOVE = 0.5
UNKNOWN_NOTED_ABOVE = 0.1
SAMPLE_ROWS = 256
SAMPLE_CHARS = 2000  # per text: enough to measure, bounded for very long documents

# Where configs keep the number of positions (GPT-2: n_positions; MPT: max_seq_len; ...).
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")
# Relative positions only: no table to run off the end of (T5's configs still carry a stale n_positions).
RELATIVE_POSITION_TYPES = {"t5", "mt5", "umt5", "longt5", "switch_transformers", "xlnet", "transfo-xl"}
# RoBERTa's family numbers positions from pad_token_id + 1: 514 positions read 512 tokens.
PADDING_OFFSET_TYPES = {
    "roberta",
    "xlm-roberta",
    "xlm-roberta-xl",
    "camembert",
    "roberta-prelayernorm",
    "data2vec-text",
    "longformer",
    "ibert",
    "mpnet",
    "esm",
    "xmod",
}


def check_fit(model_path: str, spec: Any, prepared: Prepared, log: Callable[[str], None] = print) -> Any:
    """Check that the model's tokenizer and positions fit `spec` and the data; returns the loaded tokenizer.

    Sets `prepared.max_length`: `hyper.max_length`, or the model's positions when the default is more than the
    model reads (a value the user set beyond them is refused instead: they asked for something the model
    cannot do)."""
    config = _config(model_path, spec.model.revision)
    tokenizer = _tokenizer(model_path, spec.model.revision)
    _check_files(model_path, tokenizer)
    _check_vocabulary(model_path, tokenizer, config, log)
    needs_padding = not spec.task_record.blocks or prepared.chat
    if needs_padding and tokenizer.pad_token is None:
        raise ModelError(
            f"model.name: the tokenizer of {spec.model.name!r} has no pad token and no end-of-sequence token to pad "
            f"with, and {spec.task} batches rows of different lengths; make one of its tokens the pad token "
            "(tokenizer.pad_token = tokenizer.unk_token, say) and save the tokenizer into the model folder"
        )
    _check_unknown(spec.model.name, tokenizer, prepared, log)
    prepared.max_length = _max_length(config, spec, log)
    if spec.task_record.blocks and not prepared.chat:
        _check_blocks(tokenizer, prepared, prepared.max_length)
    return tokenizer


def _config(model_path: str, revision: str | None) -> Any:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path, revision=revision)
    except Exception as e:  # resolve_model checked the JSON: what is left is a field transformers rejects
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ModelError(f"model.name: transformers cannot read the config of {model_path!r}: {first}") from None
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _tokenizer(model_path: str, revision: str | None) -> Any:
    try:
        return load_tokenizer(model_path, revision)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ModelError(
            f"model.name: cannot load the tokenizer of {model_path!r} ({first}); the model folder needs the "
            "tokenizer files the model was trained with (tokenizer.save_pretrained(folder) writes them)"
        ) from None


def _check_files(model_path: str, tokenizer: Any) -> None:
    """A local folder must hold the files its tokenizer class reads: without them transformers builds the class
    anyway, with an empty vocabulary (BERT: 5 tokens, all special), and every word is [UNK]. Tokenizers that need
    no file (ByT5's bytes) pass."""
    folder = Path(model_path)
    needed = set(getattr(type(tokenizer), "vocab_files_names", {}).values())
    if not needed or not folder.is_dir():
        return  # a Hub id's files are the Hub's: the vocabulary check below still catches an empty tokenizer
    if any((folder / name).is_file() for name in needed | {"tokenizer.json"}):
        return
    raise ModelError(
        f"model.name: the folder {model_path!r} has no tokenizer files (looked for {', '.join(sorted(needed))}), so "
        f"transformers would build an empty {type(tokenizer).__name__} of {len(tokenizer)} tokens and every word "
        "would become unknown; copy the tokenizer the model was trained with into the folder "
        "(AutoTokenizer.from_pretrained(original).save_pretrained(folder))"
    )


def _check_vocabulary(model_path: str, tokenizer: Any, config: Any, log: Callable[[str], None]) -> None:
    rows, size = getattr(config, "vocab_size", None), len(tokenizer)
    if not isinstance(rows, int) or rows <= 0:
        return
    if size > rows:
        raise ModelError(
            f"model.name: the tokenizer of {model_path!r} has {size:,} tokens but the model's embedding matrix has "
            f"{rows:,} rows (config vocab_size): ids from {rows:,} up have no embedding. Use the model's own "
            "tokenizer, or grow the embeddings to fit (model.resize_token_embeddings(len(tokenizer)), then "
            "save_pretrained the model into the folder)"
        )
    if size < rows * VOCAB_REFUSED_BELOW:
        raise ModelError(
            f"model.name: the tokenizer of {model_path!r} has {size:,} tokens but the model's embedding matrix has "
            f"{rows:,} rows (config vocab_size), so it is not the tokenizer this model was trained with (a model's "
            "own tokenizer fills its embeddings but for a few rows); put the model's own tokenizer files in the folder"
        )
    if size < rows * VOCAB_NOTED_BELOW:
        log(
            f"note: the tokenizer has {size:,} tokens for {rows:,} embedding rows ({100 * size / rows:.0f}%); if it "
            "is not this model's own tokenizer, the token ids mean other words to the model"
        )


def _sample_texts(prepared: Prepared) -> list[str]:
    """The text the tokenizer will read, from the first SAMPLE_ROWS training rows."""
    if prepared.chat:
        conversations = prepared.conversations("train", SAMPLE_ROWS)
        texts: list[Any] = [turn["content"] for conversation in conversations for turn in conversation]
    else:
        rows = prepared.first_rows(SAMPLE_ROWS)
        columns = (prepared.text_column, prepared.text_pair_column, prepared.target_column)
        texts = [value for column in columns if column for value in rows[column]]
    joined = (" ".join(map(str, t)) if isinstance(t, list) else t for t in texts)  # token classification: words
    return [t[:SAMPLE_CHARS] for t in joined if isinstance(t, str) and t.strip()]


def unknown_share(tokenizer: Any, texts: list[str]) -> tuple[float, int]:
    """(share of unknown tokens, tokens counted) when `tokenizer` reads `texts`; (0, 0) for a tokenizer that has
    no unknown token (byte-level BPE reads anything)."""
    unk = tokenizer.unk_token_id
    if unk is None or not texts:
        return 0.0, 0
    ids = [i for row in tokenizer(texts, add_special_tokens=False)["input_ids"] for i in row]
    return (sum(i == unk for i in ids) / len(ids), len(ids)) if ids else (0.0, 0)


def _check_unknown(model_name: str, tokenizer: Any, prepared: Prepared, log: Callable[[str], None]) -> None:
    share, counted = unknown_share(tokenizer, _sample_texts(prepared))
    if share > UNKNOWN_REFUSED_ABOVE:
        raise ModelError(
            f"model.name: {100 * share:.0f}% of the {counted:,} tokens in the first {SAMPLE_ROWS} training rows are "
            f"unknown to the tokenizer of {model_name!r} ({tokenizer.unk_token}), so the model would learn from "
            "placeholders; choose a model whose tokenizer reads this text (a multilingual one for another language "
            "or script), or check that the folder holds the model's own tokenizer"
        )
    if share > UNKNOWN_NOTED_ABOVE:
        log(f"note: {100 * share:.0f}% of the tokens in the first training rows are unknown to the tokenizer")


def model_positions(config: Any) -> tuple[int, str] | None:
    """(how many tokens the model reads at most, the config field that says so), or None when it has no
    absolute position table (relative positions: T5, DeBERTa-v3)."""
    model_type = getattr(config, "model_type", None)
    if model_type in RELATIVE_POSITION_TYPES or getattr(config, "position_biased_input", True) is False:
        return None
    for field in POSITION_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            offset = (getattr(config, "pad_token_id", None) or 1) + 1 if model_type in PADDING_OFFSET_TYPES else 0
            return value - offset, getattr(config, "attribute_map", {}).get(field, field)  # GPT-2: n_positions
    return None


def _max_length(config: Any, spec: Any, log: Callable[[str], None]) -> int:
    """`hyper.max_length` as this model allows. A length the user set above the model's positions is refused;
    the default (128) is clipped with a note, as it is no one's request. The default is told by its value, as a
    stored spec (a launched run's spec.yaml) writes every field and no longer says which were set."""
    hyper = spec.hyper
    limit = model_positions(config)
    if limit is None:
        return hyper.max_length
    most, field = limit
    default = type(hyper).model_fields["max_length"].default
    lengths = {
        "hyper.max_length": hyper.max_length,
        "hyper.max_target_length": hyper.max_target_length,
        "generation.max_length": spec.generation.max_length if spec.task_record.generates else None,
    }
    for name, value in lengths.items():
        if value is None or value <= most:
            continue
        if name == "hyper.max_length" and value == default:
            log(f"hyper.max_length: the model reads at most {most} tokens ({field}): rows are cut at {most}")
            continue
        raise ModelError(
            f"{name}: {value} tokens is more than the model reads: it has positions for {most} (config {field}); "
            f"set {name} to {most} or less"
        )
    return min(hyper.max_length, most)


def _check_blocks(tokenizer: Any, prepared: Prepared, max_length: int) -> None:
    """Raw text for a causal LM is cut into blocks of max_length tokens: the training split must fill one, or the
    run fails after the model loads ('no training examples'). Counted until one block is full (cheap)."""
    column, ds = prepared.text_column, prepared.head if prepared.head is not None else prepared.train
    eos = 1 if tokenizer.eos_token_id is not None else 0
    total = 0
    for start in range(0, len(ds), 100):
        texts = [t for t in ds[start : start + 100][column] if isinstance(t, str) and t.strip()]
        total += sum(len(ids) + eos for ids in tokenizer(texts)["input_ids"]) if texts else 0
        if total >= max_length:
            return
    if prepared.streamed and len(ds) >= data_checks.HEAD_ROWS:
        return  # a stream's head is not all of it: later rows may fill a block
    raise DataError(
        f"data: the training text is {total:,} tokens, less than one block of hyper.max_length={max_length} (a "
        "causal LM trains on full blocks); add text or lower hyper.max_length"
    )


def check_answers(tokenizer: Any, prepared: Prepared, max_length: int) -> None:
    """Chat data: the first SAMPLE_ROWS conversations of each split, laid out as training lays them out, must keep
    assistant tokens within `max_length`, by the rule training applies (`lazylm.Dropped.fail_on_large_share`); the
    tokenizer alone (no weights), so before the model loads, on every path.

    Why here: an example whose assistant tokens are all cut off is dropped (it teaches nothing). The eager path
    counted the drops once every row was templated, after the model had loaded; the lazy and streamed paths only as
    training read them, so a file whose every answer is cut off loaded the model, evaluated on 0 rows and read on.
    The rows read first stand for the rest: what is refused here is what the run would refuse later (all cut off,
    or more than DROP_FAIL_SHARE of at least DROP_FAIL_AFTER), and later rows are still counted as they are read."""
    from ortlab.chat import IGNORE, ChatDataError, encode
    from ortlab.data.lazylm import DROP_FAIL_AFTER, DROP_FAIL_SHARE

    if not tokenizer.is_fast:
        raise DataError("chat data needs a fast tokenizer (it maps tokens to characters); this one is not")
    for split in ("train", "eval"):
        try:
            conversations = prepared.conversations(split, SAMPLE_ROWS)
        except ChatDataError as e:
            raise DataError(f"data: {e}") from None
        read = len(conversations)
        kept = sum(any(t != IGNORE for t in encode(tokenizer, c, max_length)["labels"]) for c in conversations)
        share = read >= DROP_FAIL_AFTER and read - kept > DROP_FAIL_SHARE * read
        if read and (kept == 0 or (split == "train" and share)):
            rows = "training" if split == "train" else "eval"
            consequence = (
                "nothing to learn from"
                if kept == 0 and split == "train"
                else "evaluation would have no rows"
                if kept == 0
                else f"more than {DROP_FAIL_SHARE:.0%} would be dropped"
            )
            raise DataError(
                f"data: {read - kept} of the first {read} {rows} conversations have every assistant token beyond "
                f"hyper.max_length={max_length} (the prompt before the answer fills it), so {consequence}; raise "
                "hyper.max_length or shorten the prompts"
            )


def check_model_and_data(spec: RunSpec, log: Callable[[str], None] = print):
    """The cheap checks, data before models: where the model is, the data against the task, then the model's
    tokenizer, positions and head against the data (config and tokenizer only: no weights). Returns what they found.

    Nothing here materialises a model: the embedded LLM's first conversion from GGUF (20-40 s) waits until the data
    has passed, and a LoRA run's layers are read from a skeleton on the meta device."""

    located = resolve_model(spec.model.name, build=False)  # a folder checked, or a Hub id that exists: no download
    check_model_fits_task(located, spec.task)
    prepared = load_and_check(spec.data, spec.task, spec.seed)
    if prepared.pairs is not None:  # task preference: the shape fits the loss (every row was checked already)
        from ortlab.data.pairdata import check_loss_fits

        check_loss_fits(prepared.pairs, spec.preference.loss)
    columns = (
        f"chat: messages={prepared.messages_column!r}"
        if prepared.messages_column
        else f"chat: prompt={prepared.prompt_column!r} -> response={prepared.response_column!r}"
        if prepared.prompt_column
        else f"source={prepared.text_column!r} -> target={prepared.target_column!r}"
        if prepared.target_column
        else f"{prepared.pairs.shape} pairs: {prepared.pairs.found}"
        if prepared.pairs is not None
        else f"text={prepared.text_column!r}"
        + (f", label={prepared.label_column!r} ({prepared.num_labels} classes)" if prepared.label_column else "")
    )
    log(f"data: {prepared.train_size()} train / {len(prepared.eval)} eval rows, {columns}")
    if prepared.streamed and not spec.hyper.max_steps:
        from ortlab.data import DataError

        raise DataError(
            "data.streaming: a streamed dataset has no known length, so hyper.epochs cannot be counted; set "
            "hyper.max_steps (or data.streaming: false to read it whole)"
        )
    if prepared.streamed and spec.data.shuffle:  # a stream's shuffle is not a permutation: say how far it reaches
        shards = getattr(prepared.train, "num_shards", 1) or 1
        log(
            f"data: the stream is shuffled within a buffer of {data_checks.SHUFFLE_BUFFER:,} rows"
            + (
                f" and by its {shards} shards"
                if shards > 1
                else " (one shard: rows far apart in the source are never swapped; data.streaming: false shuffles "
                "the whole split)"
            )
        )
    eager_why = plan(prepared, spec.task, spec.data.lazy, spec.hyper.max_steps, spec.seed, spec.data.shuffle)
    if eager_why:
        log(eager_why)
    model_path = resolve_model(spec.model.name)  # the embedded LLM is made here, once, now that the data is good
    check_model_fits_task(model_path, spec.task)  # again: the embedded LLM's config exists only now
    tokenizer = check_fit(model_path, spec, prepared, log)
    if (
        prepared.chat or prepared.pairs is not None
    ):  # the tokenizer alone (no weights) says whether the conversations can be laid out
        from ortlab.chat import ChatDataError, require_template
        from ortlab.data import DataError

        try:
            require_template(tokenizer, spec.model.name)
        except ChatDataError as e:
            raise DataError(str(e)) from None
        if prepared.chat:
            check_answers(tokenizer, prepared, prepared.max_length or spec.hyper.max_length)
    if spec.adapter.kind == "lora":
        from ortlab.adapters import check_model

        targets = check_model(model_path, spec.task, spec.adapter.target_modules, spec.model.revision)
        log(f"adapter: LoRA rank {spec.adapter.rank} on {', '.join(targets)}")
    return model_path, prepared


def fitted(spec: RunSpec, prepared: Any) -> RunSpec:
    """`spec` with the max_length the check settled on (the default clipped to the model's positions)."""
    if prepared.max_length is None or prepared.max_length == spec.hyper.max_length:
        return spec
    return spec.model_copy(update={"hyper": spec.hyper.model_copy(update={"max_length": prepared.max_length})})
