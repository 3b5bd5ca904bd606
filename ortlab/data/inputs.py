"""Turning checked data into model inputs: token ids and labels per task (chat data rendered with its template,
packed on request), and the batch collator of each task. Tokenized datasets are cached by `datasets` (keyed on
the data, the tokenizer and the settings), so a second run over the same data starts at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ortlab.chat import ChatDataError
from ortlab.data.lazylm import JOIN_ROWS, Dropped, chat_rows, lazy_train, named_rows, packed, text_blocks
from ortlab.data.prepared import DataError, Prepared
from ortlab.tasks import get_task

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset


def tokenize(
    prepared: Prepared, tokenizer: Any, task: str, max_length: int, max_target_length: int | None = None
) -> tuple[Dataset, Dataset]:
    """Token ids (and label ids) for both splits; the original columns are dropped. For seq2seq, `max_length`
    cuts the source and `max_target_length` (default: `max_length`) the target."""
    if prepared.chat:
        return _tokenize_chat(prepared, tokenizer, max_length)
    record = get_task(task)
    fn = record.part("rows")(prepared, tokenizer, max_length, max_target_length)
    if prepared.lazy and record.blocks:  # ortlab.data.lazylm.plan: max_steps set (or a stream): cut as read
        return lazy_train(prepared, tokenizer, max_length), _eager(prepared.eval, fn, "eval")
    if prepared.lazy:  # one row in, one row out: tokenized as the trainer reads it
        columns = prepared.head.column_names if prepared.head is not None else None  # a stream's columns
        return lazy_rows(prepared.train, fn, "train", columns), lazy_rows(prepared.eval, fn, "eval")

    train, evaluation = _eager(prepared.train, fn, "train"), _eager(prepared.eval, fn, "eval")
    if len(train) == 0:
        raise DataError(
            f"data: no training examples after tokenizing (causal LM needs at least {max_length} tokens of text; "
            "lower hyper.max_length or add text)"
        )
    return train, evaluation


# --- each task's row tokenizer (its record's `rows`): `(prepared, tokenizer, max_length, max_target_length)` -----


def _label_ids(prepared: Prepared) -> Callable[[Any], int]:
    index = {name: i for i, name in enumerate(prepared.label_names)}

    def to_id(value: Any) -> int:
        return index[str(value)] if not isinstance(value, int) or str(value) in index else value

    return to_id


def sequence_rows(prepared: Prepared, tokenizer: Any, max_length: int, max_target_length: int | None = None) -> Any:
    """A text (or pair) and its label."""
    text, pair, label, to_id = (
        prepared.text_column,
        prepared.text_pair_column,
        prepared.label_column,
        _label_ids(prepared),
    )

    def fn(batch: dict) -> dict:
        args = (batch[text], batch[pair]) if pair else (batch[text],)
        out = tokenizer(*args, truncation=True, max_length=max_length)
        out["labels"] = [to_id(v) for v in batch[label]]
        return out

    return fn


def token_rows(prepared: Prepared, tokenizer: Any, max_length: int, max_target_length: int | None = None) -> Any:
    """Word lists and a tag per word: the first sub-token of each word carries its tag."""
    text, label, to_id = prepared.text_column, prepared.label_column, _label_ids(prepared)

    def fn(batch: dict) -> dict:
        out = tokenizer(batch[text], is_split_into_words=True, truncation=True, max_length=max_length)
        all_labels = []
        for i, tags in enumerate(batch[label]):
            previous, row = None, []
            for word in out.word_ids(i):
                # Label the first sub-token of each word; -100 (ignored) for the rest and special tokens.
                row.append(-100 if word is None or word == previous else to_id(tags[word]))
                previous = word
            all_labels.append(row)
        out["labels"] = all_labels
        return out

    return fn


def seq2seq_rows(prepared: Prepared, tokenizer: Any, max_length: int, max_target_length: int | None = None) -> Any:
    """A source text and its target's ids as labels."""
    text, target = prepared.text_column, prepared.target_column

    def fn(batch: dict) -> dict:
        out = tokenizer(batch[text], truncation=True, max_length=max_length)
        # text_target: tokenizers with a separate target vocabulary (Marian) switch to it for the labels
        labels = tokenizer(text_target=batch[target], truncation=True, max_length=max_target_length or max_length)
        out["labels"] = labels["input_ids"]
        return out

    return fn


def block_rows(prepared: Prepared, tokenizer: Any, max_length: int, max_target_length: int | None = None) -> Any:
    """Causal LM text: concatenated and cut into blocks of max_length."""
    return text_blocks(tokenizer, prepared.text_column, max_length)


def _eager(ds: Dataset, fn: Callable[[dict], dict], what: str) -> Dataset:
    """Every row of `ds` through `fn` now (in datasets' batches of JOIN_ROWS rows), cached by datasets."""
    return ds.map(fn, batched=True, batch_size=JOIN_ROWS, remove_columns=ds.column_names, desc=f"tokenizing {what}")


