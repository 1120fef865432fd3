"""An integer matrix times a list of integer vectors in few instructions: the Winograd
transforms of qwinograd.py (B^T d B, (L A^T S^-1) M (...)^T), whose rows share terms.

Integer sums are exact (modulo 2^n, as every integer the transforms compute), so any
order of the additions gives the same bits, and two kinds of sharing are free:

- Terms of one coefficient magnitude are summed first and multiplied once: F(4x4)'s
  output row [0, 4, -4, 8, -8, 24] is 4 (m1 - m2) + 8 (m3 - m4) + 24 m5, not five products.
  Each such group (and each group times its coefficient) is built once per call, so rows
  that hold it again reuse it: the same row's 4 (m1 - m2) is the row above's.
- Two rows r and r' whose half sum P and half difference Q are integer rows with fewer
  terms are r = P + Q and r' = P - Q: F(4x4)'s input rows [0, -2, -1, 2, 1, 0] and
  [0, 2, -1, -2, 1, 0] are (d4 - d2) +- 2 (d3 - d1), 5 instructions in place of 8.

F(4x4)'s input transform of a 6 x 6 window takes 12 x 18 instructions so, against 12 x 28
term by term (a product for each coefficient other than +-1), and its output transform
10 x 20 against 10 x 30.  LLVM finds some of this sharing by itself, not all: ResNet-18's
int8 64 @56 layers took 1.49-1.51 -> 1.44-1.45 Mcycles, 128 @28 and 256 @14 1-3% less
(Zen 3, x86-64-v3, 1 thread, fastest of 40 in the model).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir


def combine_integer(b, matrix, xs: list) -> list:
    """matrix @ xs for an integer matrix and integer vectors (sharing as above)."""
    rows = [np.asarray(r, np.int64) for r in np.rint(np.asarray(matrix, np.float64))]
    assert np.allclose(np.asarray(matrix, np.float64), np.asarray(rows, np.float64)), \
        "integer vectors: integer coefficients"
    forms = _Forms(b, xs)
    out: list = [None] * len(rows)
    for i, j, p, q in _row_pairs(rows):
        fp, fq = forms.emit(p), forms.emit(q)
        out[i], out[j] = b.add(fp, fq), b.sub(fp, fq)
    for i, r in enumerate(rows):
        if out[i] is None:
            out[i] = forms.emit(r)
    return out


def _groups(row: np.ndarray) -> list:
    """The row's terms by coefficient magnitude, smallest first: [(magnitude, ((index,
    sign), ...))]."""
    out = []
    for mag in sorted({abs(int(c)) for c in row if c}):
        terms = [(j, 1 if row[j] > 0 else -1) for j in range(len(row)) if abs(int(row[j])) == mag]
        out.append((mag, tuple(terms)))
    return out


def _cost(row: np.ndarray) -> int:
    """Instructions a row takes alone: an addition a term past the first, a product a
    magnitude other than 1."""
    return max(int(np.count_nonzero(row)) - 1, 0) + sum(1 for mag, _ in _groups(row) if mag != 1)


def _row_pairs(rows: list) -> list:
    """Disjoint pairs of rows (i, j, P, Q), r_i = P + Q and r_j = P - Q, taken greedily
    while they save instructions."""
    free = set(range(len(rows)))
    pairs = []
    while True:
        best = None
        for i in sorted(free):
            for j in sorted(free):
                if j <= i:
                    continue
                s, d = rows[i] + rows[j], rows[i] - rows[j]
                if np.any(s % 2) or np.any(d % 2) or not s.any() or not d.any():
                    continue
                p, q = s // 2, d // 2
                gain = _cost(rows[i]) + _cost(rows[j]) - (_cost(p) + _cost(q) + 2)
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, i, j, p, q)
        if best is None:
            return pairs
        _, i, j, p, q = best
        free -= {i, j}
        pairs.append((i, j, p, q))


class _Forms:
    """Emits integer rows over xs, each group's sum and each scaled group once (a group
    met again with every sign flipped is the same value, subtracted in place of added)."""

    def __init__(self, b, xs: list):
        self.b, self.xs = b, xs
        self.memo: dict = {}

    def _scaled(self, mag: int, terms: tuple):
        """(value, sign): mag x the signed sum of terms is sign x value."""
        key = (mag, terms)
        if key in self.memo:
            return self.memo[key], 1
        flipped = (mag, tuple((j, -s) for j, s in terms))
        if flipped in self.memo:
            return self.memo[flipped], -1
        b = self.b
        # A positive term first: x1 - x2 is one instruction, -x1 + x2 two.
        ordered = sorted(terms, key=lambda t: t[1] < 0)
        sign = ordered[0][1]
        acc = self.xs[ordered[0][0]]
        for j, s in ordered[1:]:
            acc = b.add(acc, self.xs[j]) if s == sign else b.sub(acc, self.xs[j])
        if mag != 1:
            acc = b.mul(ir.Constant(acc.type, [mag] * acc.type.count), acc)
        self.memo[(mag, tuple((j, s * sign) for j, s in terms))] = acc
        return acc, sign

    def emit(self, row: np.ndarray):
        """The row's value: its groups' scaled sums added or subtracted, a positive one
        first (negated where none is)."""
        b = self.b
        parts = [tuple(reversed(self._scaled(mag, terms))) for mag, terms in _groups(row)]
        parts.sort(key=lambda p: p[0] < 0)              # a positive part first, if any
        sign, acc = parts[0]
        for s, v in parts[1:]:
            acc = b.add(acc, v) if s == sign else b.sub(acc, v)
        if sign < 0:                                    # every part was negative: -(sum)
            acc = b.sub(ir.Constant(acc.type, None), acc)
        return acc
