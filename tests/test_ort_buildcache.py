"""ORTModule's extensions are compiled once per torch/ORT/Python/compiler/sources and copied from ortlab's cache
after that (`ortlab.accel.ort_buildcache`). The extensions' setup.py here is a stand-in that writes a file where
the real one writes its compiled library and counts how often it ran: the cache's logic, not the compiler, is
under test (the real three-minute build runs in every fresh set-up)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ortlab.accel import ort, ort_buildcache

FAKE_SETUP = """
import sys, pathlib
base = pathlib.Path(sys.argv[sys.argv.index("--build-base") + 1])
name = pathlib.Path(__file__).parent.name
(base / "lib.fake").mkdir(parents=True, exist_ok=True)
(base / "lib.fake" / f"{name}.cpython-fake.so").write_text(f"compiled {name}")
with open(pathlib.Path(__file__).parent.parent.parent / "compiles.log", "a") as log:
    log.write(name + "\\n")
"""


@pytest.fixture
def ext_dir(tmp_path, monkeypatch) -> Path:
    ext = tmp_path / "torch_cpp_extensions"
    for name in ort.EXTENSIONS:
        (ext / "cpu" / name).mkdir(parents=True)
        (ext / "cpu" / name / "setup.py").write_text(FAKE_SETUP)
    monkeypatch.setattr(ort, "extensions_dir", lambda: ext)
    monkeypatch.setenv("ORTLAB_CACHE_DIR", str(tmp_path / "cache"))
    return ext


def compiles(ext: Path) -> int:
    log = ext / "compiles.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def remove_built(ext: Path) -> None:
    for so in ext.glob("*.so"):
        so.unlink()


def test_a_second_environment_copies_the_build_instead_of_compiling(ext_dir):
    assert ort.build_extensions() is True
    assert compiles(ext_dir) == 2 and ort.extensions_built()
    remove_built(ext_dir)  # a fresh environment: same versions, nothing built
    assert not ort.extensions_built()
    assert ort.build_extensions() is True
    assert compiles(ext_dir) == 2, "the cached build was compiled again"
    assert ort.extensions_built()
    assert (ext_dir / "aten_op_executor.cpython-fake.so").read_text() == "compiled aten_op_executor"


def test_changed_sources_or_versions_miss_the_cache(ext_dir, monkeypatch):
    ort.build_extensions()
    remove_built(ext_dir)
    with open(ext_dir / "cpu" / "aten_op_executor" / "setup.py", "a") as f:
        f.write("# changed\n")
    ort.build_extensions()
    assert compiles(ext_dir) == 4
    remove_built(ext_dir)
    monkeypatch.setattr(ort, "_built_for", lambda: "torch 9.9, onnxruntime-training 9.9")
    ort.build_extensions()
    assert compiles(ext_dir) == 6


def test_a_cache_others_can_write_into_or_a_planted_library_is_not_used(ext_dir):
    ort.build_extensions()
    entry = next(p for p in (Path(os.environ["ORTLAB_CACHE_DIR"]) / "ort-extensions").iterdir())
    # A library in the entry that others may write: not loaded into every ORT run.
    so = next(entry.glob("*.so"))
    so.chmod(0o666)
    remove_built(ext_dir)
    ort.build_extensions()
    assert compiles(ext_dir) == 4
    # A link where a library should be: not followed.
    so.chmod(0o644)
    so.unlink()
    so.symlink_to(ext_dir / "cpu" / "aten_op_executor" / "setup.py")
    remove_built(ext_dir)
    ort.build_extensions()
    assert compiles(ext_dir) == 6
    # The refused entry was replaced by the fresh build; an entry without its completion mark (a store that was
    # killed) is not used.
    fresh = ort_buildcache.key(ext_dir, ort._built_for(), ort.EXTENSIONS)
    assert ort_buildcache.restore(ext_dir, fresh, ort.EXTENSIONS) is True
    (entry / ort_buildcache.COMPLETE).unlink()
    assert ort_buildcache.restore(ext_dir, fresh, ort.EXTENSIONS) is False
