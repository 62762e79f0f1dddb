"""The metric writer's TensorBoard side: scalars written, torch not imported for them."""

import glob
import importlib.util
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


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
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
