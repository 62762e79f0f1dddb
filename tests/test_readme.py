"""README's Quickstart is what CI runs: two commands, the second installs every test
dependency and runs the whole suite."""

import pathlib

import pytest
import readme_commands

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_test_command_installs_every_dependency_and_ci_runs_it():
    commands = readme_commands.quickstart()
    assert commands["experiment"].endswith("python -m experiments.sparse_vs_dense")
    test = commands["test"]
    # The optional modules the suite imports: the test extra (transformers, textarena,
    # mpmath, ...), torch's CPU build and bfcl-eval without its dependencies.
    for part in ("pip install -e '.[test]' torch==2.13.0", "pip install --no-deps bfcl-eval"):
        assert part in test
    assert test.endswith("pytest -q -n 2 --dist loadfile")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "test_command=$(python -m tests.readme_commands test)" in ci
    assert 'eval "$test_command"' in ci


def test_a_readme_without_the_block_is_named(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Quickstart\n\n```bash\none\n```\n")
    with pytest.raises(ValueError, match="1 commands, not 2"):
        readme_commands.quickstart(readme)
