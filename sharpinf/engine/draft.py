"""The draft-model proposer: a smaller model with the target's vocabulary guesses greedily.

Each target sequence that speculates has a shadow here: a Sequence of the draft model keyed by the
target's key, holding the target's tokens and, after them, the draft's own greedy guesses, with its
K/V in the draft's own paged pool. Before each target step, propose() syncs every shadow with its
target (the common prefix is kept; K/V computed past it -- guesses the target rejected -- is rolled
back: num_computed and the blocks past it), feeds what the shadow has not computed (the target's
newly emitted tokens: a new sequence's whole prompt, in chunks within the token budget) and then
decodes single tokens until each has its k guesses, every shadow batched in each draft step. The
shadow's tokens then end with its guesses; the next propose() rolls back those the target did not keep
(rejected, or never verified: the scheduler may take fewer than asked).

The draft runs on the target's backend, in its kernels choice and KV dtype, with its own
ForwardPass, KVPool (engine/kv_budget.plan_draft_blocks: allocated before the target plans its
budget), BlockManager and ModelRunner; nothing of the target's (its steps, metrics, blocks) is
touched. Choices made here:
- a draft whose context is shorter than the target's max_model_len is refused (a shadow holds all
  of its target's positions);
- graphs are captured unless enforce_eager, as for the target: draft steps are small decodes, the
  steps whose launches graphs save the most;
- no prefix cache (a shadow's prompt is computed once; its rollback never meets a cached block) and
  no sliding window (a rollback may return to positions a window has left): every shadow keeps its
  blocks until its target leaves the running set (release).
A shadow that cannot get blocks (the pool full) gets no guesses that step, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sharpinf.engine.block_manager import BlockManager
from sharpinf.engine.kv_budget import plan_draft_blocks
from sharpinf.engine.model_runner import ModelRunner
from sharpinf.engine.scheduler import ScheduledChunk
from sharpinf.engine.sequence import Sequence
from sharpinf.errors import SharpinfError
from sharpinf.model.loader import LoadedModel
from sharpinf.model.registry import open_model
from sharpinf.params import SamplingParams
from sharpinf.step.buffers import StepCapacity
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool
from sharpinf.textgen import StopChecker

GREEDY = SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True)


def check_vocabulary(draft: LoadedModel, target: LoadedModel, name: str) -> None:
    """A draft's guesses are token ids of the target: the same n_vocab and the same token strings,
    or one line naming what differs."""
    dn, tn = draft.config.n_vocab, target.config.n_vocab
    dt, tt = draft.metadata.get("tokenizer.ggml.tokens"), target.metadata.get("tokenizer.ggml.tokens")
    why = None
    if dn != tn:
        why = f"vocabulary ({dn} tokens) is not the target's ({tn})"
    elif dt is None or tt is None:
        why = f"file has no token list (tokenizer.ggml.tokens) to compare with the target's" if dt is None \
            else "target has no token list (tokenizer.ggml.tokens) to compare with"
    elif list(dt) != list(tt):
        if len(dt) != len(tt):
            why = f"token list ({len(dt)} tokens) is not the target's ({len(tt)})"
        else:
            i = next(i for i, (a, b) in enumerate(zip(dt, tt)) if a != b)
            why = f"vocabulary differs from the target's at token {i} ({dt[i]!r}, the target's {tt[i]!r})"
    if why is not None:
        raise SharpinfError(f"speculative: draft model {name}'s {why}: a draft must share the target's tokenizer")


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return int(np.argmax(np.asarray(a[:n]) != np.asarray(b[:n])))


@dataclass
class Shadow:
    """A target sequence's shadow: the draft's Sequence, and how many of its leading tokens were its
    target's at the last sync (a target only appends to its tokens: those never change again)."""

    seq: Sequence
    synced: int


@dataclass
class Job:
    """One target sequence's part of a propose() call: its shadow, where its own guesses start (the
    target's length) and how many it wants."""

    shadow: Sequence
    start: int
    k: int
    stuck: bool = False  # no blocks for its next chunk: no guesses this time

    @property
    def wants(self) -> bool:
        return not self.stuck and len(self.shadow.tokens) - self.start < self.k

    @property
    def guesses(self) -> list[int]:
        return [] if self.stuck else self.shadow.tokens[self.start : self.start + self.k]


