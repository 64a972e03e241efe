"""A/B of how a collective call learns where a fresh array's blocks are: found by the
workers in the call (``collective.FIND = True``: every rank's holdings summed by an
all-reduce) or asked of the scheduler before it (``False``: ``who_has``, one trip on the
call's path).

``python bench/probes/dask_holders_ab.py [ROUNDS]`` on a host with two GPUs:
``dask_call_ab.py ROUNDS collective.FIND=True,False`` (the bench's cluster and matrix,
``qr`` with ``Q`` persisted and ``mode="r"``, the two settings alternated call by call),
written to ``$OUT/dask_holders_ab.json``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dask_call_ab

if __name__ == "__main__":
    rounds = sys.argv[1] if len(sys.argv) > 1 else "9"
    sys.argv = [sys.argv[0], rounds, "collective.FIND=True,False"]
    dask_call_ab.main(out_name="dask_holders_ab.json")
