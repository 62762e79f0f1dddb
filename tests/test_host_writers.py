"""The metric writer's TensorBoard side: scalars written, torch not imported for them."""

import glob
import gzip
import lzma
import subprocess
import sys
import textwrap

import pytest

from rlagent.host.writers import MetricWriter


def test_rows_reach_the_csv_and_tensorboard(tmp_path):
    writer = MetricWriter(str(tmp_path))
    writer.write([{"update": 1, "seed": 0, "condition": "outcome", "success": 0.5}])
    writer.close()
    assert writer.read() == [{"update": 1, "seed": 0, "condition": "outcome", "success": 0.5}]
    (events,) = glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*"))
    with open(events, "rb") as f:
        assert b"outcome/seed0/success" in f.read()


def test_tensorboard_does_not_import_torch_and_leaves_it_importable(tmp_path):
    # tensorboardX imports torch (~4 s) when it can; a fresh process shows whether it did.
    # find_spec raises ValueError while sys.modules["torch"] is still the blocking None.
    script = textwrap.dedent(f"""
        import importlib.util, sys
        from rlagent.host.writers import MetricWriter
        MetricWriter({str(tmp_path)!r}).close()
        loaded = [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
        assert not loaded, f"tensorboardX imported torch: {{loaded[:3]}}"
        assert importlib.util.find_spec("torch") is not None
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_appended_rows_go_under_the_files_header_by_name(tmp_path):
    """A row whose keys come in another order is written under the header's columns (it
    was written in its own order, shifting values under the wrong names); a row lacking a
    column reads NaN there; a key the header lacks is refused naming the file."""
    writer = MetricWriter(str(tmp_path), tensorboard=False)
    writer.write([{"update": 1, "seed": 0, "a": 1.0, "b": 2.0}])
    writer.write([{"b": 20.0, "a": 10.0, "seed": 0, "update": 2}])
    writer.write([{"update": 3, "seed": 0, "a": 100.0}])
    rows = writer.read()
    assert [(r["a"], r["b"]) for r in rows[:2]] == [(1.0, 2.0), (10.0, 20.0)]
    assert rows[2]["a"] == 100.0 and rows[2]["b"] != rows[2]["b"]  # NaN
    with pytest.raises(ValueError, match=r"metrics.csv: columns \['c'\] are not in its header"):
        writer.write([{"update": 4, "seed": 0, "a": 1.0, "b": 2.0, "c": 3.0}])
    assert len(writer.read()) == 3


def test_read_falls_back_to_the_gzipped_file(tmp_path):
    """Without metrics.csv, `read` reads metrics.csv.gz (how docs/results keeps its
    curves), numbers parsed as from the plain file; the plain file wins when both exist."""
    writer = MetricWriter(str(tmp_path), tensorboard=False)
    writer.write([{"condition": "a", "update": 1, "seed": 0, "success": 0.5}])
    plain = writer.read()
    with open(writer.path, "rb") as f, gzip.open(writer.path + ".gz", "wb") as g:
        g.write(f.read())
    writer.write([{"condition": "a", "update": 2, "seed": 0, "success": 0.75}])
    assert len(writer.read()) == 2
    writer.clear()
    assert writer.read() == plain == [{"condition": "a", "update": 1, "seed": 0, "success": 0.5}]


def test_read_falls_back_to_the_xz_file_before_the_gzipped_one(tmp_path):
    """metrics.csv.xz (the form docs/results keeps its curves in) is read like the plain
    file, and before a metrics.csv.gz beside it."""
    writer = MetricWriter(str(tmp_path), tensorboard=False)
    writer.write([{"condition": "a", "update": 1, "seed": 0, "success": 0.5}])
    plain = writer.read()
    with open(writer.path, "rb") as f, lzma.open(writer.path + ".xz", "wb") as x:
        x.write(f.read())
    with gzip.open(writer.path + ".gz", "wt") as g:
        g.write("condition,update,seed,success\na,9,9,9\n")
    writer.clear()
    assert writer.read() == plain
