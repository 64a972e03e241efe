"""Replay of the lean route's formation of Q against a model of CuPy's memory pool (no GPU).

CuPy's pool (``cupy.cuda.MemoryPool``) rounds a request to 512 bytes, hands out the
smallest free chunk that holds it (split: the rest stays free), gives a request no free
chunk holds a new block of its size from the device, merges a freed chunk only with its
free neighbours of the same block, and ``free_all_blocks`` hands back the blocks that are
wholly free. This script replays the allocations of Q's lean formation
(``mpqr.qr.householder_recursive._form_q_lean``: per column block of Q the chunks'
``Y^H Q``, ``T D`` and ``Q -= Y D``, then the block's own columns) on the engine's
allocation pattern (``tc-fp16-splitb`` at fp16, ``tc-sgemm`` at fp32-emulated; the policy's
tiles within the lean cap) and prints the pool's high-water of the temporaries (beyond Q,
R and the T's) as a multiple of the input's bytes, handing cached blocks back before a
block once they pass 2% of Q ("release") against holding one block of
``lean_q_workspace`` bytes ("reserve").

``python bench/probes/memory_pool_replay.py`` (a few seconds).
"""

from __future__ import annotations

import itertools

from mpqr.engines.tc_sgemm import partials_limit
from mpqr.qr.householder_recursive import lean_q_workspace
from mpqr.qr.memory_plan import LEAN_SPLIT_FRACTION, SPLIT_FLOOR

UNIT = 512


