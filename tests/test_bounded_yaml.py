"""A spec from elsewhere cannot explode its reader (issue #48, item 1): YAML aliases refused, nesting bounded, and
every message about a spec built from a bounded repr.

A few hundred bytes of nested aliases ("billion laughs") describe billions of nodes; a run folder's spec.yaml of
that kind made the sidebar's run-detail request take 21 s, one level deeper a MemoryError at 3 GiB. Memory is
measured with tracemalloc (deterministic), not time.
"""

from __future__ import annotations

import tracemalloc

import pytest

from ortlab.runfolder.rundir import RunDir
from ortlab.spec import RunSpec, SpecError

# Nine levels of ten aliases each: 10**9 strings once expanded, 400-odd bytes of text.
LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{b}: &{b} [{','.join(['*' + a] * 10)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)
HYPER_LAUGHS = LAUGHS.replace("a: &a", "x: &a", 1) + "hyper: {batch_size: *i}\n"


def _peak_mb(read) -> float:
    tracemalloc.start()
    try:
        read()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak / 2**20


@pytest.fixture
def planted(tmp_path) -> RunDir:
    run = RunDir.create(tmp_path / "runs", RunSpec(name="planted"))
    (run.path / "spec.yaml").write_text(HYPER_LAUGHS)
    return run


def test_aliases_in_a_run_folders_spec_are_refused_before_anything_is_built(planted):
    assert len(HYPER_LAUGHS) < 1000

    def read() -> None:
        with pytest.raises(SpecError, match=r"an alias \(\*name\) on line 2: ortlab does not expand YAML aliases"):
            RunSpec.from_run(planted)

    assert _peak_mb(read) < 10


def test_the_server_answers_a_planted_alias_spec_with_its_error(tmp_path, planted):
    from ortlab.server.runindex import RunIndex

    index = RunIndex(planted.path.parent)
    detail = _peak_mb(lambda: index.detail(planted))
    assert detail < 20
    body = index.detail(planted)
    assert body["spec"] is None and "alias" in body["spec_error"], body


def test_nesting_is_bounded():
    deep = "hyper: " + "[" * 5000 + "]" * 5000 + "\n"
    with pytest.raises(SpecError, match="nested more than 32 levels deep"):
        RunSpec.from_yaml(deep)


def test_messages_quote_a_bounded_part_of_what_they_refuse():
    huge = "x" * 1_000_000
    with pytest.raises(SpecError) as raised:
        RunSpec.parse({"hyper": {"batch_size": huge}})
    assert len(str(raised.value)) < 400 and "batch_size" in str(raised.value)
    many = {f"unknown_{i}": i for i in range(5000)}
    with pytest.raises(SpecError) as raised:
        RunSpec.parse(many)
    lines = str(raised.value).splitlines()
    assert len(lines) <= 33 and "... and 4970 more problems" in lines[-1], lines[-3:]
    long_key = {"k" * 100_000: 1}
    with pytest.raises(SpecError) as raised:
        RunSpec.parse(long_key)
    assert len(str(raised.value)) < 400


def test_ordinary_yaml_reads_as_before():
    spec = RunSpec.parse({"name": "plain", "hyper": {"batch_size": 4}, "data": {"max_train_samples": 64}})
    assert RunSpec.from_yaml(spec.to_yaml()) == spec
    with pytest.raises(SpecError, match="not YAML ortlab reads"):
        RunSpec.from_yaml("hyper: [unclosed\n")


@pytest.mark.parametrize("name", ["status.json", "result.json"])
def test_a_deeply_nested_json_file_is_damaged_not_a_traceback(tmp_path, name):
    run = RunDir.create(tmp_path / "runs", RunSpec(name="deep"))
    (run.path / name).write_text("[" * 100_000 + "]" * 100_000)
    if name == "status.json":
        status = run.status()
        assert status["state"] == "damaged" and "nested too deep" in status["damaged"], status
    else:
        result, why = run.read_result()
        assert result is None and "nested too deep" in why
