"""Shared test set-up. Tests run offline: nothing may reach the Hugging Face Hub from here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Fail at once instead of retrying for ~30 s if anything tries the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# trl (on sys.path in the preference tests' workers) warns on importing trl.experimental with a category of its own;
# xdist's controller, which has no trl, cannot unpickle that warning and crashes (CI saw it: "No module named
# 'trl'", the worker replaced, the run ended in INTERNALERROR). trl's own switch keeps the notice from being sent.
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
# ortlab's cache (the doctor's report, measured mixes) is the test session's own: a mix measured by hand on this
# machine must not change what a test's 'auto' run trains with. The runtimes stay where the set-up built them (the
# set-up run by a test must find its compile runtime, not build another in the test cache).
if "ORTLAB_RUNTIMES_DIR" not in os.environ:
    from ortlab.runtimes import runtimes_dir

    os.environ["ORTLAB_RUNTIMES_DIR"] = str(runtimes_dir())
# Object storage: the tests' S3 server (moto, `s3_store`) accepts any credentials, and pyarrow's client wants some.
# Set before anything starts, so the session's Ray cluster (whose jobs read the store) has the same environment; a
# real AWS credential in the environment never signs a test's request.
# The secret differs from the key ID, so that a test can look for the secret itself in what was written.
os.environ.update(AWS_ACCESS_KEY_ID="ortlab-test", AWS_SECRET_ACCESS_KEY="ortlab-test-secret-7c1e")
os.environ.update(AWS_DEFAULT_REGION="us-east-1")
os.environ.update(AWS_EC2_METADATA_DISABLED="true")

# Under pytest-xdist (`scripts/dev test` runs two workers) each worker has a cache of its own, and its torch one
# core's worth of threads: two workers' OpenMP pools spinning on the same two cores slow both down.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
os.environ.setdefault("ORTLAB_CACHE_DIR", str(ROOT / "test-artifacts" / "ortlab-cache" / (WORKER or "main")))
if WORKER:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))

sys.path.insert(0, str(ROOT / "tests" / "helpers"))

import pytest  # noqa: E402

# --- how the suite is split between xdist workers ------------------------------------------------------------------
# `--dist loadgroup` keeps an `xdist_group` on one worker. Every module is its own group (module fixtures, such as a
# run trained once for a module's tests, are built once, and a module's report file is written by one worker), and
# every test on the session's Ray cluster shares the group RAY_GROUP, so that one worker starts one cluster. The
# longest groups are handed out first, so that no long module starts last while the other worker idles: the
# cluster's (about 15 minutes), then the modules of several minutes each (from `scripts/dev test`'s --durations;
# keep the list in step with it).
RAY_GROUP = "ray-cluster"
LONGEST_MODULES = ("test_notebooks", "test_reliability", "test_tune", "test_runs", "test_export_publish")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        groups = [m.args[0] if m.args else m.kwargs.get("name") for m in item.iter_markers("xdist_group")]
        if "ray_head" in getattr(item, "fixturenames", ()) and RAY_GROUP not in groups:
            raise pytest.UsageError(f"{item.nodeid} uses the session's Ray cluster: mark it xdist_group({RAY_GROUP!r})")
        if not groups:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    if WORKER:  # longest first (items keep their order within a group)
        first = [RAY_GROUP, *LONGEST_MODULES]
        rank = {name: i for i, name in enumerate(first)}

        def order(item: pytest.Item) -> int:
            name = next(m.args[0] for m in item.iter_markers("xdist_group") if m.args)
            return rank.get(name.removeprefix("tests."), len(first))

        items.sort(key=order)


@pytest.fixture(autouse=True)
def _no_log_handler_on_a_closed_stream():
    """A library that creates its logging handler during a test binds it to sys.stderr as it is then: with capfd or
    capsys, a capture stream that pytest closes after the test. Every later log line of that library, in any later
    test of the same process, then prints a '--- Logging error --- Traceback' into the output that the CLI tests
    read (seen once the suite ran on two xdist workers, in another order). After each test, such a handler gets the
    real stderr back. (A user's process has no capture streams; ortlab's own capture hands handlers back itself.)"""
    yield
    import logging

    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", False):
                with handler.lock:  # (not setStream: it flushes the old stream first, which is closed)
                    handler.stream = sys.__stderr__


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
def chat_lora_run(tiny_chat_llama, tmp_path_factory) -> Path:
    """A completed LoRA run (4 steps) of the tiny chat Llama on a few conversations: its folder. The chat server,
    the endpoint and the playground talk to it (and to its base model)."""
    import json
    import shutil

    from ortlab.runner import train_spec
    from ortlab.spec import RunSpec

    folder = tmp_path_factory.mktemp("chat-lora")
    # The tiny chat Llama knows 256 positions; its copy here knows 4096 (rotary positions: no weight changes), so
    # that a 2048-token reply fits and Stop can be tested on a reply that is still going.
    model = shutil.copytree(tiny_chat_llama, folder / "base")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    turns = [(f"Is review {i} fresh?", "fresh" if i % 2 else "rotten") for i in range(48)]
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in turns]
    (folder / "chat.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    spec = {
        "name": "chat-lora",
        "task": "causal-lm",
        "model": {"name": str(model)},
        "output_dir": str(folder / "runs"),
        "data": {"source": str(folder / "chat.jsonl"), "eval_fraction": 0.25},
        "hyper": {"max_steps": 4, "batch_size": 4, "learning_rate": 3e-3, "max_length": 64},
        "accel": {"ort": False, "fused_adam": False, "precision": "fp32", "tune": "off"},
        "adapter": {"kind": "lora", "rank": 4, "alpha": 8, "dropout": 0.0},
    }
    train_spec(RunSpec.parse(spec), progress=False, log=lambda _: None)
    return folder / "runs" / "chat-lora"


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
def s3_server(tmp_path_factory):
    """An S3-protocol server on loopback for the session (moto's server mode, in its own process): the real
    protocol to pyarrow's real S3 client, as MinIO or AWS would answer. Yields its endpoint URL."""
    import subprocess
    import time
    import urllib.request

    from ortlab.netutil import free_port

    port = free_port()
    log = tmp_path_factory.mktemp("s3") / "moto.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=2).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the S3 test server did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)
    yield endpoint
    server.terminate()
    server.wait(timeout=30)


@pytest.fixture
def s3_store(s3_server, request):
    """A fresh bucket on the session's S3 server; returns the storage URI (s3://BUCKET/runs?endpoint_override=...)."""
    import re
    import secrets

    from pyarrow import fs as pafs

    bucket = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + secrets.token_hex(3)
    options = f"endpoint_override={s3_server}&scheme=http"
    pafs.FileSystem.from_uri(f"s3://{bucket}?{options}&allow_bucket_creation=true")[0].create_dir(bucket)
    return f"s3://{bucket}/runs?{options}"


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


@pytest.fixture
def load_benchmark(monkeypatch):
    """`load_benchmark(name)`: benchmarks/<name>.py imported as module `name` (with benchmarks/ on the path for its
    `common` import), for a test that runs its `main`; both undone after the test."""
    import importlib.util

    def load(name: str):
        monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)  # (dataclasses and pickling look a module up by name)
        spec.loader.exec_module(module)
        return module

    return load


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--suite-budget-s",
        type=float,
        default=0.0,
        help="print how long the session took against this many seconds (0: say nothing)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # With a budget (`scripts/dev test`, CI), the controller also says where the time went, per file and per worker.
    if config.getoption("--suite-budget-s") and not WORKER:
        from suitetime import SuiteTimes

        config.pluginmanager.register(SuiteTimes(ROOT / "test-artifacts" / "suite-times.json"), "ortlab-suite-times")


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