def _round(n: int) -> int:
    return -(-n // UNIT) * UNIT


class Pool:
    """CuPy's pool as described above (one stream)."""

    def __init__(self) -> None:
        self.blocks: dict[int, int] = {}
        self.chunks: dict[int, list] = {}  # id -> [block, offset, size, free]
        self.ids = itertools.count()
        self.total = self.high = 0

    def malloc(self, n: int) -> int:
        n = _round(n)
        fits = [(c[2], i) for i, c in self.chunks.items() if c[3] and c[2] >= n]
        if not fits:
            b = next(self.ids)
            self.blocks[b] = n
            self.total += n
            self.high = max(self.high, self.total)
            i = next(self.ids)
            self.chunks[i] = [b, 0, n, False]
            return i
        size, i = min(fits)
        b, off = self.chunks[i][:2]
        self.chunks[i] = [b, off, n, False]
        if size > n:
            self.chunks[next(self.ids)] = [b, off + n, size - n, True]
        return i

    def free(self, i: int) -> None:
        self.chunks[i][3] = True
        b = self.chunks[i][0]
        merged = True
        while merged:
            merged = False
            _, off, size, _ = self.chunks[i]
            for j, (b2, o2, s2, f2) in list(self.chunks.items()):
                if j == i or not f2 or b2 != b:
                    continue
                if o2 + s2 == off:
                    self.chunks[j] = [b, o2, s2 + size, True]
                elif off + size == o2:
                    self.chunks[j] = [b, off, size + s2, True]
                else:
                    continue
                del self.chunks[i]
                i, merged = j, True
                break

    def free_bytes(self) -> int:
        return sum(c[2] for c in self.chunks.values() if c[3])

    def free_all_blocks(self) -> None:
        for i, (b, off, size, f) in list(self.chunks.items()):
            if f and off == 0 and size == self.blocks[b]:
                del self.chunks[i]
                self.total -= self.blocks.pop(b)

    def reserve(self, n: int) -> None:  # backends/cupy/backend.py: reserve_workspace
        n = _round(n)
        if n <= self.free_bytes() <= n + max(n >> 4, 1 << 20):
            return
        self.free_all_blocks()
        if self.free_bytes() < n:
            self.free(self.malloc(n))


def _tiles(per: int, m: int, n: int, k: int, limit: int) -> list[tuple[int, int]] | None:
    # mpqr.policy.policy._tiles
    def scratch(mb: int, nb: int) -> int:
        return per * k * (mb + nb) + 8 * mb * nb

    mb, nb = m, n
    while scratch(mb, nb) > limit:
        if mb >= nb and mb > 256:
            mb = -(-mb // 2)
        elif nb > 256:
            nb = -(-nb // 2)
        elif mb > 256:
            mb = -(-mb // 2)
        else:
            break
    if (mb, nb) == (m, n):
        return None
    return [(min(mb, m - i), min(nb, n - j)) for i in range(0, m, mb) for j in range(0, n, nb)]


def _splitb(p: Pool, m: int, n: int, k: int, fused: bool) -> int | None:
    # mpqr.engines.tc_fp16_splitb with a float32 A: three fp16 copies of each operand
    s = [p.malloc(4 * n), p.malloc(4 * m)]
    a = [p.malloc(2 * m * k) for _ in range(3)]
    p.free(a.pop())
    b = [p.malloc(2 * k * n) for _ in range(3)]
    p.free(b.pop(1))
    c = p.malloc(4 * m * n)
    out = p.malloc(4 * m * n)  # unscaled
    p.free(c)
    for h in s + a + b:
        p.free(h)
    if fused:  # written or subtracted in place, then dropped
        p.free(out)
        return None
    return out


def _sgemm(p: Pool, m: int, n: int, k: int, fused: bool, partials: int) -> int | None:
    # mpqr.engines.tc_sgemm: hi and [hi | lo] of each operand, the k-slices' partials
    s = [p.malloc(4 * m), p.malloc(2 * m * k), p.malloc(4 * m * k),
         p.malloc(4 * n), p.malloc(2 * k * n), p.malloc(4 * k * n)]
    c = p.malloc(4 * m * n)
    slice_k = 128 if m * n < 2**24 else 1024
    nfull, group = k // slice_k, partials // max(1, 4 * m * n)
    if nfull > 1 and group > 1:
        for g0 in range(0, nfull, group):
            p.free(p.malloc(4 * min(group, nfull - g0) * m * n))
    for h in s:
        p.free(h)
    if fused:  # unscaled into its output in one pass
        p.free(c)
        return None
    out = p.malloc(4 * m * n)
    p.free(c)
    return out


def _gemm(p: Pool, engine: str, m: int, n: int, k: int, limit: int, into: bool) -> int | None:
    partials = partials_limit(limit) if engine == "tc-sgemm" else 0
    tiles = _tiles(6, m, n, k, limit - partials)

    def run(mb: int, nb: int, fused: bool) -> int | None:
        if engine == "tc-sgemm":
            return _sgemm(p, mb, nb, k, fused, partials)
        return _splitb(p, mb, nb, k, fused)

    if tiles is None:
        out = run(m, n, into and engine == "tc-sgemm")
        if into and out is not None:
            p.free(out)
            return None
        return out
    c = None if into else p.malloc(4 * m * n)
    for mb, nb in tiles:
        run(mb, nb, True)
    return c


def replay(m: int, n: int, cols: int, qb: int, engine: str, scheme: str) -> float:
    """The temporaries' high-water of Q's formation (``m x cols`` Q, ``n`` columns of
    vectors), a multiple of the input's ``m n 4`` bytes."""
    limit = max(SPLIT_FLOOR, int(LEAN_SPLIT_FRACTION * m * n * 4))
    chunk = -(-n // 4)
    partials = partials_limit(limit) if engine == "tc-sgemm" else 0
    reserve = lean_q_workspace(m, qb, chunk, 4, limit, partials)
    p = Pool()
    for c0 in range(n - qb, -1, -qb):
        c1, rows = c0 + qb, m - c0
        if scheme == "reserve":
            p.reserve(reserve)
        elif p.free_bytes() >= 0.02 * m * cols * 4:
            p.free_all_blocks()
        p.free(p.malloc(4 * qb * qb))  # the block's unit lower copy
        for j0 in range(c1, cols, chunk):
            w = min(cols, j0 + chunk) - j0
            d = _gemm(p, engine, qb, w, rows - qb, limit, into=False)
            d2 = p.malloc(4 * qb * w)  # T_j D
            p.free(d)
            _gemm(p, engine, rows, w, qb, limit, into=True)  # Q -= Y D
            p.free(d2)
        yc = p.malloc(4 * rows * qb)
        t, e = p.malloc(4 * qb * qb), p.malloc(4 * qb * qb)
        p.free(t)
        _gemm(p, engine, rows, qb, qb, limit, into=True)
        p.free(yc)
        p.free(e)
    return p.high / (m * n * 4)


if __name__ == "__main__":
    print(f"{'Q formation':<44} {'release':>8} {'reserve':>8} {'held':>6}")
    for m, n, cols, qb, engine in ((16384, 16384, 16384, 512, "tc-fp16-splitb"),
                                   (16384, 16384, 16384, 512, "tc-sgemm"),
                                   (65536, 8192, 8192, 512, "tc-sgemm"),
                                   (8192, 2048, 8192, 128, "tc-sgemm"),
                                   (4096, 1024, 4096, 64, "tc-sgemm")):
        limit = max(SPLIT_FLOOR, int(LEAN_SPLIT_FRACTION * m * n * 4))
        part = partials_limit(limit) if engine == "tc-sgemm" else 0
        held = lean_q_workspace(m, qb, -(-n // 4), 4, limit, part) / (m * n * 4)
        tag = f"{m} x {n} (Q {m} x {cols}) {engine}"
        print(f"{tag:<44} {replay(m, n, cols, qb, engine, 'release'):>7.3f}x "
              f"{replay(m, n, cols, qb, engine, 'reserve'):>7.3f}x {held:>5.3f}x", flush=True)
