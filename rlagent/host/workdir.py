"""Run folders: the one place that refuses, clears or resumes a workdir.

Every writer of results (the training loop, every study of experiments/studies) calls
`prepare_workdir` before it writes anything:

- a folder that holds anything is refused (`RunError`) unless `resume` or `overwrite`;
- `overwrite` removes everything in it (the folder is the run's: nothing else may live
  there);
- `resume` checks the resolved config (`config`) against the stored `provenance.json`
  and refuses a different one with a one-line diff; only `may_change` fields (see
  `resumable_fields`) may differ. An empty or missing folder starts from scratch.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from absl import logging

from rlagent import parallel
from rlagent.host import provenance

# Config fields a resumed run may change (dotted paths into the resolved config).
RESUMABLE_FIELDS = ("train.num_updates",)


class RunError(RuntimeError):
    """A run refused or stopped: the message says why and what to do."""


def resumable_fields(lr_schedule: str, extra: Sequence[str] = ()) -> tuple[tuple[str, ...], str]:
    """(fields a resumed run may change, the note a refusal adds): `RESUMABLE_FIELDS`
    (plus `extra`, settings that change no result) with a constant learning rate, `extra`
    only with a decaying schedule, which spans `num_updates`."""
    if lr_schedule == "constant":
        fields = (*extra, *RESUMABLE_FIELDS)
        return fields, f"only {', '.join(RESUMABLE_FIELDS)} may change on resume"
    note = "nothing may change on resume with a decaying lr_schedule, which spans num_updates"
    return tuple(extra), note


def prepare_workdir(
    workdir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    config: Mapping[str, Any] | None = None,
    may_change: Sequence[str] = (),
    note: str = "",
    resumable: bool = True,
) -> bool:
    """Readies `workdir` (see the module docstring); returns whether a run is resumed.

    `config` is the resolved config (`provenance.resolved`) that a resumed folder's
    `provenance.json` must match; None skips the check. `note` ends a refusal's message.
    `resumable=False`: the caller keeps no state to resume (a refusal names only
    --overwrite; `refuse_resume` is its error for `resume`).

    In a multi-process run process 0 decides and clears while the others wait; each
    returns its answer or raises its refusal (`parallel.primary_decides`).
    """
    return parallel.primary_decides(
        lambda: _prepare(
            workdir,
            resume=resume,
            overwrite=overwrite,
            config=config,
            may_change=may_change,
            note=note,
            resumable=resumable,
        ),
        errors=(RunError, ValueError),
    )


def _prepare(workdir, *, resume, overwrite, config, may_change, note, resumable) -> bool:
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other.")
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise RunError(f"{workdir} is a file, not a folder; pass another --workdir.")
    entries = sorted(os.listdir(workdir)) if os.path.isdir(workdir) else []
    if resume:
        if not entries:
            logging.warning("--resume: %s holds no run; starting from scratch.", workdir)
            os.makedirs(workdir, exist_ok=True)
            return False
        if config is not None:
            check_resume(workdir, config, may_change=may_change, note=note)
        return True
    if entries and not overwrite:
        options = "--resume to continue its run or " if resumable else ""
        raise RunError(
            f"{workdir} is not empty ({', '.join(entries[:5])}); pass {options}"
            "--overwrite to replace it."
        )
    for name in entries:
        path = os.path.join(workdir, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    os.makedirs(workdir, exist_ok=True)
    return False


def check_resume(
    workdir: str, config: Mapping[str, Any], *, may_change: Sequence[str] = (), note: str = ""
) -> None:
    """Refuses (`RunError`) to resume `workdir` without a stored config, with one that
    differs from `config` outside `may_change` (a one-line diff), or from a checkout at
    another commit than the run's newest segment (`provenance.check_commit`)."""
    stored = provenance.read(workdir)
    if stored is None:
        raise RunError(
            f"Cannot resume {workdir}: it has no {provenance.FILENAME}, so "
            "its config is unknown; pass --overwrite to start again."
        )
    diff = provenance.config_mismatch(stored["config"], config, may_change)
    if diff:
        suffix = f" ({note})" if note else ""
        message = f"Cannot resume {workdir} with a different config: {'; '.join(diff)}"
        raise RunError(f"{message}{suffix}.")
    reason = provenance.check_commit(workdir)
    if reason:
        raise RunError(f"Cannot resume {workdir}: {reason}.")


def refuse_resume(name: str) -> RunError:
    """The error of `--resume` given to a study that keeps no state to resume from."""
    return RunError(
        f"{name} cannot resume (it keeps no checkpoints); pass --overwrite to rerun it."
    )
