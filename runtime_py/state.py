"""The run-time state the app owns between graph calls, and the rules that change it.

`TargetCache`: the target's K/V rows. Row j holds position j. A call at position `pos` with
width S writes rows pos..pos+S-1 (all of them, padding and rejected drafts included) and reads
only rows < pos plus its own; `committed` says how many rows are the text so far, and `tokens`
which tokens the first of them hold (as far as the committer said). Nothing is rolled back: a
rejected row is overwritten by the next call that reaches its position.

`DrafterContext`: the drafter's window (K/V of the last W committed features and their
positions, -1 = empty) and, with memory, its recurrent and conv state. Graphs read one copy
and write the other (two copies, allocated once), then `flip` makes the written one current:
an output is never bound to a buffer its own graph reads. `rows` counts the committed rows folded
in, in order from 0 (-1: the context is out of step with the cache, e.g. rows were committed
without it): a prefix can be kept only if it is exactly what the drafter holds.
"""

from __future__ import annotations

import numpy as np

from hyflash.runtime_py.manifest import STATE_NAMES, Contract


class TargetCache:
    """K and V of every layer, per layer `[1, kv_heads, rows, head_dim]` (BNSH) views of one array.

    Backends that keep the cache inside the program (ExecuTorch mutable buffers) use no host
    buffer (`host=False`); the committed count and the room rule are the same.
    """

    def __init__(self, contract: Contract, host: bool = True):
        c = contract.cache
        self.layers, self.rows = c["layers"], c["rows"]
        shape = (2, c["layers"], 1, c["kv_heads"], c["rows"], c["head_dim"])  # (K|V, L, 1, kvh, T, hd)
        self.data = np.zeros(shape, np.dtype(c["dtype"])) if host else None
        self.committed = 0
        self.tokens: list[int] = []  # the tokens of rows 0..len-1 (<= committed), for reusing a prefix

    def layer(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer i's K and V: (1, kvh, T, hd) views, written in place by the graphs."""
        return self.data[0, i], self.data[1, i]

    def stacked(self) -> tuple[np.ndarray, np.ndarray]:
        """K and V of all layers: (L, kvh, T, hd) views (the eager reference's layout)."""
        return self.data[0, :, 0], self.data[1, :, 0]

    def check_room(self, pos: int, width: int) -> None:
        """A call writes `width` rows from `pos`; they must exist."""
        if not 0 <= pos <= self.committed or pos + width > self.rows:
            raise ValueError(f"a {width}-row call at position {pos} does not fit the cache "
                             f"({self.committed} committed of {self.rows} rows)")

    def commit(self, pos: int, n: int, tokens=None) -> None:
        """Rows pos..pos+n-1 (already written by the call at pos) are now text; later rows are stale.
        `tokens`: the n tokens they hold (without them, rows from pos on are of unknown text)."""
        self.committed = pos + n
        del self.tokens[pos:]
        if tokens is not None and len(self.tokens) == pos:
            self.tokens.extend(int(t) for t in tokens)

    def reset(self) -> None:
        self.committed = 0  # rows are never read past `committed`, so nothing needs zeroing
        self.tokens.clear()


class DrafterContext:
    """The drafter's window and state, twice: `current` is read, `other` is written, then `flip`."""

    def __init__(self, contract: Contract):
        specs = {t["name"]: t for g in contract.drafter_graphs for t in contract.graph(g)["inputs"]
                 if t["name"] in STATE_NAMES}
        names = [n for n in STATE_NAMES if n in specs]
        self.copies = tuple({n: np.zeros(specs[n]["shape"], np.dtype(specs[n]["dtype"])) for n in names}
                            for _ in range(2))
        self.index = 0
        self.window_rows = specs["win_pos"]["shape"][0]
        self.reset()

    @property
    def current(self) -> dict[str, np.ndarray]:
        return self.copies[self.index]

    @property
    def other(self) -> dict[str, np.ndarray]:
        return self.copies[1 - self.index]

    def flip(self) -> None:
        self.index = 1 - self.index

    def folded(self, pos: int, n: int) -> None:
        """Rows pos..pos+n-1 were folded in (after the graphs ran and `flip`)."""
        self.rows = pos + n if self.rows == pos else -1

    def reset(self) -> None:
        for copy in self.copies:
            for name, buf in copy.items():
                buf.fill(-1 if name == "win_pos" else 0)  # win_pos -1: an empty window row
        self.index = 0
        self.rows = 0

    def context_bytes(self, committed: int) -> dict:
        """Bytes of one copy (what a device keeps; the second copy is this runtime's double buffer)."""
        c = self.current
        win = c["win_k"].nbytes + c["win_v"].nbytes
        occupied = win * min(committed, self.window_rows) // self.window_rows
        state = sum(c[n].nbytes for n in ("ssm_state", "conv_state") if n in c)
        return {"allocated": win + c["win_pos"].nbytes + state, "occupied": occupied + c["win_pos"].nbytes + state,
                "window_allocated": win, "window_occupied": occupied, "state": state}
