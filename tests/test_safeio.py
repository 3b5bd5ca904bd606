"""The bottom layer for untrusted folders: no link is followed, every read is bounded, JSON is always valid."""

from __future__ import annotations

import json
import math
import os
import stat

import pytest

from ortlab import safeio


def test_dumps_cleans_non_finite_numbers_at_every_depth():
    value = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf, "d": (2.5, math.nan)}], "e": "NaN"}
    text = safeio.dumps(value)
    assert json.loads(text) == {"a": None, "b": [1.0, None, {"c": None, "d": [2.5, None]}], "e": "NaN"}
    assert "NaN" not in text.replace('"NaN"', "")
    with pytest.raises(
        ValueError, match="JSON compliant"
    ):  # what plain json does with allow_nan=False: the cleaning is what saves it
        json.dumps(value, allow_nan=False)


def test_write_never_follows_a_link(tmp_path):
    folder = tmp_path / "run"
    (folder / "control").mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, folder / "control" / "stop")
    safeio.write_bytes(folder, "control/stop", b"1")
    assert victim.read_text() == "precious"  # the link was replaced, not written through
    assert not (folder / "control" / "stop").is_symlink()
    assert (folder / "control" / "stop").read_bytes() == b"1"


def test_a_secret_is_written_owner_only_from_its_creation(tmp_path):
    """A token replaced over a world-readable file is 0600 at once (never chmodded after the write)."""
    (tmp_path / "auth_token").write_text("old")
    os.chmod(tmp_path / "auth_token", 0o644)
    old_umask = os.umask(0)  # the mode must not depend on the caller's umask being strict
    try:
        safeio.write_bytes(tmp_path, "auth_token", b"new", mode=0o600)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "auth_token").stat().st_mode) == 0o600
    assert (tmp_path / "auth_token").read_bytes() == b"new"


def test_write_refuses_a_linked_folder_on_the_way(tmp_path):
    folder, outside = tmp_path / "run", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    os.symlink(outside, folder / "control")
    with pytest.raises(safeio.UnsafePath, match="link"):
        safeio.write_bytes(folder, "control/stop", b"1")
    assert list(outside.iterdir()) == []


def test_hard_link_is_replaced_not_written_into(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    os.link(victim, folder / "status.json")
    safeio.write_json(folder, "status.json", {"state": "failed"})
    assert victim.read_text() == "{}"
    assert safeio.read_json(folder, "status.json") == {"state": "failed"}


def test_reads_refuse_links_fifos_and_oversized_files(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    secret = tmp_path / "secret"
    secret.write_text('{"key": "s3cr3t"}')
    os.symlink(secret, folder / "result.json")
    with pytest.raises(safeio.UnsafePath):
        safeio.read_json(folder, "result.json")
    os.mkfifo(folder / "status.json")  # opening a FIFO for reading would block forever
    with pytest.raises(safeio.UnsafePath, match="regular"):
        safeio.read_bytes(folder, "status.json")
    (folder / "spec.yaml").write_bytes(b"x" * 101)
    with pytest.raises(safeio.TooLarge):
        safeio.read_bytes(folder, "spec.yaml", limit=100)
    assert safeio.read_bytes(folder, "spec.yaml", limit=101) == b"x" * 101


def test_paths_cannot_climb_out(tmp_path):
    for bad in ("../x", "/etc/passwd", "a/../../x", ""):
        with pytest.raises(safeio.UnsafePath):
            safeio.open_in(tmp_path, bad)


def test_remove_and_exists_do_not_follow(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    target = tmp_path / "target"
    target.write_text("keep")
    os.symlink(target, folder / "pause")
    assert safeio.exists(folder, "pause")
    assert safeio.remove(folder, "pause")
    assert target.read_text() == "keep"
    assert not safeio.remove(folder, "pause")


def test_regular_files_skips_links_and_linked_folders(tmp_path):
    model, outside = tmp_path / "model", tmp_path / "outside"
    (model / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "id_rsa").write_text("key")
    (model / "config.json").write_text("{}")
    (model / "sub" / "weights.bin").write_bytes(b"w")
    os.symlink(outside / "id_rsa", model / "vocab.txt")
    os.symlink(outside, model / "linked")
    found = sorted(p.relative_to(model).as_posix() for p in safeio.regular_files(model))
    assert found == ["config.json", "sub/weights.bin"]


def test_copy_files_copies_regular_files_only_and_says_what_it_skipped(tmp_path):
    folder, dest, outside = tmp_path / "run", tmp_path / "out", tmp_path / "outside"
    (folder / "model" / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "id_rsa").write_text("PRIVATE KEY")
    (folder / "model" / "config.json").write_text("{}")
    (folder / "model" / "sub" / "weights.bin").write_bytes(b"w")
    (folder / "model" / "skip.tmp").write_text("x")
    os.symlink(outside / "id_rsa", folder / "model" / "vocab.txt")
    os.symlink(outside, folder / "model" / "linked-dir")
    os.mkfifo(folder / "model" / "pipe")
    skipped = safeio.copy_files(folder, "model", dest, select=lambda p: p.suffix != ".tmp")
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
        "config.json",
        "sub/weights.bin",
    ]
    assert skipped == ["model/linked-dir (a link)", "model/pipe (not a regular file)", "model/vocab.txt (a link)"]
    # the folder itself a link: nothing is copied from where it points
    os.symlink(outside, folder / "onnx")
    assert safeio.copy_files(folder, "onnx", tmp_path / "out2") == ["onnx (a link or not a folder)"]
    assert not (tmp_path / "out2").exists()


def test_real_number_is_a_finite_float_or_none():
    """What the views draw and print through: an int too big for a float (valid JSON) once crashed the static chart
    of a notebook (`math.isfinite` raises OverflowError on it) instead of leaving its point out."""
    from ortlab.cli.common import num
    from ortlab.safeio import real_number

    assert real_number(3) == 3.0 and real_number(-2.5) == -2.5
    for bad in (10**400, -(10**400), float("nan"), float("inf"), True, "1", None, [1]):
        assert real_number(bad) is None, bad
    assert num(10**400, ".1f") == "-" and num(float("nan"), ".1f") == "-" and num(None, ".1f") == "-"
    assert num(2.25, ".1f") == "2.2" and num("n/a", ".1f") == "n/a"
