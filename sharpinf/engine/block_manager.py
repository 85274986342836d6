"""BlockManager: KV blocks of the paged pool, handed to sequences; prefix caching.

A block is free (ref 0) or held by one or more sequences (ref >= 1). A *full* block
whose tokens are all computed is registered under a chained hash of its tokens and
everything before them, so a later request with the same prefix takes the block
instead of recomputing it. Freed blocks keep their hash until they are handed out
again; the free list is ordered oldest-freed first, so the most recently used cached
blocks are the last to go.

Choices (n > 1): fork() gives a new sequence the parent's block table, each block's reference
count raised (the blocks of the positions the fork computed only). A block is written only by a
sequence that holds it alone: reserve() gives a sequence a fresh block for a shared one it is about
to write into (copy on write), and when the shared block holds positions before the write, queues
the (source, destination) pair in `copies` for the engine to copy on the device before the step.

Sliding windows: when every layer of the model is windowed (ModelConfig.kv_window > 0), a block
whose positions all lie before the window of the sequence's next query is never read again (the
attention kernels neither look it up nor read it): slide() frees it and leaves SLID in its table
entry. When any layer attends to the whole context (Gemma 3's global layers), nothing slides.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from sharpinf.engine.sequence import Sequence

SLID = -1  # a block-table entry whose block slid out of every layer's window and was freed


def block_hash(prev: int | None, tokens: tuple[int, ...]) -> int:
    """Chained: a block's hash covers every token before it too."""
    return hash((prev, tokens))


@dataclass
class CachedBlock:
    key: int
    tokens: tuple[int, ...]  # compared on a hit, so a hash collision can never serve wrong KV
    prev: int | None


