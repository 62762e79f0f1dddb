"""The studies' environment registry: `config.env.kind` names the environment."""

import pytest

from experiments.configs import sparse_vs_dense
from experiments.studies import common
from experiments.studies.envs import KINDS
from experiments.studies.envs import env_section
from experiments.studies.envs import horizon_env
from experiments.studies.envs import make_env
from rlagent.envs import check_environment


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_builds_an_environment_from_its_section(kind):
    env = make_env(env_section(kind))
    check_environment(env)
    assert isinstance(env, KINDS[kind].make)


def test_a_section_without_kind_is_toolworld_and_the_model_takes_the_env_vocabulary():
    config = sparse_vs_dense.get_config()
    assert type(common.build(config).env).__name__ == "ToolWorld"
    config.env = env_section("dialogue", level=2, persona=dict(feedback_rate=0.1))
    config.model.vocab_size = None
    setup = common.build(config)
    assert setup.policy_config.vocab_size == setup.env.token_spec.vocab_size
    assert setup.env.config.persona.feedback_rate == 0.1
    assert setup.env.config.persona.chats == 0  # level 2's, left unset in the section.


def test_bad_sections_are_refused_naming_the_field():
    config = sparse_vs_dense.get_config()
    config.env = env_section("dialogue")
    with pytest.raises(ValueError, match=r"config\.model\.vocab_size=71, but DialogueEnv"):
        common.build(config)
    config.env.kind = "chess"
    with pytest.raises(ValueError, match=r"config\.env\.kind: unknown environment 'chess'"):
        common.build(config)
    with pytest.raises(ValueError, match=r"Persona\.feedback_rate: must be in \[0, 1\]"):
        make_env(env_section("dialogue", persona=dict(feedback_rate=1.5)))
    with pytest.raises(ValueError, match=r"Unknown env config fields \['colour'\]"):
        make_env({**env_section("mastermind").to_dict(), "colour": 3})


def test_horizon_env_sets_the_shortest_episode():
    assert horizon_env("dialogue", 8).config.shortest == 8
    assert horizon_env("mastermind", 5).config.guess_limit == 5  # its turn limit.
    # ToolWorld's horizon sets the whole config but keeps the section's task split.
    split = horizon_env("toolworld", 8, 2, {"task_split": "train"})
    assert (split.config.task_split, split.config.max_turns) == ("train", 10)
    assert split.heldout_env().config.task_split == "heldout"
    # So do the dialogue's (a horizon sets the goal's size) and Mastermind's (its section).
    talk = horizon_env("dialogue", 8, 0, {"kind": "dialogue", "task_split": "train"})
    assert (talk.config.task_split, talk.config.shortest) == ("train", 8)
    assert talk.heldout_env().config.task_split == "heldout"
    game = horizon_env("mastermind", 5, 0, {"kind": "mastermind", "task_split": "train"})
    assert (game.config.task_split, game.config.guess_limit) == ("train", 5)
    assert game.heldout_env().config.task_split == "heldout"
