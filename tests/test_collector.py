"""Importing lightning-scale leaves Lightning's and torch's objects frozen out of the garbage collector, with little
garbage among them, and the collector running for what the program creates afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = """
import gc, json
import lightning_scale
import lightning.pytorch, torch  # imported by the package already
frozen = gc.get_freeze_count()
enabled = gc.isenabled()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle created afterwards: the collector's to free
del a, b
later = gc.collect()
gc.unfreeze()
frozen_garbage = gc.collect()  # whatever was frozen and is unreachable
print(json.dumps({"frozen": frozen, "enabled": enabled, "later": later, "frozen_garbage": frozen_garbage}))
"""


def test_import_freezes_lightnings_objects_with_little_garbage_and_the_collector_runs_afterwards():
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["enabled"] is True
    assert result["frozen"] > 200_000, result  # Lightning's and torch's ~340 K objects
    assert result["later"] >= 2, result  # the cycle made after the import was collected
    # the import's own garbage, frozen with it rather than found by a full collection: a small share
    assert result["frozen_garbage"] < result["frozen"] // 20, result
