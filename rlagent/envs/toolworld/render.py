"""Human-readable transcripts of ToolWorld episodes."""

from __future__ import annotations

import numpy as np

from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld.types import Progress

_MARKERS = {Progress.ABSENT: ".", Progress.PENDING: "?", Progress.DONE: "+", Progress.FAILED: "x"}


def render_transcript(
    obs_tokens,
    action_tokens,
    turn_mask=None,
    verdict=None,
    progress=None,
    outcome=None,
) -> str:
    """Text of one episode, a line for what the agent read and one for what it wrote.

    Args:
      obs_tokens: `[S, O]` int observation tokens read before each turn.
      action_tokens: `[S, L]` int tokens written at each turn.
      turn_mask: optional `[S]` bool, turns that were played (default: all).
      verdict: optional `[S]` process verdicts, shown as `(+1)` / `(0)` / `(-1)`.
      progress: optional `[S, K]` progress markers, shown as `[+?.]` (done, pending,
        absent; `x` failed).
      outcome: optional final outcome, shown on the last line.
    """
    obs_tokens = np.asarray(obs_tokens)
    action_tokens = np.asarray(action_tokens)
    if obs_tokens.ndim != 2 or action_tokens.ndim != 2:
        raise ValueError(
            f"obs_tokens and action_tokens must be [S, O] and [S, L], got "
            f"{obs_tokens.shape} and {action_tokens.shape}"
        )
    if obs_tokens.shape[0] != action_tokens.shape[0]:
        raise ValueError(
            f"obs_tokens and action_tokens disagree on S: {obs_tokens.shape[0]} vs "
            f"{action_tokens.shape[0]}"
        )
    turns = obs_tokens.shape[0]
    mask = np.ones(turns, bool) if turn_mask is None else np.asarray(turn_mask, bool)
    lines = []
    for s in range(turns):
        if not mask[s]:
            continue
        marks = ""
        if progress is not None:
            marks = " [" + "".join(_MARKERS.get(int(m), "?") for m in np.asarray(progress)[s]) + "]"
        lines.append(f"{s:3d} <  {dsl.render(obs_tokens[s])}{marks}")
        judged = "" if verdict is None else f"   ({float(np.asarray(verdict)[s]):+.0f})"
        lines.append(f"    >  {dsl.render(action_tokens[s])}{judged}")
    if outcome is not None:
        lines.append(f"outcome: {float(outcome):.0f}")
    return "\n".join(lines)


def render_trajectory(trajectory, index: int = 0) -> str:
    """Transcript of episode `index` of an `rlagent.types.Trajectory`."""
    outcome = np.asarray(trajectory.outcome)[index].sum()
    return render_transcript(
        np.asarray(trajectory.obs_tokens)[index],
        np.asarray(trajectory.action_tokens)[index],
        turn_mask=np.asarray(trajectory.turn_mask)[index],
        verdict=np.asarray(trajectory.verdict)[index],
        progress=np.asarray(trajectory.progress)[index],
        outcome=outcome,
    )