@dataclass
class BlockManager:
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = True
    window: int = 0  # ModelConfig.kv_window: > 0 when every layer slides, so old blocks can be freed
    ref: list[int] = field(init=False)
    free: "OrderedDict[int, None]" = field(init=False)
    cached: dict[int, int] = field(default_factory=dict)  # hash -> block id
    info: dict[int, CachedBlock] = field(default_factory=dict)  # block id -> its cache entry
    hit_tokens: int = 0
    queried_tokens: int = 0
    slid: int = 0  # blocks freed by sliding windows so far
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy on write: (source, destination) to copy
    forked_blocks: int = 0  # blocks shared by fork() so far
    copied_blocks: int = 0  # blocks copied on write so far

    def __post_init__(self):
        self.ref = [0] * self.num_blocks
        self.free = OrderedDict((b, None) for b in range(self.num_blocks))

    # -- accounting ------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    def blocks_needed(self, seq: Sequence, upto: int) -> int:
        """New blocks seq needs so that positions 0..upto-1 have a home."""
        return max(0, -(-upto // self.block_size) - len(seq.block_table))

    # -- prefix cache ------------------------------------------------------------------------
    def _lookup(self, seq: Sequence) -> tuple[list[int], int | None]:
        """Cached blocks for seq's leading full blocks, leaving at least its last token to
        compute, and the chained hash of the last of them."""
        if not self.enable_prefix_caching:
            return [], None
        bs, found, prev = self.block_size, [], None
        for i in range((len(seq.tokens) - 1) // bs):
            toks = tuple(seq.tokens[i * bs : (i + 1) * bs])
            key = block_hash(prev, toks)
            b = self.cached.get(key)
            if b is None or self.info[b].tokens != toks or self.info[b].prev != prev:
                break
            found.append(b)
            prev = key
        return found, prev

    def register_full_blocks(self, seq: Sequence) -> None:
        """After a step: put seq's newly completed full blocks into the prefix cache (only the
        new ones: the chain's last hash is kept on the sequence). A block holding a PENDING token
        (async scheduling: its id is not back yet) waits until the id is real."""
        if not self.enable_prefix_caching:
            return
        bs, prev = self.block_size, seq.last_block_hash
        real = len(seq.tokens) - seq.pending - seq.drafts  # a guess is never cached: it may be rejected
        for i in range(seq.registered_blocks, min(seq.num_computed, real) // bs):
            toks = tuple(seq.tokens[i * bs : (i + 1) * bs])
            key = block_hash(prev, toks)
            b = seq.block_table[i]
            if b not in self.info and key not in self.cached:
                self.cached[key] = b
                self.info[b] = CachedBlock(key, toks, prev)
            prev = key
            seq.registered_blocks, seq.last_block_hash = i + 1, key

    def _take_free(self) -> int:
        b, _ = self.free.popitem(last=False)
        entry = self.info.pop(b, None)  # handed out again: its old contents are gone
        if entry is not None and self.cached.get(entry.key) == b:
            del self.cached[entry.key]
        return b

    def cached_prefix_len(self, seq: Sequence) -> int:
        """Tokens of seq the prefix cache would serve at admission (nothing is taken)."""
        return len(self._lookup(seq)[0]) * self.block_size

    # -- sequences -------------------------------------------------------------------------
    def admit(self, seq: Sequence, first_chunk: int) -> bool:
        """Attach seq's cached prefix and blocks for its first chunk (the tokens after that
        prefix), all or nothing."""
        assert not seq.block_table and seq.num_computed == 0
        hits, last_hash = self._lookup(seq)
        revived = sum(1 for b in hits if self.ref[b] == 0)  # cached but free: they leave the free list
        upto = len(hits) * self.block_size + first_chunk
        need = -(-upto // self.block_size) - len(hits)
        if need + revived > self.num_free:
            return False
        for b in hits:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1
        seq.block_table = list(hits)
        seq.num_computed = len(hits) * self.block_size
        seq.registered_blocks, seq.last_block_hash = len(hits), last_hash
        self.queried_tokens += len(seq.tokens)
        self.hit_tokens += seq.num_computed
        seq.metrics.cached_prompt_tokens = seq.num_computed
        return self.reserve(seq, upto)

    def _shared_block(self, seq: Sequence, upto: int) -> int | None:
        """The index in seq's table of the block position num_computed is written into, when the
        table already has it and another sequence holds it too (seq must have its own first), else None."""
        i = seq.num_computed // self.block_size
        if upto <= seq.num_computed or i >= len(seq.block_table):
            return None
        b = seq.block_table[i]
        return i if b != SLID and self.ref[b] > 1 else None

    def reserve(self, seq: Sequence, upto: int) -> bool:
        """Blocks so positions 0..upto-1 have a home, and the block the step writes first held by
        seq alone (copy on write); False (and nothing taken) if too few are free."""
        cow = self._shared_block(seq, upto)
        need = self.blocks_needed(seq, upto)
        if need + (cow is not None) > self.num_free:
            return False
        if cow is not None:
            src, dst = seq.block_table[cow], self._take_free()
            self.ref[dst] = 1
            self._unref(src)
            seq.block_table[cow] = dst
            if seq.num_computed % self.block_size:  # positions before num_computed live there: copy them
                self.copies.append((src, dst))
                self.copied_blocks += 1
        for _ in range(need):
            b = self._take_free()
            self.ref[b] = 1
            seq.block_table.append(b)
        return True

    def fork(self, parent: Sequence, child: Sequence, computed: int) -> None:
        """child continues from parent's cache of positions 0..computed-1: the blocks holding them
        (each held once more) and the prefix-cache chain over them."""
        assert not child.block_table, "a forked sequence starts without blocks"
        table = parent.block_table[: -(-computed // self.block_size)]
        for b in table:
            if b != SLID:
                self.ref[b] += 1
                self.forked_blocks += 1
        child.block_table = list(table)
        assert parent.registered_blocks <= computed // self.block_size, "registered blocks hold computed tokens"
        child.num_computed, child.slid_blocks = computed, min(parent.slid_blocks, len(table))
        child.registered_blocks, child.last_block_hash = parent.registered_blocks, parent.last_block_hash

    def take_copies(self) -> list[tuple[int, int]]:
        """The copies on write queued since the last call (the runner does them before the step)."""
        out, self.copies = self.copies, []
        return out

    def slide(self, seq: Sequence) -> None:
        """After a step: free seq's leading blocks that every layer's window has left. Its next query
        is at position num_computed and sees keys from num_computed - window + 1 on; so do all later
        ones. (Call after register_full_blocks: a freed block stays in the prefix cache.)"""
        if not self.window:
            return
        kept = seq.num_computed - seq.drafts  # the guesses may be rejected: the query may come back to there
        gone = min(max(0, kept - self.window + 1) // self.block_size, len(seq.block_table))
        for i in range(seq.slid_blocks, gone):
            self._unref(seq.block_table[i])
            seq.block_table[i] = SLID
            self.slid += 1
        seq.slid_blocks = max(seq.slid_blocks, gone)

    def truncate(self, seq: Sequence, upto: int) -> int:
        """Speculation's rollback: seq keeps the blocks of positions 0..upto-1 (what a plain run
        would hold) and frees the rest, which held rejected guesses only (never registered). Returns
        the blocks freed."""
        keep, freed = -(-upto // self.block_size), 0
        assert seq.registered_blocks <= upto // self.block_size, "a registered block holds kept tokens only"
        while len(seq.block_table) > keep:
            b = seq.block_table.pop()
            if b != SLID:
                self._unref(b)
                freed += 1
        return freed

    def _unref(self, b: int) -> None:
        self.ref[b] -= 1
        assert self.ref[b] >= 0, "block freed twice"
        if self.ref[b] == 0:
            self.free[b] = None

    def release(self, seq: Sequence) -> None:
        """Finish or preemption: drop seq's hold on its blocks (cached ones stay findable)."""
        for b in reversed(seq.block_table):  # tail first: the prefix stays cached longest
            if b != SLID:
                self._unref(b)
        seq.block_table = []
        seq.num_computed = seq.slid_blocks = 0
        seq.registered_blocks, seq.last_block_hash = 0, None

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0
