"""What `ortlab train` shows in the terminal: ortlab's own lines, one progress bar, the result. Nothing else.

A foreground run pulls in torch, transformers, datasets, DeepSpeed and onnxruntime, and each of them talks:
load reports, "Setting accelerator to CPU", CUDA warnings, FutureWarnings, tqdm bars, Trainer's raw log dicts.
Some of it comes from C++ (ORT) or from loggers that grabbed `sys.stderr` at import, so no Python-level filter
catches it all. `Terminal` therefore moves the process's file descriptors 1 and 2 into a file (first a
temporary one, then the run's `logs/run.log` once the run folder exists) and keeps a private copy of the real
terminal for ortlab's lines and the progress bar. The run log keeps the full output for when something goes
wrong; `--verbose` skips the capture and shows everything as it comes.

Importing this module is cheap (rich and transformers are imported when first needed).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ortlab import safeio
from ortlab.accel.mix import MixError
from ortlab.assets import AssetMissing
from ortlab.data import DataError
from ortlab.runfolder import events
from ortlab.runfolder.stream import RunSummary
from ortlab.spec import SpecError
from ortlab.tasks import ModelError


class Terminal:
    """The user's terminal during a foreground run.

        with Terminal(verbose=False) as term:
            term.say("checking the data ...")
            term.log_to(run.log_path)          # once the run folder exists: the captured output moves there
            ...                                # third-party output lands in the log, not on the screen

    `say` prints an ortlab line; `callback()` is the TrainerCallback that draws the progress bar and says what
    the long steps are; `on_record` receives the run's metrics records (loss and samples/s for the bar).
    """

    def __init__(self, verbose: bool = False, progress: bool = True):
        self.verbose = verbose
        self.progress = progress
        self.log_path: Path | None = None
        self.console: Any = None
        self._term: IO[str] | None = None
        self._saved_fds: tuple[int, int] | None = None
        self._capture: IO[bytes] | None = None
        self._capture_path: Path | None = None
        self._bar: Any = None
        self._eval: Any = None
        self._train_started = 0.0
        self._graph_pending = False
        self.summary = RunSummary()  # the run's records folded as they come: the bar shows its latest step

    # --- the capture -----------------------------------------------------------------------------------------

    def __enter__(self) -> Terminal:
        from rich.console import Console

        _flush_std()
        width = shutil.get_terminal_size().columns  # before fd 1 becomes a file
        try:
            sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: stdout is not a real file
            self.verbose = True  # nothing to capture from (e.g. a test runner's in-memory stdout)
        if self.verbose:
            self.console = Console(highlight=False, width=width)
            return self
        self._term = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
        self.console = Console(file=self._term, highlight=False, width=width)
        fd, name = tempfile.mkstemp(prefix="ortlab-output-", suffix=".log")
        self._capture, self._capture_path = os.fdopen(fd, "ab"), Path(name)
        self._saved_fds = (os.dup(1), os.dup(2))
        os.dup2(self._capture.fileno(), 1)
        os.dup2(self._capture.fileno(), 2)
        return self

    def log_to(self, path: Path) -> None:
        """From now on the captured output goes to `path` (the run's log), with what was captured so far."""
        self.log_path = Path(path)
        if self._capture is None:
            return
        _flush_std()
        log = os.fdopen(_open_log(path), "ab")
        if self._capture_path is not None:
            log.write(self._capture_path.read_bytes())
            log.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        self._capture.close()
        if self._capture_path is not None:
            self._capture_path.unlink(missing_ok=True)
        self._capture, self._capture_path = log, None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close_bars()
        if self._saved_fds is None:
            return
        _flush_std()
        out, err = self._saved_fds
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        self._saved_fds = None
        if self._capture is not None:
            self._capture.close()
            self._capture = None  # from here on, `say` writes to the terminal only
        if self._capture_path is not None:
            # The run folder never came to be (bad input, or a crash before it): nothing to keep for a user error;
            # for anything else the captured output may explain it.
            if exc_type is not None and not _is_user_error(exc):
                self.say(f"[dim]other output of this run: {escape(str(self._capture_path))}[/]")
            else:
                self._capture_path.unlink(missing_ok=True)
        elif exc_type is not None and self.log_path is not None:
            self.say(f"[dim]full output: {escape(str(self.log_path))}[/]")
        if self._term is not None:
            self._term.flush()

    # --- ortlab's lines ----------------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        """One ortlab line on the terminal (rich markup allowed), and in the log too, so the log tells it all.
        Text that carries anything from a spec, a file or a run folder goes through `plain` instead."""
        self.console.print(text)
        if self._capture is not None:
            from rich.text import Text

            _flush_std()
            os.write(1, f"[ortlab] {Text.from_markup(text).plain}\n".encode())

    def plain(self, text: str) -> None:
        """`say` for text with no markup of ortlab's own: a model name, a path or a message from a run folder can
        hold `[/x]`, which rich would read as markup (and raise on, or style the rest of the line with)."""
        self.say(escape(text))

    def on_record(self, record: dict[str, Any]) -> None:
        """A metrics record of the run: steps move the bar; an acceleration that did not apply is said at once."""
        self.summary.fold(record)
        event = record.get("event")
        if event == events.STEP and self._bar is not None:
            if self._graph_pending:
                self._graph_pending = False
                took = time.monotonic() - self._train_started
                self.say(f"training graph ready ({took:.1f} s, first step included)")
            loss, sps = self.summary.loss, self.summary.samples_per_s
            self._bar.update(
                self._bar.task_ids[0],
                completed=self.summary.step,
                loss=f"loss {loss:.4f}" if loss is not None else "",
                speed=f"{sps:.1f} samples/s" if sps is not None else "",
            )
        elif event == events.ACCELERATION and record.get("message"):
            self.say(f"[red]{escape(str(record['message']))}[/]")
        elif event == events.GENERATIONS:
            from ortlab.chat import generation_lines

            for line in generation_lines(record):  # model output: control characters stripped, markup escaped
                self.say(escape(line))

    def callback(self) -> Any:
        """A TrainerCallback that announces the long steps and draws the bars (imports transformers)."""
        from transformers import TrainerCallback

        terminal = self

        class TerminalProgress(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                terminal._start_training(state.max_steps, state.global_step, bool(getattr(args, "use_ort", False)))

            def on_train_end(self, args, state, control, **kwargs):
                terminal.close_bars()

            def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
                terminal._eval_step(eval_dataloader)

            def on_evaluate(self, args, state, control, **kwargs):
                terminal._end_eval()

        return TerminalProgress()

    # --- bars -------------------------------------------------------------------------------------------------

    def _start_training(self, max_steps: int, step: int, ort: bool) -> None:
        self._train_started = time.monotonic()
        if ort:
            self._graph_pending = True
            self.say("ONNX Runtime is building the training graph (once per model shape) ...")
        if not self.progress or self.verbose:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        bar_width = max(10, min(40, self.console.width - 62))
        self._bar = Progress(
            TextColumn("training"),
            BarColumn(bar_width=bar_width),
            MofNCompleteColumn(),
            TextColumn("{task.fields[loss]}"),
            TextColumn("{task.fields[speed]}"),
            TimeRemainingColumn(elapsed_when_finished=True),
            console=self.console,
            redirect_stdout=False,  # rich would route sys.stdout/err (third-party prints) to the screen
            redirect_stderr=False,
        )
        self._bar.add_task("training", total=max_steps, completed=step, loss="", speed="")
        self._bar.start()

    def _eval_step(self, dataloader: Any) -> None:
        if not self.progress or self.verbose or self._bar is not None:
            return  # evaluations inside training stay under the training bar
        if self._eval is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            total = len(dataloader) if dataloader is not None and hasattr(dataloader, "__len__") else None
            self._eval = Progress(
                TextColumn("evaluating"),
                BarColumn(bar_width=20),
                MofNCompleteColumn(),
                TextColumn("batches"),
                console=self.console,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._eval.add_task("eval", total=total)
            self._eval.start()
        self._eval.advance(self._eval.task_ids[0])

    def _end_eval(self) -> None:
        if self._eval is not None:
            self._eval.stop()
            self._eval = None

    def close_bars(self) -> None:
        self._end_eval()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


@contextlib.contextmanager
def captured_output(path: str | os.PathLike) -> Iterator[None]:
    """Everything printed inside the block, by Python (print, warnings, logging) or by C/C++ code, goes to the end
    of `path` (a run's log) instead of the terminal or the notebook.

    For library work done in the user's own process, such as the ONNX export in a notebook's kernel (torch's
    TracerWarnings, onnxruntime's CUDA notes, DeepSpeed's accelerator line). A logging handler that a library
    created inside the block (bound to the log file) is handed back the real stderr afterwards.
    """
    path = Path(path)
    fd = _open_log(path)
    _flush_std()
    saved = (os.dup(1), os.dup(2))
    streams = (sys.stdout, sys.stderr)
    log = os.fdopen(fd, "a", buffering=1, encoding="utf-8", errors="replace")
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        yield
    finally:
        _flush_std()
        sys.stdout, sys.stderr = streams
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        _rebind_handlers(log, streams[1])
        log.close()


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' and datasets' progress bars off inside the block (back as they were after). In a notebook
    they are widgets, not printed text, so no output capture removes them; a one-off export needs none."""
    from datasets.utils import logging as datasets_logging
    from transformers.utils import logging as transformers_logging

    switches = [(m, m.is_progress_bar_enabled()) for m in (transformers_logging, datasets_logging)]
    for module, _ in switches:
        module.disable_progress_bar()
    try:
        yield
    finally:
        for module, was_on in switches:
            if was_on:
                module.enable_progress_bar()


def _rebind_handlers(old: Any, new: Any) -> None:
    import logging

    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, logging.StreamHandler) and handler.stream is old:
                handler.setStream(new)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _is_user_error(exc: BaseException | None) -> bool:
    """Bad input (told to the user in one line): its captured output would only be noise."""

    return isinstance(exc, (SpecError, DataError, ModelError, MixError, AssetMissing))


def _open_log(path: Path) -> int:
    """A run's log (`<run>/logs/run.log`) opened for append without following a link at logs/ or at the file:
    the run folder may be one ortlab did not write, and its output must not land where a planted link points."""
    return safeio.open_in(path.parent.parent, f"{path.parent.name}/{path.name}", os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def escape(text: str) -> str:
    """rich markup made literal (rich is imported when first needed: importing this module stays cheap)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)
