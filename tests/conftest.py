"""Shared test set-up. Tests run offline: nothing may reach the Hugging Face Hub from here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Fail at once instead of retrying for ~30 s if anything tries the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
# ortlab's cache (the doctor's report, measured mixes) is the test session's own: a mix measured by hand on this
# machine must not change what a test's 'auto' run trains with. The runtimes stay where the set-up built them (the
# set-up run by a test must find its compile runtime, not build another in the test cache).
if "ORTLAB_RUNTIMES_DIR" not in os.environ:
    from ortlab.runtimes import runtimes_dir

    os.environ["ORTLAB_RUNTIMES_DIR"] = str(runtimes_dir())
os.environ.setdefault("ORTLAB_CACHE_DIR", str(ROOT / "test-artifacts" / "ortlab-cache"))

sys.path.insert(0, str(ROOT / "tests" / "helpers"))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A 2-layer BERT base model with a WordPiece tokenizer trained on ortlab's embedded text."""
    from tiny_models import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory) -> Path:
    """A 2-layer GPT-2 with a byte-level BPE tokenizer trained on ortlab's embedded text."""
    from tiny_models import build_tiny_gpt2

    return build_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))


@pytest.fixture(scope="session")
def tiny_llama(tiny_gpt2, tmp_path_factory) -> Path:
    """A 2-layer Llama-architecture causal LM (GQA, tied embeddings) with the tiny GPT-2's tokenizer."""
    from tiny_models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), tiny_gpt2)


@pytest.fixture(scope="session")
def tiny_chat_llama(tmp_path_factory) -> Path:
    """A 2-layer Llama-architecture causal LM with a byte-level BPE tokenizer and a ChatML chat template."""
    from tiny_models import build_tiny_chat_llama

    return build_tiny_chat_llama(tmp_path_factory.mktemp("tiny-chat-llama"))


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    """The session's local Ray cluster folder: one cluster for the session (a head and one worker node on this
    machine, 1 CPU each, so a two-worker Ray Train run spans both nodes), started through `ortlab.cluster.start` on
    loopback with token auth, stopped by its PIDs at the end. Use `ray_head`, which (re)starts it."""
    from ortlab import cluster

    folder = tmp_path_factory.mktemp("cluster")
    old = os.environ.get("ORTLAB_CLUSTER_DIR")
    os.environ["ORTLAB_CLUSTER_DIR"] = str(folder)  # the monitors and notebooks started by the tests inherit it
    yield folder
    cluster.stop()
    if old is None:
        os.environ.pop("ORTLAB_CLUSTER_DIR", None)
    else:
        os.environ["ORTLAB_CLUSTER_DIR"] = old


@pytest.fixture
def ray_head(ray_session):
    """The session's cluster, running: started on first use (~20 s), the running one's record after that (a test
    that stops it, such as `ortlab cluster stop`'s, costs the next one a start, not a failure)."""
    from ortlab import cluster

    return cluster.start(num_cpus=1, nodes=2)


@pytest.fixture(scope="session")
def remote_spec(tiny_bert, tmp_path_factory):
    """make(name, max_steps, **target): a tiny-BERT spec dict for the local head, in a runs folder of its own."""
    root = tmp_path_factory.mktemp("remote-runs")

    def make(name: str, max_steps: int = 12, **target) -> dict:
        return {
            "name": name,
            "output_dir": str(root),
            "model": {"name": str(tiny_bert)},
            "data": {"source": "embedded:rotten-tomatoes", "max_train_samples": 400, "max_eval_samples": 32},
            "hyper": {"learning_rate": 1e-3, "batch_size": 8, "max_length": 32, "max_steps": max_steps},
            "accel": {"ort": False, "fused_adam": False},
            "target": {"cluster": "local", **target},
        }

    return make


# --- the suite's time budget (issue #26) ---------------------------------------------------------------------------
# `scripts/dev test` passes --suite-budget-s: the last line of its output says how long the session took against
# CI's budget, next to the slowest tests (--durations), so a suite that drifts towards the limit shows at once.
_SESSION_STARTED: list[float] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--suite-budget-s",
        type=float,
        default=0.0,
        help="print how long the session took against this many seconds (0: say nothing)",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    import time

    _SESSION_STARTED.append(time.monotonic())


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    import time

    budget = config.getoption("--suite-budget-s")
    if not budget or not _SESSION_STARTED:
        return
    took = time.monotonic() - _SESSION_STARTED[0]
    verdict = "within" if took <= budget else "OVER"
    markup = {"green": True} if took <= budget else {"red": True, "bold": True}
    terminalreporter.write_line(
        f"suite time: {took / 60:.1f} min of the {budget / 60:.0f} min budget ({verdict}, {took / budget:.0%}); "
        "the slowest tests are listed above",
        **markup,
    )
