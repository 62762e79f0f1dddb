"""A host-side multi-turn loop for environments written in Python (docs/text.md).

A text environment speaks messages:

    messages = env.reset(seed)                       # system / user messages
    messages, signals, done = env.step(text)         # the assistant's text of one turn

and the loop plays B of them at once: every turn, jitted programs sample the next
assistant turn of each live episode (KV cache, stop at the end-of-turn token,
`TextConfig.max_new_tokens` per turn, each row from its own key); then each environment
steps on the decoded text and its reply is appended as template tokens
(`rlagent.text.chat`). The policy's ids are kept as generated. Two engines
(`TextConfig.engine`, the same samples for the same keys):

* 'cached' (default): each episode keeps its KV cache for the whole `play` call, and a
  turn appends to it only the tokens it does not hold yet (the whole transcript at the
  first turn of a call; then the previous turn's last sampled id and the template tokens
  the turn reads: `sampler.prefill`), then decodes from there (`sampler.decode`). Memory:
  one cache of `TextConfig.cache_len` = P + max(L, prefill_chunk) slots per episode of
  the call (the longest transcript plus the overhang of a prefill piece), whatever the
  turn (fewer with a history window, below). An episode's slots are its positions
  0..n-1 (without a window), so a prefilled token costs attention over the cache, not a
  transcript prefilled again. Before each turn the live episodes are packed into as few
  groups as hold them (`TextConfig.compact`, `TextLoop._compact`).
* 'reprefill': the live transcripts are left-padded into one [B, P] batch and prefilled
  again every turn (`sampler.generate`). Left padding keeps RoPE exact: a query and a
  key interact through their slot difference only, so a transcript at slots [P - n, P)
  scores as it would at [0, n).

History window (`TextConfig.history_window` = W > 0, 'cached' engine): turn t reads the
header (the tokens before turn 0's ids) and the last W turns (a turn: its ids and the
template tokens after them). Before a turn the caches evict the turns that left the
window: the later slots move down over them (`sampler.evict`), keeping their order, and
new tokens are written after them at slot + offset (offset: the tokens evicted), so
positions go on as in the whole transcript and keys stay rotated at theirs. Moving the
kept slots down (rather than a ring of slots) keeps every write one contiguous piece
(`prefill`, `decode` unchanged) and causality by slot; its cost is one gather of the cache
per turn. A cache then holds the header, W turns and the turn being written:
`TextConfig.cache_len`. A cache made at the first turn of a `play` call is filled read
turn by read turn (`TextLoop._plan`), each with its window, so its keys are the ones the
episode's own sampling computed and a play split over calls samples as one call.

Forks: an `Episode` holds its Python environment, so `fork(episode)` (a deep copy) is the
state of the episode at its current turn, and turn t of an episode samples with
`fold_in(keys[b], t)`: a fork played with the episode's own key continues exactly as the
episode did; other keys give Monte-Carlo continuations of the same state.

Tools are rendered per episode: an episode's template tokens carry its environment's own
`tools` (`ChatFormat.for_tools`), so one batch may mix tasks of different tool sets.

Sizes: an episode whose next turn would read more than `TextConfig.obs_len` template
tokens, or whose transcript before a turn would pass `max_prompt_len`, ends there as
*truncated* (`Episode.truncated` says why; the reply that does not fit is not appended):
its last played turn has `done` False, as an episode cut at `max_turns`, so estimators
treat it as a time limit (masked after it, bootstrapped where the estimator bootstraps);
the run goes on. A first prompt that does not fit gives an episode of no turns.

`TextLoop.trajectory(episodes)` lays the episodes out as the trainer's `Trajectory`
(turns x tokens): `obs_tokens [B, S, O]` the template tokens read before turn s (PAD
after them), `action_tokens [B, S, L]` the generated ids (END included, PAD after),
`action_mask`, `logp`, `turn_mask`, `done`, `success` and `signals` of the env's
`signal_names`, so that reward forms, estimators and statistics apply unchanged. The loop
has no critic: `values` and `bootstrap_value` are 0 (critic-free estimators, or a value
pass of one's own).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple
from typing import Protocol
from typing import runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlagent.models.llama import PolicyConfig
from rlagent.models.llama import init_cache
from rlagent.models.sampler import Generation
from rlagent.models.sampler import allowed_to_mask
from rlagent.models.sampler import decode
from rlagent.models.sampler import evict
from rlagent.models.sampler import generate
from rlagent.models.sampler import prefill
from rlagent.models.sharding import DATA
from rlagent.text.chat import EMPTY
from rlagent.text.chat import ChatFormat
from rlagent.text.chat import Message
from rlagent.text.chat import MessageSpan
from rlagent.text.chat import Rendering
from rlagent.text.chat import check_tools
from rlagent.text.chat import check_vocab
from rlagent.types import Trajectory


@runtime_checkable
class TextEnvironment(Protocol):
    """A multi-turn environment in Python that reads and writes messages.

    `signals` of a step hold a float for every name of `signal_names` and, optionally,
    `success` (> 0 on the turn that solves the episode). `done` ends the episode
    (termination); the loop stops an episode after `max_turns` turns, or when its next turn
    does not fit the loop's sizes (truncation). Optional: `tools` (the tool schemas the
    chat template renders in this episode) and
    `episode_metrics(signals, turn_mask, action_tokens)`, as `rlagent.envs.base`'s (read by
    `rlagent.train.ppo.episode_metrics`).
    """

    @property
    def max_turns(self) -> int: ...

    @property
    def signal_names(self) -> tuple[str, ...]: ...

    @property
    def reward_components(self) -> tuple[str, ...]: ...

    def reset(self, seed: int) -> list[Message]: ...

    def step(self, text: str) -> tuple[list[Message], dict[str, float], bool]: ...


ENGINES = ("cached", "reprefill")


@dataclasses.dataclass(frozen=True)
class TextConfig:
    """Sizes and sampling of the text loop (hashable)."""

    max_new_tokens: int = 64  # L: tokens of one assistant turn (END included).
    obs_len: int = 256  # O: template tokens read before one turn, at most.
    max_prompt_len: int = 1024  # P: tokens of a transcript before a turn, at most.
    temperature: float = 1.0  # tau of pi = softmax(logits / tau + mask); 0 = greedy.
    top_k: int = 0  # sample among the k most likely tokens (0 = off; not part of pi).
    top_p: float = 1.0  # nucleus sampling mass (1 = off; not part of pi).
    # Episodes per call of the jitted sampler (0 = the whole batch): bounds the KV caches
    # and the prefill held at once; the last call is padded to this size (one program).
    sample_batch: int = 16
    # 'cached': each live episode keeps its KV cache across the turns of a `play` call and
    # a turn prefills only the tokens that arrived since the last one; 'reprefill': every
    # turn prefills the whole transcript again (left-padded to max_prompt_len). The same
    # samples for the same keys (tests/test_text.py).
    engine: str = "cached"
    prefill_chunk: int = 64  # 'cached': tokens per pass of the prefill loop.
    # 'cached': before each turn the live episodes are packed into as few groups of
    # sample_batch rows as hold them, their caches moved along (`TextLoop._compact`), so
    # episodes that are over stop costing rows of every prefill and decode step. The
    # same samples either way (tests/test_text.py).
    compact: bool = True
    # Turns of history the policy reads (0 = the whole transcript): with W > 0 a turn reads
    # the opening messages (everything before the first assistant turn) and the last W
    # turns (an assistant message and the reply after it), at their transcript positions.
    # The 'cached' engine evicts the turns that leave the window from its caches
    # (`cache_len` then follows W, not max_prompt_len) and the scorer masks them out
    # (`rlagent.text.score`), so actions are scored with the context they were sampled in.
    history_window: int = 0

    def __post_init__(self):
        if not isinstance(self.sample_batch, int) or self.sample_batch < 0:
            raise ValueError(
                f"TextConfig.sample_batch must be an integer >= 0, got {self.sample_batch!r}"
            )
        if not isinstance(self.compact, bool):
            raise ValueError(f"TextConfig.compact must be a bool, got {self.compact!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"TextConfig.engine must be one of {ENGINES}, got {self.engine!r}")
        if not isinstance(self.history_window, int) or self.history_window < 0:
            raise ValueError(
                f"TextConfig.history_window must be an integer >= 0, got {self.history_window!r}"
            )
        if self.history_window and self.engine != "cached":
            raise ValueError(
                f"TextConfig.history_window={self.history_window} needs engine='cached' (the "
                f"'{self.engine}' engine reads whole transcripts)"
            )
        for name in ("max_new_tokens", "obs_len", "max_prompt_len", "prefill_chunk"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"TextConfig.{name} must be an integer >= 1, got "
                                 f"{getattr(self, name)!r}")  # fmt: skip
        if not (self.temperature >= 0 and self.top_k >= 0 and 0.0 < self.top_p <= 1.0):
            raise ValueError(
                f"TextConfig needs temperature >= 0, top_k >= 0 and top_p in (0, 1], got "
                f"{self.temperature}, {self.top_k}, {self.top_p}"
            )

    @property
    def transcript_len(self) -> int:
        """P + L: the longest transcript an episode of the loop can have (every transcript
        before a turn is at most P tokens, `_size_fault`, and a turn adds at most L). The
        scorer, the critic and the judge read packed transcripts this wide, not the
        trajectory's S * (O + L) slots."""
        return self.max_prompt_len + self.max_new_tokens

    @property
    def cache_len(self) -> int:
        """Slots of one episode's KV cache in the 'cached' engine: P + max(L, chunk), the
        longest transcript plus the overhang of the last prefill piece; with a history
        window at most O + W (O + L) + L + chunk: the header, W turns of at most O + L
        tokens, a turn's ids (decoded, or written when a cache is filled) and a prefill
        piece's overhang."""
        full = self.max_prompt_len + max(self.max_new_tokens, self.prefill_chunk)
        if not self.history_window:
            return full
        turn = self.obs_len + self.max_new_tokens
        window = self.history_window * turn + self.max_new_tokens + self.prefill_chunk
        return min(full, self.obs_len + window)


