"""Process reward models without hand labels: automatic step labels and learned scorers.

`base` defines what every process reward model (PRM) offers the trainer; `labels` turns
Monte-Carlo continuations into step labels (completion and progress labels); `learned`
holds the noisy oracle and the learned scorer; `implicit` is the implicit PRM, trained on
outcomes only; `config.PRMConfig` says which one a run trains with and its settings, and
`factory.make_prm` builds it.
"""

from rlagent.prm.base import PRMS
from rlagent.prm.base import PRMInputs
from rlagent.prm.base import PRMState
from rlagent.prm.base import ProcessRewardModel
from rlagent.prm.config import PRMConfig
from rlagent.prm.factory import make_prm
from rlagent.prm.factory import prm_factory
from rlagent.prm.implicit import make_implicit_prm
from rlagent.prm.labels import completion_labels
from rlagent.prm.labels import label_quality
from rlagent.prm.labels import progress_labels

__all__ = [
    "PRMS",
    "PRMConfig",
    "PRMInputs",
    "PRMState",
    "ProcessRewardModel",
    "completion_labels",
    "label_quality",
    "make_implicit_prm",
    "make_prm",
    "prm_factory",
    "progress_labels",
]
