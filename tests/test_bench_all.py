"""experiments.bench_all: one benchmark at a time, every failure kept, bad flags refused."""

import json
import math

import pytest

from experiments import bench_all
from rlagent.host import provenance

_FAKE = """
import json, sys
out = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--json_out=")][0]
if "--fail" in sys.argv:
    print("boom", file=sys.stderr)
    sys.exit(3)
json.dump({"argv": sys.argv[1:]}, open(out, "w"))
"""


def test_runs_each_bench_and_keeps_a_failure(tmp_path, monkeypatch):
    (tmp_path / "fakebench.py").write_text(_FAKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    benches = {"good": ("fakebench", ("--x=1",)), "bad": ("fakebench", ("--fail",))}
    out = tmp_path / "out"
    result = bench_all.run(
        str(out), ["bad", "good"], benches=benches, allow_dirty=True, max_load=math.inf
    )
    assert list(result["benches"]) == ["bad", "good"]  # the order asked for.
    good, bad = result["benches"]["good"], result["benches"]["bad"]
    assert good["returncode"] == 0 and good["json"] == "good.json"
    assert json.loads((out / "good.json").read_text())["argv"][-1] == "--x=1"
    assert bad["returncode"] == 3 and bad["json"] is None and "boom" in bad["output_tail"]
    assert good["load_before"] >= 0 and good["seconds"] >= 0
    stored = json.loads((out / "bench_all.json").read_text())
    assert stored["provenance"]["git"]["commit"] == provenance.git_state()["commit"]
    assert stored["provenance"]["cpu"]["model"] == provenance.cpu_model()["model"]


@pytest.mark.parametrize(
    "only, kwargs, message",
    [
        (["kernels", "gpu"], {}, "--only"),
        (["env"], {"max_load": -1.0}, "--max_load"),
        (["env"], {"dirty": True}, "--allow_dirty"),
    ],
)
def test_refuses_bad_flags_before_writing(tmp_path, monkeypatch, only, kwargs, message):
    dirty = kwargs.pop("dirty", False)
    state = {"commit": "c" * 40, "dirty": dirty, "modified": ["a.py"] * dirty, "untracked": []}
    monkeypatch.setattr(provenance, "git_state", lambda root=None: state)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=message):
        bench_all.run(str(out), only, **{"max_load": math.inf, **kwargs})
    assert not out.exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ValueError, match="--out"):
        bench_all.run(str(tmp_path / "full"), ["env"], max_load=math.inf)
