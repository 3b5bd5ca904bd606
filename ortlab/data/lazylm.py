"""Causal-LM data as model inputs, eagerly or as training reads it: raw text concatenated and cut into blocks, chat
data rendered with its template (labels on the assistant's tokens only), cut-off examples dropped and counted,
packed on request.

Both paths build their rows with the same functions and the same batches of JOIN_ROWS rows (a block never spans
two batches, a packed row never spans two batches of examples), so they give the same rows in the same order. The
lazy path is datasets' own: the checked split becomes an IterableDataset (`Dataset.to_iterable_dataset`, or the
stream itself), shuffled with a seeded buffer, and `IterableDataset.map` does the rest as the DataLoader asks.

Why lazy only with `hyper.max_steps` (`plan`): the number of blocks (or packed rows) is known only once every row
is tokenized, and epochs, the progress bar and the learning-rate schedule need it. Counting would read all rows
(the cost laziness saves); an estimate would make epochs end where the estimate says, not where the data does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ortlab.chat import IGNORE, check_messages, encode, from_pair, pack
from ortlab.data.prepared import ROW_COLUMN, DataError, Prepared
from ortlab.tasks import get_task

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset, IterableDataset

JOIN_ROWS = 1000  # rows cut into blocks (examples packed) together: datasets' default map batch, as eager runs had
CHAT_BATCH = 64  # unpacked chat rows templated together on the lazy path (each row is its own example)
SHUFFLE_BUFFER = 10_000  # raw rows a lazy run's seeded shuffle draws from (before tokenizing: cheap Arrow rows)
SHARDS = 64  # a lazy split's contiguous slices: the shuffle reads them in a seeded order, loader workers split them
DROP_FAIL_SHARE = 0.5  # a lazy run whose cut-off chat examples exceed this share of those read fails ...
DROP_FAIL_AFTER = 100  # ... once this many were read (the eager path: all of them, before the model trains)


class Dropped:
    """Chat examples read and dropped because hyper.max_length cut off every assistant token (they would teach
    nothing). Counted in shared memory, so that DataLoader worker processes (forked) add to the same counts."""

    def __init__(self) -> None:
        import multiprocessing

        self._counts = multiprocessing.Array("q", 3)  # read, dropped, first dropped row + 1 (0: none)

    def add(self, read: int, dropped_rows: list[int]) -> None:
        with self._counts.get_lock():
            self._counts[0] += read
            self._counts[1] += len(dropped_rows)
            if dropped_rows and not self._counts[2]:
                self._counts[2] = dropped_rows[0] + 1

    @classmethod
    def counted(cls, read: int, dropped: int) -> Dropped:
        """The counts of an eager run (every example read before training)."""
        out = cls()
        out._counts[:] = [read, dropped, 0]
        return out

    def reset(self) -> None:
        with self._counts.get_lock():
            self._counts[:] = [0, 0, 0]

    @property
    def read(self) -> int:
        return self._counts[0]

    @property
    def dropped(self) -> int:
        return self._counts[1]

    def note(self, max_length: int) -> str:
        first = f" (first: row {self._counts[2] - 1})" if self._counts[2] else ""
        return (
            f"chat data: {self.dropped} of {self.read} training examples read were dropped{first}: every assistant "
            f"token was beyond hyper.max_length={max_length}"
        )

    def fail_on_large_share(self, max_length: int) -> None:
        """A large share dropped is a setting to fix, not data to skip quietly."""
        if self.read >= DROP_FAIL_AFTER and self.dropped > DROP_FAIL_SHARE * self.read:
            raise DataError(
                f"data: {self.note(max_length)}, more than {DROP_FAIL_SHARE:.0%}; raise hyper.max_length or shorten "
                "the prompts"
            )


# --- the row functions, shared by both paths -------------------------------------------------------------------


def text_blocks(tokenizer: Any, column: str, max_length: int) -> Callable[[dict], dict]:
    """A batch of raw texts as blocks of max_length tokens: the texts joined (an end-of-sequence token after each,
    blank ones skipped) and cut; the tail that does not fill a block is dropped."""

    def fn(batch: dict) -> dict:
        texts = batch[column]
        bad = [t for t in texts if t is not None and not isinstance(t, str)]
        if bad:
            raise TypeError(f"the text column holds {type(bad[0]).__name__} {bad[0]!r:.60}, not text")
        ids = tokenizer([t for t in texts if t and t.strip()])["input_ids"]
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        flat = [tok for row in ids for tok in row + eos]
        n = (len(flat) // max_length) * max_length
        blocks = [flat[i : i + max_length] for i in range(0, n, max_length)]
        return {"input_ids": blocks, "attention_mask": [[1] * max_length for _ in blocks], "labels": blocks}

    return fn


def chat_rows(tokenizer: Any, prepared: Prepared, max_length: int, dropped: Dropped | None = None):
    """A batch of conversations (or prompt/response pairs) as input_ids and labels (IGNORE but on the assistant's
    tokens), without the examples whose assistant tokens were all cut off (counted in `dropped`)."""
    messages, prompt, response = prepared.messages_column, prepared.prompt_column, prepared.response_column

    def fn(batch: dict) -> dict:
        if messages:
            convs = [check_messages(m, "row") for m in batch[messages]]
        else:
            convs = [from_pair(p, r, "row") for p, r in zip(batch[prompt], batch[response], strict=True)]
        out: dict[str, list] = {"input_ids": [], "labels": []}
        cut: list[int] = []
        positions = batch.get(ROW_COLUMN) or list(range(len(convs)))
        for conv, position in zip(convs, positions, strict=True):
            row = encode(tokenizer, conv, max_length)
            if all(t == IGNORE for t in row["labels"]):
                cut.append(position)
                continue
            out["input_ids"].append(row["input_ids"])
            out["labels"].append(row["labels"])
        if dropped is not None:
            dropped.add(len(convs), cut)
            dropped.fail_on_large_share(max_length)
        return out

    return fn


def packed(max_length: int) -> Callable[[dict], dict]:
    def fn(batch: dict) -> dict:
        return pack(batch["input_ids"], batch["labels"], max_length)

    return fn


# --- the lazy path ---------------------------------------------------------------------------------------------


def plan(prepared: Prepared, task: str, lazy: bool, max_steps: int | None, seed: int, shuffle: bool) -> str | None:
    """Whether a causal-lm run's training rows are prepared as training reads them (`prepared.lazy`); returns why
    not, for the log, when data.lazy asked for it and the run counts epochs."""
    if not get_task(task).blocks or prepared.streamed:
        return None
    prepared.seed, prepared.shuffle = seed, shuffle
    if lazy and max_steps:
        prepared.lazy = True
        return None
    if not lazy:
        return None
    return (
        "data: causal-lm training rows are prepared whole before step 1: hyper.epochs needs the number of blocks "
        "(or packed rows), known only once every row is tokenized; set hyper.max_steps to prepare them as "
        "training reads them"
    )


def lazy_train(prepared: Prepared, tokenizer: Any, max_length: int) -> IterableDataset:
    """The training split as an IterableDataset of model inputs, prepared as it is read. A row that cannot be
    used fails the run naming its position in the source split."""
    from datasets import IterableDataset as Iterable

    train = prepared.train
    if not isinstance(train, Iterable):
        train = train.to_iterable_dataset(num_shards=max(1, min(SHARDS, len(train))))
        if prepared.shuffle:  # shard order and a buffer of raw rows, seeded (the Trainer's set_epoch varies it)
            train = train.shuffle(seed=prepared.seed, buffer_size=SHUFFLE_BUFFER)
    columns = (prepared.head if prepared.head is not None else prepared.train).column_names
    if prepared.chat:
        prepared.dropped = Dropped()
        fn = named_rows(chat_rows(tokenizer, prepared, max_length, prepared.dropped), "train", keep_rows=True)
        batch = JOIN_ROWS if prepared.packing else CHAT_BATCH
        out = train.map(fn, batched=True, batch_size=batch, remove_columns=columns)
        if prepared.packing:
            out = out.map(packed(max_length), batched=True, batch_size=JOIN_ROWS)
        return out
    fn = named_rows(text_blocks(tokenizer, prepared.text_column, max_length), "train")
    return train.map(fn, batched=True, batch_size=JOIN_ROWS, remove_columns=columns)


def lookup_sample(train: Any, rows: int, prepared: Prepared) -> Dataset:
    """The first `rows` prepared training rows as a Dataset, for the acceleration lookup (which draws shuffled
    batches of the run's own data); the drop counts start again after it, so the report counts training alone."""
    from datasets import Dataset

    sample = Dataset.from_list(list(train.take(rows)))
    if prepared.dropped is not None:
        prepared.dropped.reset()
    return sample


def named_rows(fn: Callable[[dict], dict], split: str, keep_rows: bool = False) -> Callable[[dict], dict]:
    """`fn` on a batch without its row positions (kept for `fn` with `keep_rows`); a batch that fails is retried
    row by row, and the first row that fails on its own raises a DataError naming its position."""

    def wrapped(batch: dict) -> dict:
        rows = batch.get(ROW_COLUMN)
        given = batch if keep_rows else {k: v for k, v in batch.items() if k != ROW_COLUMN}
        try:
            return fn(given)
        except DataError:
            raise
        except Exception:
            raise_for_bad_row(fn, given, rows, split)
            raise

    return wrapped


def raise_for_bad_row(fn: Callable[[dict], dict], batch: dict, rows: list[int] | None, split: str) -> None:
    """Find the row of a failed batch that fails on its own, and raise a DataError naming its position."""
    size = len(next(iter(batch.values()), []))
    for i in range(size):
        try:
            fn({k: v[i : i + 1] for k, v in batch.items()})
        except DataError:
            raise
        except Exception as e:
            where = f"row {rows[i]}" if rows is not None else "a row"
            raise DataError(
                f"data: {where} of the {split!r} split (data rows counted from 0) cannot be used: "
                f"{type(e).__name__}: {e}; fix or drop that row"
            ) from e


def report_callback(prepared: Prepared, max_length: int, log: Callable[[str], None]) -> Any:
    """A TrainerCallback that says, when training ends, how many chat examples a lazy run dropped."""
    from transformers import TrainerCallback

    dropped = prepared.dropped

    class DroppedReport(TrainerCallback):
        def on_train_end(self, args, state, control, **kwargs):
            if state.is_world_process_zero and dropped is not None:
                log(dropped.note(max_length))

    return DroppedReport()
