"""Real-LLM text: the model's tokenizer and chat template, token in and token out, and a
host-side multi-turn loop for environments written in Python (docs/text.md)."""

from rlagent.text.chat import ChatFormat
from rlagent.text.chat import ChatTemplateError
from rlagent.text.chat import MessageSpan
from rlagent.text.chat import check_vocab
from rlagent.text.chat import make_chat
from rlagent.text.critic import CriticConfig
from rlagent.text.loop import Episode
from rlagent.text.loop import TextConfig
from rlagent.text.loop import TextEnvironment
from rlagent.text.loop import TextLoop
from rlagent.text.loop import fork
from rlagent.text.loop import make_text_loop
from rlagent.text.loop import to_trajectory
from rlagent.text.toolworld import ToolWorldText
from rlagent.text.toolworld import make_toolworld_text
from rlagent.text.update import TextTrainState
from rlagent.text.update import TextUpdate
from rlagent.text.update import make_text_update