class DraftProposer:
    """Guesses from a draft model (a registered name, a .gguf path or a LoadedModel): the Speculator's
    proposer for method "draft", with NgramProposer's interface (propose, release)."""

    def __init__(self, model, engine):
        name = str(model) if isinstance(model, (str, Path)) else Path(model.path).name
        draft = open_model(model)
        check_vocabulary(draft, engine.model, name)
        if draft.config.context_length < engine.max_model_len:
            raise SharpinfError(f"speculative: draft model {name}'s context ({draft.config.context_length} tokens) is "
                                f"shorter than the target's max_model_len ({engine.max_model_len}): set max_model_len "
                                f"<= {draft.config.context_length} or choose a draft with a longer context")
        ec, k = engine.config, engine.config.speculative.num_speculative_tokens
        self.model = draft.with_context(engine.max_model_len)
        self.tokenizer = engine.tokenizer  # the same vocabulary: the stop rules' bytes are the target's
        # a step of the token budget, one logits row for each shadow (a shadow decodes plainly)
        seqs, tokens = ec.max_num_seqs, ec.max_num_batched_tokens
        self.capacity = StepCapacity(tokens=tokens, seqs=seqs, rows=seqs, history=tokens + seqs)
        self.fp = ForwardPass(self.model, engine.backend, capacity=self.capacity, kv_dtype=ec.kv_dtype,
                              kernels=ec.kernels)
        self.fp.freeze()
        eager = ec.enforce_eager
        launches = 0 if eager else self.fp.graph_launches() + engine.fp.graph_launches()
        n = plan_draft_blocks(engine.backend, self.fp.cfg, engine.cfg, ec, engine.max_model_len, k, launches)
        self.pool = KVPool(engine.backend, self.fp.cfg, n, ec.block_size, ec.kv_dtype)
        self.graph_report = None if eager else self.fp.capture_graphs(self.pool)
        self.fp.use_graphs = not eager
        self.blocks = BlockManager(n, ec.block_size, enable_prefix_caching=False)  # window 0: nothing slides
        self.runner = ModelRunner(self.fp, self.pool)
        self.shadows: dict[str, Shadow] = {}  # target key -> its shadow
        self.context = self.model.config.context_length

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        """For each target sequence up to ks[i] greedy guesses of the draft model."""
        jobs = []
        for s, k in zip(seqs, ks):
            k = min(k, s.guess_room)  # more could never be verified
            jobs.append(Job(self._sync(s), len(s.tokens), k) if k > 0 else None)
        live = [j for j in jobs if j is not None]
        while True:
            todo = [j for j in live if j.wants]
            if not todo:
                break
            self._step(todo)
        return [[] if j is None else j.guesses for j in jobs]

    def release(self, seq: Sequence) -> None:
        """seq left the target's running set: its shadow's blocks are freed, the shadow forgotten."""
        sh = self.shadows.pop(seq.key, None)
        if sh is not None:
            self.blocks.release(sh.seq)
            self.runner.release(sh.seq)

    # -- shadows ----------------------------------------------------------------------------------
    def _sync(self, seq: Sequence) -> Sequence:
        """seq's shadow with seq's tokens, its K/V rolled back to what it shares with seq: guesses the
        target rejected or did not verify go; at least seq's last token is left to feed (its logits
        give the first guess)."""
        assert not seq.drafts and not seq.pending, f"{seq.key}: proposed for with guesses or pending tokens"
        t, sh = seq.tokens, self.shadows.get(seq.key)
        if sh is None:
            self.shadows[seq.key] = Shadow(Sequence(seq.key, list(t), GREEDY, 0, StopChecker(GREEDY, self.tokenizer,
                                                                                            self.context)), len(t))
            return self.shadows[seq.key].seq
        d, at = sh.seq, sh.synced
        common = at + common_prefix(t[at:], d.tokens[at:])  # only what came after the last sync can differ
        keep = min(d.num_computed, common, len(t) - 1)
        if keep < d.num_computed:  # K/V of tokens seq does not have there (or of its last, to feed again)
            d.num_computed = keep
            self.blocks.truncate(d, keep)
        del d.tokens[common:]
        d.tokens += t[common:]
        sh.synced = len(t)
        return d

    def _step(self, jobs: list[Job]) -> None:
        """One draft step over the jobs that want guesses: decodes first, then catch-up chunks, within
        the token budget; each chunk that reaches its shadow's end appends the sampled guess."""
        budget, chunks = self.capacity.tokens, []
        for j in sorted(jobs, key=lambda j: j.shadow.remaining):
            if budget <= 0 or len(chunks) == self.capacity.seqs:
                break
            sh = j.shadow
            assert sh.remaining >= 1, f"{sh.key}: a shadow with nothing to feed (its rollback keeps its last token)"
            n = min(sh.remaining, budget)
            if not self.blocks.reserve(sh, sh.num_computed + n):
                j.stuck = True  # the pool is full: what it holds stays for the next call
                continue
            chunks.append(ScheduledChunk(sh, n))
            budget -= n
        if not chunks:
            return
        step = self.runner.submit(chunks)
        for c in chunks:  # the step's K/V is in place before any later step reads it (stream order)
            c.seq.num_computed += c.n_tokens
        for c, token in zip(chunks, self.runner.collect(step)):
            if token is not None:
                c.seq.tokens.append(int(token))
