"""The PTX ISA's fragment layouts, transcribed from its tables as data (PTX ISA 9.7.14.5 "Matrix
Fragments for mma.m16n8k16 with floating point type", "... mma.m16n8k32" with .s8, and 9.7.9.x
ldmatrix), not derived from the emulator's code. Each operand lists, for element i of a lane's
fragment (elements counted low to high through its registers), the ISA's piecewise formula for the
element's row and column, as the ISA writes it: g = groupID = %laneid >> 2, t = threadID_in_group
= %laneid % 4. tests/test_ptx_layouts.py packs matrices into registers by these tables and checks
what the emulator computes, element by element: a layout the emulator got wrong fails here even
though every kernel built on it would pass on the emulator.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Operand:
    elements: int  # elements in one lane's fragment
    bits: int  # bits per element (a 32-bit register holds 32 // bits of them, the lowest index lowest)
    row: tuple[tuple[str, str], ...]  # (condition on i, formula) pairs, the first condition that holds wins
    col: tuple[tuple[str, str], ...]

    def position(self, lane: int, i: int) -> tuple[int, int]:
        env = {"g": lane >> 2, "t": lane % 4, "i": i}
        pick = lambda rules: next(eval(f, {}, env) for c, f in rules if eval(c, {}, env))  # noqa: E731
        return pick(self.row), pick(self.col)


# mma.m16n8k16, .f16 A/B, .f32 C/D
MMA_M16N8K16_F16 = {
    "A": Operand(8, 16,
                 row=(("0 <= i < 2 or 4 <= i < 6", "g"), ("True", "g + 8")),
                 col=(("i < 4", "(t * 2) + (i & 0x1)"), ("i >= 4", "(t * 2) + (i & 0x1) + 8"))),
    "B": Operand(4, 16,
                 row=(("i < 2", "(t * 2) + (i & 0x1)"), ("i >= 2", "(t * 2) + (i & 0x1) + 8")),
                 col=(("True", "g"),)),
    "C": Operand(4, 32,
                 row=(("i < 2", "g"), ("i >= 2", "g + 8")),
                 col=(("True", "(t * 2) + (i & 0x1)"),)),
}
MMA_M16N8K16_SHAPE = (16, 8, 16)

# mma.m16n8k32, .s8 A/B, .s32 C/D
MMA_M16N8K32_S8 = {
    "A": Operand(16, 8,
                 row=(("0 <= i < 4 or 8 <= i < 12", "g"), ("True", "g + 8")),
                 col=(("i < 8", "(t * 4) + (i & 0x3)"), ("i >= 8", "(t * 4) + (i & 0x3) + 16"))),
    "B": Operand(8, 8,
                 row=(("i < 4", "(t * 4) + (i & 0x3)"), ("i >= 4", "(t * 4) + (i & 0x3) + 16")),
                 col=(("True", "g"),)),
    "C": Operand(4, 32,
                 row=(("i < 2", "g"), ("i >= 2", "g + 8")),
                 col=(("True", "(t * 2) + (i & 0x1)"),)),
}
MMA_M16N8K32_SHAPE = (16, 8, 32)

# ldmatrix.sync.aligned.m8n8.x4.b16: threads 8j .. 8j+7 give the addresses of rows 0..7 of matrix j;
# destination register j of each lane holds matrix j's elements (row, col) = (g, 2t) and (g, 2t + 1).
LDMATRIX_X4_ADDRESS = {"matrix": "lane // 8", "row": "lane % 8"}
LDMATRIX_X4_DEST = Operand(2, 16, row=(("True", "g"),), col=(("True", "(t * 2) + i"),))