@dataclasses.dataclass(eq=False)
class TurnRecord:
    """One played turn of an episode."""

    obs: list[int]  # template tokens read before the turn (O at most).
    action: list[int]  # ids the policy generated (END included when it ended the turn).
    logp: list[float]  # behaviour log pi of each generated id.
    signals: dict[str, float]  # the env's signals of the turn.
    done: bool  # the environment ended the episode at this turn.


@dataclasses.dataclass(eq=False)
class Episode:
    """One conversation on the host: its environment, transcript and turns.

    `tokens` is the transcript the policy reads, `loss_mask` True exactly on the ids it
    generated, `spans` the messages' places in it (`chat.MessageSpan`, tiling `tokens`).
    `messages` also holds the environment's last reply, which no turn reads.
    """

    env: Any  # the TextEnvironment, advanced in place (fork before playing on).
    messages: list[Message]
    tokens: list[int]
    loss_mask: list[bool]
    spans: list[MessageSpan]
    turns: list[TurnRecord]
    rendered: Rendering  # the template's rendering of the messages before the next turn.
    pending: list[int]  # the template tokens the next turn reads.
    tools: tuple[dict, ...] | None = None  # the tool schemas its template tokens carry.
    done: bool = False  # terminated by the environment.
    truncated: str = ""  # why the next turn did not fit the sizes ('' while it fits).

    @property
    def over(self) -> bool:
        """Terminated, truncated by the sizes, or after `env.max_turns` turns."""
        return self.done or bool(self.truncated) or len(self.turns) >= self.env.max_turns


