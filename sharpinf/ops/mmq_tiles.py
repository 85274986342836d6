"""The tiling of the int8 tensor-core products (mmq): a dense product's blocks of rows x 64 tokens,
an MoE layer's tiles of one expert's (token, expert) pairs, and split-K -- a block for each group of
a row's members (mmq_rows.cuh's MqSplit), the group sums in a scratch the backend holds. One module
that the dense launchers (matmul_mmq.py) and the MoE ones (moe.py) both read; it launches nothing.

    grid   (row tiles of a window, token tiles -- or pair tiles --, member groups)
    scratch  4 bytes an output and group of a window's tiles (<= SCRATCH_FLOATS), a ticket a tile
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from sharpinf.ops.matmul_dp4a import member_groups

ROWS_PER_BLOCK = 64  # MQ_ROWS
NARROW_ROWS = 16  # the narrow files' MqShape rows
TOKENS_PER_BLOCK = 64  # MQ_TOKENS
# an MoE layer's tiles: each holds pairs of one expert (moe_dp4a.cu's sort cuts them)
TILE = 8  # DP_TILE: pairs per tile of one expert (moe_dp4a.cu)
MMQ_TILE = 64  # MQ_TOKENS: pairs per tile of one expert on tensor cores (moe_mmq.cu)


def grid(n_out: int, n_tokens: int, rows: int = ROWS_PER_BLOCK) -> tuple[int, int]:
    return row_tiles(n_out, rows), token_tiles(n_tokens)


def row_tiles(n_out: int, rows: int) -> int:
    """A product's tiles of `rows` weight rows (grid.x, before windows)."""
    return -(-n_out // rows)


# -- split-K (mmq_rows.cuh's MqSplit): a block for each group of a row's members -------------------
SCRATCH_FLOATS = 16 << 20  # 64 MB of group sums at most a launch: a bigger grid runs in windows of row tiles


@dataclass
class MmqScratch:
    """The group sums of a launch's tiles and their tickets (zero between launches), one per
    backend, grown to the largest launch seen (Workspace reserves a model's before any graph)."""

    partial: Any  # float [floats]
    tickets: Any  # i32 [tiles]


_SCRATCH: "weakref.WeakKeyDictionary[Any, MmqScratch]" = weakref.WeakKeyDictionary()


def token_tiles(n_tokens: int) -> int:
    """A dense product's tiles of up to 64 tokens (grid.y; an MoE launch's is max_tiles)."""
    return -(-n_tokens // TOKENS_PER_BLOCK)


def split_plan(n_out: int, n_in: int, gy: int, nmat: int, rows: int) -> tuple[int, int, int]:
    """(row tiles a launch, scratch floats, tickets) for a product of gy token tiles: every row tile
    in one launch where the group sums fit SCRATCH_FLOATS (or there is one group: no scratch), else
    windows."""
    groups = member_groups(n_in)
    gx = row_tiles(n_out, rows)
    if groups == 1:
        return gx, 0, 0
    per_tile_column = nmat * groups * TOKENS_PER_BLOCK * rows * gy
    window = min(gx, max(1, SCRATCH_FLOATS // per_tile_column))
    return window, window * per_tile_column, window * gy


def mmq_scratch(be, floats: int, tickets: int) -> MmqScratch:
    """The backend's split-K scratch, at least `floats` and `tickets` long (grown if not)."""
    s = _SCRATCH.get(be)
    if s is None or s.partial.size < floats or s.tickets.size < tickets:
        have = (s.partial.size, s.tickets.size) if s is not None else (1, 1)
        s = MmqScratch(be.empty((max(floats, have[0]),), np.float32), be.zeros((max(tickets, have[1]),), np.int32))
        _SCRATCH[be] = s
    return s


def reserve_scratch(be, cfg, tokens: int, rows: int) -> MmqScratch:
    """The scratch a model's linear layers need for steps of `tokens` tokens and `rows` logits rows
    (wide and narrow blocks; an MoE model's experts in moe_mmq's tiles of pairs), allocated now --
    not inside a graph capture."""
    t, r = token_tiles(tokens), token_tiles(rows)
    shapes = [(cfg.q_dim + 2 * cfg.kv_dim, cfg.n_embd, t, 1), (cfg.n_embd, cfg.q_dim, t, 1),
              (cfg.n_vocab, cfg.n_embd, r, 1)]
    if cfg.is_moe:
        pt = max_tiles(tokens * cfg.n_expert_used, cfg.n_expert, MMQ_TILE)
        shapes += [(cfg.n_ff_exp, cfg.n_embd, pt, 2), (cfg.n_embd, cfg.n_ff_exp, pt, 1)]
    else:
        shapes += [(cfg.n_ff, cfg.n_embd, t, 2), (cfg.n_embd, cfg.n_ff, t, 1)]
    # every grid.y up to the capacity's: a plan's floats are not monotone in it (the window's floor), and
    # a smaller step must not grow the scratch after the graphs are recorded
    plans = [split_plan(n_out, n_in, y, nmat, rows_) for n_out, n_in, gy, nmat in shapes
             for rows_ in (ROWS_PER_BLOCK, NARROW_ROWS) for y in range(1, gy + 1)]
    return mmq_scratch(be, max(p[1] for p in plans), max(p[2] for p in plans))


def split_k_scratch(be, cfg, cap) -> dict[str, MmqScratch]:
    """The registry's scratch of the split-K variants (mmq, mmq_narrow, best, tuned; moe mmq): the
    model's group sums for a step capacity, reserved with the workspace (never inside a graph)."""
    return {"mmq_split": reserve_scratch(be, cfg, cap.tokens, cap.rows)}


def split_launches(be, rows: int, gy: int, n_out: int, n_in: int, nmat: int, launch_one) -> None:
    """launch_one(grid, extra args, io share) for each window of row tiles of a product of gy token
    tiles (grid.y): grid.z = the groups, the extra args the scratch and the window's first row tile."""
    window, floats, tickets = split_plan(n_out, n_in, gy, nmat, rows)
    sc = mmq_scratch(be, floats, tickets)
    gx = row_tiles(n_out, rows)
    for x0 in range(0, gx, window):
        nx = min(window, gx - x0)
        launch_one((nx, gy, member_groups(n_in)), (sc.partial, sc.tickets, np.int32(x0)), nx / gx)


def max_tiles(n_pairs: int, n_expert: int, tile: int = TILE) -> int:
    """Tiles of <= tile pairs of one expert that any routing of n_pairs pairs can need (a buffer
    sized for TILE holds any larger tile's)."""
    return -(-n_pairs // tile) + min(n_expert, n_pairs)


def tiles_capacity(n_pairs: int, n_expert: int, n_used: int) -> int:
    """The tiles a grouped scratch for n_pairs pairs (k = n_used a token) holds: max_tiles for TILE, or
    for moe_gemv's tiles of NT >= the step's tokens, whose pairs over NT are at most k (so k more)."""
    return max_tiles(n_pairs, n_expert) + n_used
