"""ETO (Song et al. 2024, "Trial and Error: Exploration-Based Trajectory Optimization for
LLM Agents") and SDPO (Kong et al. 2025, "SDPO: Segment-Level Direct Preference
Optimization for Social Agents").

Claims tested: DPO's rejected sides teach an agent more than supervised fine-tuning on
the chosen sides alone (ETO: SFT, then trajectory-level DPO against the SFT policy, beats
SFT); and segment-level pairs, scored from the first turn where the sides differ, beat
whole-trajectory pairs (SDPO). A segment without an end is the trajectory loss (the
shared turns cancel in the DPO margin), so the declared segment arm equals the
trajectory arm; SDPO's bounded segment is `--config.offline.segment_turns=<k>` on the
`offline_dpo` group (run post hoc: docs/results/eto_sdpo/sdpo_segments.md).

  python -m experiments.strategies --config=experiments/configs/papers/eto_sdpo.py \\
      --workdir=runs/paper_eto_sdpo

The strategies study's offline arms on the same logged pairs (the prover_0.5 behaviour
policy ranked by the outcome, 32 / 128 / 512 pairs), the same 200 steps of 32 pairs and
the same held-out tasks at 20 seeds (experiments/configs/strategies_heldout.py):
segment DPO (SDPO's loss), trajectory DPO (ETO's), SFT on the chosen sides for all 200
steps, and SFT for 100 steps then trajectory DPO against the SFT policy (ETO's pipeline).
The comparisons (`strategies.OFFLINE_PAIRS`, paired over seeds, Holm over each metric's
9): segment minus trajectory DPO (SDPO), SFT-then-DPO minus SFT (ETO), trajectory DPO
minus SFT, at each data size. They were declared while the committed run trained, after
its progress lines had shown the first groups' pooled held-out success, before any
per-seed number or interval was read.
What is not reproduced: ETO's exploration loop (failures sampled from the SFT policy,
paired with expert trajectories, for several rounds) and SDPO's multi-party dialogue;
here both sides of a pair come from one fixed behaviour policy.
"""

import ml_collections

from experiments.configs import strategies_heldout


def get_config() -> ml_collections.ConfigDict:
    config = strategies_heldout.get_config()
    config.groups = "offline_dpo,offline_dpo_trajectory,offline_sft,offline_sft_dpo"
    config.sft_dpo_steps = 100
    return config
