"""provenance.json: untracked files make a run dirty, a checkout that moves is recorded."""

import hashlib
import json
import subprocess

import pytest
from absl import logging

from rlagent.host import provenance
from rlagent.host import workdir


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def _repo(tmp_path):
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@t")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / ".gitignore").write_text("runs/\n")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "one")
    return str(tmp_path)


def test_untracked_files_make_the_tree_dirty_and_are_hashed(tmp_path):
    root = _repo(tmp_path)
    clean = provenance.git_state(root)
    assert clean["dirty"] is False and clean["untracked"] == [] and clean["modified"] == []
    (tmp_path / "config.py").write_text("seeds = 30\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "metrics.csv").write_text("ignored\n")
    state = provenance.git_state(root)
    assert state["dirty"] is True and state["commit"] == clean["commit"]
    digest = hashlib.sha256(b"seeds = 30\n").hexdigest()
    assert state["untracked"] == [{"path": "config.py", "sha256": digest}]
    (tmp_path / "a.py").write_text("x = 2\n")
    assert provenance.git_state(root)["modified"] == ["a.py"]


def test_a_checkout_that_moves_during_a_run_is_recorded_with_a_warning(tmp_path, monkeypatch):
    root = _repo(tmp_path)
    record = {"config": {}, "git": provenance.git_state(root)}
    assert "git_end" not in provenance.finish(record, root)  # nothing moved
    (tmp_path / "b.py").write_text("y = 1\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "two")
    warnings = []
    monkeypatch.setattr(logging, "warning", lambda *args: warnings.append(args[0] % args[1:]))
    out = provenance.finish(record, root)
    assert out["git_end"]["commit"] != record["git"]["commit"]
    assert record["git"]["commit"] in warnings[0] and out["git_end"]["commit"] in warnings[0]


def test_outside_a_checkout_every_field_is_none(tmp_path):
    assert set(provenance.git_state(str(tmp_path)).values()) == {None}


def test_the_cpu_is_recorded_with_its_vector_extensions(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    flags = "fpu sse2 avx avx2 fma avx512f amx_tile"
    cpuinfo.write_text(f"model name\t: AMD EPYC\nflags\t\t: {flags}\n")
    real_open = open
    monkeypatch.setattr(
        "builtins.open",
        lambda path, *a, **k: real_open(cpuinfo if path == "/proc/cpuinfo" else path, *a, **k),
    )
    cpu = provenance.cpu_model()
    assert cpu["model"] == "AMD EPYC"
    assert cpu["simd"] == ["amx_tile", "avx", "avx2", "avx512f", "fma"]
    assert cpu["flags_sha256"] == hashlib.sha256(flags.encode()).hexdigest()[:16]


def test_a_later_process_never_rewrites_provenance_json(tmp_path, monkeypatch):
    """A resume or a --report_only rebuild records itself beside the run's provenance.json
    (one line per process, rewritten in place by the same process), never over it."""
    folder = str(tmp_path)
    first = provenance.collect({"seeds": [0]}, wall_s=1.0)
    provenance.write(folder, first)
    provenance.write(folder, {**first, "wall_s": 2.0})  # the same process: its own record.
    original = (tmp_path / "provenance.json").read_bytes()
    assert json.loads(original)["wall_s"] == 2.0
    monkeypatch.setattr(provenance, "SEGMENT", "rebuild")  # another process from here on.
    assert provenance.own(folder, {"seeds": [0]})["segment"] == "rebuild"
    provenance.write(folder, provenance.collect({"seeds": [0]}, wall_s=3.0))
    provenance.write(folder, provenance.collect({"seeds": [0]}, wall_s=4.0))
    assert (tmp_path / "provenance.json").read_bytes() == original
    records = provenance.segments(folder)
    assert [record["wall_s"] for record in records] == [2.0, 4.0]
    assert records[1]["segment"] == "rebuild" != records[0]["segment"]


def test_a_resume_from_another_commit_is_refused_unless_asked(tmp_path, monkeypatch):
    folder = str(tmp_path)
    config = {"seeds": [0]}
    record = provenance.collect(config)
    record["git"] = {**record["git"], "commit": "a" * 40}
    provenance.write(folder, record)
    monkeypatch.setattr(provenance, "git_state", lambda root=None: {"commit": "b" * 40})
    monkeypatch.delenv(provenance.ACROSS_COMMITS_ENV, raising=False)
    with pytest.raises(workdir.RunError, match="commit aaaaaaaaaaaa and this checkout is at bbbb"):
        workdir.check_resume(folder, config)
    monkeypatch.setenv(provenance.ACROSS_COMMITS_ENV, "1")
    workdir.check_resume(folder, config)  # asked for: allowed, and recorded per segment.
    monkeypatch.setattr(provenance, "SEGMENT", "resumed")
    provenance.write(folder, provenance.collect(config, updates=[1, 2]))
    commits = [r["git"]["commit"] for r in provenance.segments(folder)]
    assert commits == ["a" * 40, "b" * 40]