def fork(episode: Episode) -> Episode:
    """A copy of the episode at its current turn, environment state included."""
    return copy.deepcopy(episode)


class CachedSampler(NamedTuple):
    """The programs of the 'cached' engine (`make_text_loop`); a row is an episode."""

    # jitted (params, caches, tokens [B, W], count [B], start [B], (offset, header, evict)
    # [B] each) -> (logits [B, V], caches): with a history window, first evicts `evict`
    # slots after each row's `header` (`sampler.evict`); then appends each row's `count`
    # tokens at its slot `start`, at positions slot + offset (`sampler.prefill`).
    prefill: Any
    # jitted (params, caches, logits [B, V], keys [B], (start, active, offset) [B] each) ->
    # (Generation, caches): samples a turn of each active row (`sampler.decode`).
    decode: Any
    init: Any  # rows -> the empty caches of that many episodes (`TextConfig.cache_len`).
    # W: the tokens one prefill call can append (max_prompt_len; O + L with a history
    # window, a turn's at most) rounded up to a multiple of prefill_chunk.
    width: int
    # The rows split over the data axis of a mesh (None: one device); a group's rows are
    # a multiple of that axis's size.
    sharding: jax.sharding.NamedSharding | None = None
    # jitted (dest caches, src caches, index [R], take [R]) -> caches: row r of dest
    # replaced by row index[r] of src where take[r], dest donated (`TextLoop._compact`).
    move: Any = None
    # What the engine dispatched since it was made: 'group_turns' (a group's prefill and
    # decode of one turn), 'moved_rows' (episodes whose caches compaction moved) and
    # 'context_slots' (the most cache slots one episode's context held before a decode).
    counts: dict | None = None

    def place(self, *arrays):
        """The row-major arrays of a call, on the devices of their rows."""
        return arrays if self.sharding is None else jax.device_put(arrays, self.sharding)

    @property
    def row_multiple(self) -> int:
        return 1 if self.sharding is None else self.sharding.mesh.shape[DATA]