STREAM_BATCH = 64  # a stream's rows tokenized together: a few training batches ahead, not datasets' default 1000


def lazy_rows(ds: Dataset, fn: Callable[[dict], dict], split: str, columns: list[str] | None = None) -> Dataset:
    """`ds` with `fn` applied to the rows a reader asks for, when it asks (datasets' `with_transform`): nothing is
    tokenized before step 1, a run of N steps tokenizes its N batches, and the length, the seeded shuffle of the
    trainer's sampler and a resume's skip (which draws indices, not rows) are those of the eager path.

    A row that `fn` cannot take (the checks before the model saw every value, but not every combination, e.g. a
    word list and its tags of different lengths) fails the run with the row's position in its source split.
    A stream (streamed data: `columns` are its raw columns, dropped from the output) is mapped the same way."""

    transform = named_rows(fn, split)

    if not hasattr(ds, "__len__"):  # a stream (IterableDataset): its map is lazy, run as the trainer iterates
        return ds.map(transform, batched=True, batch_size=STREAM_BATCH, remove_columns=columns)
    return ds.with_transform(transform)


def _tokenize_chat(prepared: Prepared, tokenizer: Any, max_length: int) -> tuple[Dataset, Dataset]:
    """Conversations rendered with the chat template; labels on the assistant's tokens only; packed on request
    (training split only: evaluation scores each example on its own, so the same examples give the same loss)."""

    if not tokenizer.is_fast:
        raise DataError("chat data needs a fast tokenizer (it maps tokens to characters); this one is not")
    fn = chat_rows(tokenizer, prepared, max_length)  # cut-off examples dropped (counted below)

    def run(ds: Dataset, what: str) -> Dataset:
        try:
            return ds.map(fn, batched=True, remove_columns=ds.column_names, desc=f"formatting chat {what}")
        except ChatDataError as e:
            raise DataError(f"data: {e}") from None

    evaluation = run(prepared.eval, "eval")
    if prepared.lazy:  # ortlab.data.lazylm.plan: max_steps set (or a stream): templated and packed as read
        return lazy_train(prepared, tokenizer, max_length), evaluation
    train = run(prepared.train, "train")
    prepared.dropped = Dropped.counted(len(prepared.train), len(prepared.train) - len(train))
    prepared.dropped.fail_on_large_share(max_length)  # a large share dropped fails here, as it does on the lazy path
    if len(train) == 0:
        raise DataError(
            f"data: no training example keeps an assistant token within hyper.max_length={max_length}; raise "
            "hyper.max_length or shorten the prompts"
        )
    if prepared.packing:
        train = train.map(packed(max_length), batched=True, batch_size=JOIN_ROWS, desc="packing train")
    return train, evaluation


def collator(
    task: str,
    tokenizer: Any,
    model: Any = None,
    prepared: Prepared | None = None,
    pad_to_multiple_of: int | None = None,
) -> Any:
    """The batch collator of `task` (chat data: its own). `pad_to_multiple_of` pads each batch's length up to a
    multiple (torch.compile runs use 8: fewer distinct shapes for Dynamo to compile for, and lengths that tensor
    cores tile evenly)."""
    from transformers import DataCollatorForSeq2Seq

    if prepared is not None and prepared.chat:
        if prepared.packing:
            from ortlab.chat import PackedCollator

            return PackedCollator(tokenizer.pad_token_id)
        # Examples of different lengths: ids padded with the pad token, labels with -100 (out of the loss).
        return DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100, pad_to_multiple_of=pad_to_multiple_of)
    return get_task(task).part("collate")(tokenizer, model, prepared, pad_to_multiple_of)


# --- each task's collator (its record's `collate`): `(tokenizer, model, prepared, pad_to_multiple_of)` ------------


def seq2seq_collator(
    tokenizer: Any, model: Any = None, prepared: Any = None, pad_to_multiple_of: int | None = None
) -> Any:
    """Labels padded with -100 (left out of the loss); with the model, decoder_input_ids are built from the labels
    here, as the model would shift them itself."""
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(
        tokenizer, model=model, label_pad_token_id=-100, pad_to_multiple_of=pad_to_multiple_of
    )


def padding_collator(
    tokenizer: Any, model: Any = None, prepared: Any = None, pad_to_multiple_of: int | None = None
) -> Any:
    from transformers import DataCollatorWithPadding

    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


def token_collator(
    tokenizer: Any, model: Any = None, prepared: Any = None, pad_to_multiple_of: int | None = None
) -> Any:
    from transformers import DataCollatorForTokenClassification

    return DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


def block_collator(
    tokenizer: Any, model: Any = None, prepared: Any = None, pad_to_multiple_of: int | None = None
) -> Any:
    from transformers import default_data_collator

    return default_data_collator  # causal LM blocks all have the same length