class _Book(NamedTuple):
    """What each episode's cache holds in a `play` call of the 'cached' engine, indexed by
    episode (so it follows compaction): [B] int64 arrays, updated in place."""

    held: np.ndarray  # transcript tokens written to the cache (positions 0 .. held - 1).
    dropped: np.ndarray  # of them, evicted past the header (history window).
    rounds: np.ndarray  # read turns written (history window: `TextLoop._plan`).


class TextLoop(NamedTuple):
    """Plays text environments with a policy (`make_text_loop`)."""

    chat: ChatFormat
    config: TextConfig
    sample: Any  # jitted (params, prompts [B, P], valid [B, P], keys [B]) -> Generation.
    cached: CachedSampler | None = None  # the 'cached' engine (None: 'reprefill').

    def start(self, env: Any, seed: int) -> Episode:
        """A fresh episode: `env.reset(seed)` rendered with the environment's tools up to
        the generation prompt (truncated with no turn if that does not fit the sizes)."""
        _check_env(env)
        chat = self.chat.for_tools(getattr(env, "tools", None))
        if chat.tools:
            check_tools(chat)
        messages = list(env.reset(seed))
        tokens, spans, rendered = chat.extend(messages, 0, EMPTY, [])
        episode = Episode(env, messages, [], [], [], [], rendered, [], tools=chat.tools)
        episode.truncated = _size_fault(tokens, 0, 0, self.config)
        if not episode.truncated:
            episode.tokens, episode.loss_mask = list(tokens), [False] * len(tokens)
            episode.spans, episode.pending = spans, tokens
        return episode

    def play(
        self,
        params: nnx.State,
        episodes: Sequence[Episode],
        keys: jax.Array,
        *,
        num_turns: int | None = None,
    ) -> list[Episode]:
        """Advances the episodes (in place) by `num_turns` turns (default: to the end).

        Args:
          params: the policy's parameters (of the loop's graphdef).
          episodes: B episodes; those over are left as they are.
          keys: [B] PRNG keys; turn t of episode b samples with `fold_in(keys[b], t)`.
        """
        if len(keys) != len(episodes):
            raise ValueError(f"{len(keys)} keys for {len(episodes)} episodes")
        if self.cached is not None:
            return self._play_cached(params, episodes, keys, num_turns)
        played = 0
        while any(not e.over for e in episodes) and (num_turns is None or played < num_turns):
            prompts, valid = _left_pad(episodes, self.config.max_prompt_len, self.chat.pad_id)
            turn_index = jnp.asarray([len(e.turns) for e in episodes], jnp.int32)
            turn_keys = jax.vmap(jax.random.fold_in)(keys, turn_index)
            out = self._sample(params, prompts, valid, turn_keys)
            for row, episode in enumerate(episodes):
                if not episode.over:
                    length = int(out.mask[row].sum())
                    ids, logp = out.tokens[row, :length], out.logp[row, :length]
                    self.advance(episode, ids.tolist(), logp.tolist())
            played += 1
        return list(episodes)

    def _play_cached(self, params, episodes, keys, num_turns) -> list[Episode]:
        """`play` with the 'cached' engine: the episodes in groups of `sample_batch` rows
        (rounded up to the mesh's row multiple: one compiled program), each group with
        its caches (one cache of `TextConfig.cache_len` slots per row: the longest
        transcript plus the overhang of a prefill piece, so memory is bounded by rows x
        cache_len, whatever the turn). A turn appends to each live episode's cache the
        transcript tokens it does not hold yet (the first turn of a call: the whole
        transcript; later: the previous turn's last sampled id, then the template tokens
        the turn reads), then decodes until every row of the group has ended its turn.
        With `TextConfig.compact` the live episodes are packed into as few groups as hold
        them before each turn (`_compact`); without, a group whose episodes are all over
        is skipped and an episode over in a live group samples nothing. The groups of a
        turn are all dispatched before the first is fetched, so the host steps a group's
        environments while the device samples the next groups."""
        size, multiple = len(episodes), self.cached.row_multiple
        if all(e.over for e in episodes) or num_turns == 0:
            return list(episodes)
        rows = min(self.config.sample_batch or size, size)
        order = [r for r in range(size) if not (self.config.compact and episodes[r].over)]
        groups = [np.asarray(order[s : s + rows]) for s in range(0, len(order), rows)]
        rows = -(-rows // multiple) * multiple
        caches = [self.cached.init(rows) for _ in groups]
        book = _Book(*np.zeros((3, size), np.int64))
        played = 0
        while any(not e.over for e in episodes) and (num_turns is None or played < num_turns):
            if self.config.compact:
                groups = self._compact(episodes, groups, caches, rows)
            turn_index = jnp.asarray([len(e.turns) for e in episodes], jnp.int32)
            turn_keys = jax.vmap(jax.random.fold_in)(keys, turn_index)
            sampled = []  # every group dispatched first: the device samples the later
            for g, group in enumerate(groups):  # groups while the host advances the first.
                if all(episodes[r].over for r in group):
                    continue
                padded = np.r_[group, np.full(rows - len(group), group[0])]
                members = [(r, episodes[r]) for r in group]
                out, caches[g] = self._cached_turn(
                    params, caches[g], members, book, turn_keys[padded]
                )
                self.cached.counts["group_turns"] += 1
                sampled.append((group, out))
            for group, out in sampled:
                out = jax.tree.map(np.asarray, out)
                for i, r in enumerate(group):
                    episode = episodes[r]
                    if episode.over:
                        continue
                    length = int(out.mask[i].sum())
                    # The last sampled id is not in the cache (the next turn appends it).
                    book.held[r] = len(episode.tokens) + length - 1
                    self.advance(episode, out.tokens[i, :length].tolist(),
                                  out.logp[i, :length].tolist())  # fmt: skip
            played += 1
        return list(episodes)

    def _compact(self, episodes, groups, caches, rows) -> list[np.ndarray]:
        """Packs the live episodes into as few groups of `rows` rows as hold them, in
        their order; `caches` (one per group, replaced in place) follow their rows.

        The groups that hold no live episode are dropped. When the live episodes fit in
        fewer groups than remain, new group k is built in a fresh cache from the rows of
        the old groups it takes (`CachedSampler.move`, one call per old group), and every
        old group whose live rows have all moved is dropped then. The episodes keep their
        order, so new group k takes from old groups >= k, and k full new groups empty at
        least k old ones: memory stays within the caches of the groups in play plus one
        group's (rows x cache_len slots) during the move. Keys and the caches' bookkeeping
        are indexed by episode (`_Book`), so they follow: the samples are those of the
        engine without compaction.
        Returns the new groups (episode indices per row)."""
        keep = [g for g, group in enumerate(groups) if any(not episodes[r].over for r in group)]
        live = [(g, i) for g in keep for i, r in enumerate(groups[g]) if not episodes[r].over]
        if -(-len(live) // rows) >= len(keep):
            caches[:] = [caches[g] for g in keep]
            return [groups[g] for g in keep]
        for g in set(range(len(groups))) - set(keep):
            caches[g] = None
        packed, moved = [], []
        for start in range(0, len(live), rows):
            part = live[start : start + rows]
            cache = self.cached.init(rows)
            for g in sorted({g for g, _ in part}):
                take = np.asarray([h == g for h, _ in part] + [False] * (rows - len(part)))
                index = np.zeros(rows, np.int32)
                index[: len(part)] = [i for _, i in part]
                cache = self.cached.move(cache, caches[g], index, take)
            for g in range(part[-1][0]):  # their live rows have all moved.
                caches[g] = None
            packed.append(np.asarray([groups[g][i] for g, i in part]))
            moved.append(cache)
        self.cached.counts["moved_rows"] += len(live)
        caches[:] = moved
        return packed

    def _cached_turn(self, params, caches, members, book, keys):
        """One turn of a group, dispatched: `(Generation, caches)` on the device; rows
        past `members` (`(episode index, episode)` pairs; padding) and episodes over
        sample nothing. With a history window, a cache that does not hold its episode's
        past turns yet (at the first turn of a `play` call) is first filled read turn by
        read turn, each with its window (`_plan`), so every token's keys are those the
        episode's own sampling computed."""
        while True:
            plans = [self._plan(episode, index, book, final=False) for index, episode in members]
            if not any(plans):
                break
            _, caches, *_ = self._write(params, caches, members, plans, book, len(keys))
        plans = [self._plan(episode, index, book, final=True) for index, episode in members]
        logits, caches, *rest = self._write(params, caches, members, plans, book, len(keys))
        start, offset, active = rest
        return self.cached.decode(params, caches, logits, keys, (start, active, offset))

    def _plan(self, episode, index, book, *, final):
        """`(begin, end, drop)`: the transcript tokens [begin, end) the episode's next
        round writes to its cache, after the first `drop` tokens past the header have been
        evicted; None when it writes nothing in this round (over; `final`: the round that
        decodes the turn; else a round that catches up with a past turn).

        Read turn r of a windowed episode (the tokens whose keys are computed at turn r):
        the previous turn's last sampled id, the template tokens read before turn r, and
        (when filling a cache, not sampling) turn r's ids but its last. Before it, the
        turns < r - W are evicted: the policy at turn r reads the header and turns
        r - W .. r - 1 (`TurnWindow` in the scorer, the same rule)."""
        turns, window = len(episode.turns), self.config.history_window
        if episode.over:
            return None
        if not window:
            return (int(book.held[index]), len(episode.tokens), 0) if final else None
        read = int(book.rounds[index])
        if (read < turns) == final:
            return None
        lengths = [len(t.action) for t in episode.turns]
        # Where each turn's ids start in the transcript (turn 0's: the header's length).
        starts = np.cumsum([len(t.obs) for t in episode.turns]) + np.r_[0, np.cumsum(lengths)[:-1]]

        def read_start(r):  # the first token of read turn r.
            return 0 if r == 0 else int(starts[r - 1]) + lengths[r - 1] - 1

        end = len(episode.tokens) if read == turns else read_start(read + 1)
        drop = int(starts[read - window] - starts[0]) if read > window else 0
        return read_start(read), end, drop

    def _write(self, params, caches, members, plans, book, rows):
        """Dispatches one round of `plans` (`_plan`'s, one per member) on a group's caches:
        `(logits, caches, start, offset, active)`, the last three per row for `decode`."""
        tokens = np.full((rows, self.cached.width), self.chat.pad_id, np.int32)
        count, start, offset, header, evict = np.zeros((5, rows), np.int32)
        for i, ((index, episode), plan) in enumerate(zip(members, plans, strict=True)):
            if plan is None:
                continue
            begin, end, drop = plan
            tokens[i, : end - begin] = episode.tokens[begin:end]
            count[i], start[i], offset[i] = end - begin, begin - drop, drop
            header[i] = len(episode.turns[0].obs) if episode.turns else len(episode.tokens)
            evict[i], book.dropped[index] = drop - book.dropped[index], drop
            book.rounds[index] += 1
            counts = self.cached.counts
            counts["context_slots"] = max(counts["context_slots"], end - drop)
        tokens, count, start, offset, header, evict = self.cached.place(
            tokens, count, start, offset, header, evict
        )
        logits, caches = self.cached.prefill(
            params, caches, tokens, count, start, (offset, header, evict)
        )
        return logits, caches, start + count, offset, count > 0

    def _sample(self, params, prompts, valid, keys) -> Generation:
        """`sample` over the rows in calls of at most `config.sample_batch` rows (when the
        batch is larger, the last call is padded with copies of its first row, then
        dropped), fetched to the host. Every row's tokens depend only on its prompt and
        key, so the split changes no sample (tests/test_text.py)."""
        size = len(keys)
        chunk = min(self.config.sample_batch or size, size)
        outs = []
        for start in range(0, size, chunk):
            take = min(chunk, size - start)
            rows = np.r_[np.arange(start, start + take), np.full(chunk - take, start)]
            out = self.sample(params, prompts[rows], valid[rows], keys[rows])
            outs.append(jax.tree.map(lambda x, take=take: np.asarray(x)[:take], out))
        return jax.tree.map(lambda *parts: np.concatenate(parts), *outs)

    def trajectory(self, episodes: Sequence[Episode]) -> Trajectory:
        """The episodes as the trainer's turn-major `Trajectory` (see the module docstring)."""
        return to_trajectory(episodes, self.config, self.chat.pad_id)

    def advance(self, episode: Episode, ids: list[int], logp: list[float]) -> None:
        """Appends one turn of ids (sampled by `play`, or scripted: teacher forcing,
        `rlagent.text.pretrain`), steps the environment, appends its reply (or ends the
        episode as truncated when the reply does not fit the sizes)."""
        chat = self.chat.for_tools(episode.tools)
        ended = bool(ids) and ids[-1] == chat.end_id
        text = chat.decode(ids[:-1] if ended else ids)
        start = len(episode.tokens)
        episode.tokens += ids
        episode.loss_mask += [True] * len(ids)
        episode.spans.append(MessageSpan("assistant", start, len(episode.tokens)))
        message, closed = chat.assistant_turn(episode.messages, text, episode.rendered)
        episode.messages.append(message)
        reply, signals, done = episode.env.step(text)
        signals = {name: float(value) for name, value in signals.items()}
        missing = [name for name in episode.env.signal_names if name not in signals]
        if missing:
            raise ValueError(f"{type(episode.env).__name__}.step reported no signal {missing}")
        episode.turns.append(TurnRecord(episode.pending, ids, logp, signals, bool(done)))
        assistant = len(episode.messages)
        episode.messages += list(reply)
        episode.done = bool(done)
        if episode.over:
            episode.pending = []
            return
        after = chat.after_assistant(episode.rendered.ids, closed.ids)
        glue = ([] if ended else [chat.end_id]) + after
        tokens, spans, episode.rendered = chat.extend(episode.messages, assistant, closed, glue)
        turn = len(episode.turns)
        episode.truncated = _size_fault(tokens, len(episode.tokens), turn, self.config)
        if episode.truncated:
            episode.pending = []
            return
        offset = len(episode.tokens)
        episode.spans += [MessageSpan(s.role, s.start + offset, s.stop + offset) for s in spans]
        episode.tokens += tokens
        episode.loss_mask += [False] * len(tokens)
        episode.pending = tokens


def make_text_loop(
    chat: ChatFormat, graphdef: nnx.GraphDef, policy_config: PolicyConfig, config: TextConfig,
    *, mesh: jax.sharding.Mesh | None = None,
) -> TextLoop:  # fmt: skip
    """The loop of a policy (`nnx.split` of a Llama, ContextLM or Policy: its LM reads the
    transcript as a plain causal LM) with the model's own tokenizer and chat template.
    With `mesh` (`rlagent.models.sharding.fsdp_mesh`) the 'cached' engine splits its rows
    (episodes, caches) over the mesh's data axis; the parameters stay as given (FSDP).

    Refused (`ChatTemplateError`): a policy vocabulary smaller than the tokenizer's, or
    another padding token (`chat.check_vocab`).
    """
    check_vocab(chat, policy_config)
    logits_mask = allowed_to_mask(jnp.asarray(chat.sampling_mask(policy_config.vocab_size)))
    settings = dict(
        max_new_tokens=config.max_new_tokens, temperature=config.temperature,
        top_k=config.top_k, top_p=config.top_p, end_id=chat.end_id, pad_id=chat.pad_id,
    )  # fmt: skip

    def row(params, prompt, valid, key) -> Generation:
        out = generate(
            graphdef, params, prompt[None], key,
            logits_mask=logits_mask, prompt_valid=valid[None], **settings,
        )  # fmt: skip
        return jax.tree.map(lambda x: x[0], out)

    sample = jax.jit(jax.vmap(row, in_axes=(None, 0, 0, 0)))
    cached = None
    if config.engine == "cached":
        sampling = (logits_mask, settings, mesh)
        cached = _cached_sampler(graphdef, policy_config, config, sampling)
    return TextLoop(chat=chat, config=config, sample=sample, cached=cached)


def _cached_sampler(graphdef, policy_config, config, sampling) -> CachedSampler:
    """The 'cached' engine's programs: `sampler.prefill` and `sampler.decode` on one row,
    mapped over the rows (each its own slots), the caches donated; `sampling` is
    `(logits_mask, generation settings, mesh or None)`."""
    logits_mask, settings, mesh = sampling
    chunk = config.prefill_chunk
    # The most tokens one prefill call appends: a whole transcript, or with a history
    # window one read turn (`TextLoop._plan`).
    turn = config.obs_len + config.max_new_tokens
    longest = min(config.max_prompt_len, turn) if config.history_window else config.max_prompt_len
    rows = (
        None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(DATA))
    )

    def prefill_row(params, cache, tokens, count, start, moves):
        offset, header, drop = moves
        if config.history_window:
            cache = evict(cache, header, drop)
        logits, cache = prefill(
            graphdef, params, cache, tokens[None], count, start, chunk=chunk, offset=offset
        )
        return logits[0], cache

    def decode_row(params, cache, logits, key, row):
        start, active, offset = row
        out, cache = decode(
            graphdef, params, cache, logits[None], start, key, done=~active[None],
            offset=offset, logits_mask=logits_mask, **settings,
        )  # fmt: skip
        return jax.tree.map(lambda x: x[0], out), cache

    @functools.partial(jax.jit, static_argnums=0, out_shardings=rows)
    def init(count):
        one = init_cache(policy_config, 1, config.cache_len)
        return jax.tree.map(lambda x: jnp.broadcast_to(x, (count, *x.shape)), one)

    @functools.partial(jax.jit, donate_argnums=0, out_shardings=rows)
    def move(dest, src, index, take):
        def one(to, from_):
            return jnp.where(take.reshape(-1, *[1] * (to.ndim - 1)), from_[index], to)

        return jax.tree.map(one, dest, src)

    return CachedSampler(
        prefill=jax.jit(jax.vmap(prefill_row, in_axes=(None, *[0] * 5)), donate_argnums=1),
        decode=jax.jit(jax.vmap(decode_row, in_axes=(None, *[0] * 4)), donate_argnums=1),
        init=init,
        width=-(-longest // chunk) * chunk,
        sharding=rows,
        move=move,
        counts={"group_turns": 0, "moved_rows": 0, "context_slots": 0},
    )


def to_trajectory(episodes: Sequence[Episode], config: TextConfig, pad_id: int) -> Trajectory:
    """`[B, S, ...]` Trajectory of host episodes, S = their environments' `max_turns`."""
    turns = {e.env.max_turns for e in episodes}
    if len(turns) != 1:
        raise ValueError(f"episodes of different max_turns {sorted(turns)} in one batch")
    shape = (len(episodes), turns.pop())
    for b, episode in enumerate(episodes):  # what the scorer's packed rows can hold.
        length = sum(len(turn.obs) + len(turn.action) for turn in episode.turns)
        if length > config.transcript_len:
            raise ValueError(
                f"episode {b} has a transcript of {length} tokens, more than "
                f"TextConfig.max_prompt_len + max_new_tokens = {config.transcript_len}"
            )
    obs = np.full((*shape, config.obs_len), pad_id, np.int32)
    action = np.full((*shape, config.max_new_tokens), pad_id, np.int32)
    logp = np.zeros(action.shape, np.float32)
    turn_mask, done, success = (np.zeros(shape, bool) for _ in range(3))
    names = tuple(episodes[0].env.signal_names) if episodes else ()
    signals = {name: np.zeros(shape, np.float32) for name in names}
    for b, episode in enumerate(episodes):
        for s, turn in enumerate(episode.turns):
            obs[b, s, : len(turn.obs)] = turn.obs
            action[b, s, : len(turn.action)] = turn.action
            logp[b, s, : len(turn.logp)] = turn.logp
            turn_mask[b, s], done[b, s] = True, turn.done
            success[b, s] = turn.signals.get("success", 0.0) > 0
            for name in names:
                signals[name][b, s] = turn.signals[name]
    lengths = np.asarray([[len(t.action) for t in e.turns] + [0] * (shape[1] - len(e.turns))
                          for e in episodes]).reshape(shape)  # fmt: skip
    action_mask = np.arange(config.max_new_tokens) < lengths[..., None]
    return Trajectory(
        obs_tokens=jnp.asarray(obs), progress=jnp.zeros((*shape, 1), jnp.int32),
        action_tokens=jnp.asarray(action), action_mask=jnp.asarray(action_mask),
        logp=jnp.asarray(logp), values=jnp.zeros(action.shape, jnp.float32),
        turn_mask=jnp.asarray(turn_mask), signals={k: jnp.asarray(v) for k, v in signals.items()},
        success=jnp.asarray(success), done=jnp.asarray(done),
        bootstrap_value=jnp.zeros(shape[:1], jnp.float32),
    )  # fmt: skip


def _left_pad(episodes: Sequence[Episode], length: int, pad_id: int):
    """`(prompts [B, P] int32, valid [B, P] bool)`: each transcript at the right end."""
    prompts = np.full((len(episodes), length), pad_id, np.int32)
    valid = np.zeros(prompts.shape, bool)
    for row, episode in enumerate(episodes):
        if not episode.over:
            prompts[row, length - len(episode.tokens) :] = episode.tokens
            valid[row, length - len(episode.tokens) :] = True
    return jnp.asarray(prompts), jnp.asarray(valid)


def _size_fault(tokens: Sequence[int], before: int, turn: int, config: TextConfig) -> str:
    """Why turn `turn` cannot read `tokens` after a transcript of `before` tokens ('' if
    it can)."""
    if len(tokens) > config.obs_len:
        return (
            f"turn {turn} would read {len(tokens)} template tokens, more than "
            f"TextConfig.obs_len={config.obs_len}"
        )
    if before + len(tokens) > config.max_prompt_len:
        return (
            f"the transcript before turn {turn} would have {before + len(tokens)} tokens, "
            f"more than TextConfig.max_prompt_len={config.max_prompt_len}"
        )
    return ""


def _check_env(env: Any) -> None:
    missing = [
        name for name in ("max_turns", "signal_names", "reset", "step") if not hasattr(env, name)
    ]
    if missing:
        raise TypeError(f"{type(env).__name__} is not a TextEnvironment: it lacks {missing}")
    if "success" in env.signal_names:
        raise ValueError(f"{type(env).__name__}.signal_names must not list 'success'")
