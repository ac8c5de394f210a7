"""Several user-code cells in one launch: ``python -m tests.data.matrix_job CELLS.json`` (under torchrun).

Cells run one after the other; a cell whose ``finished`` file exists is skipped, so the next launch of the same
command resumes the cell that the previous launch was interrupted in, then starts the next one. Each cell is one
``lightning_scale.testing.runner`` job (the attempt ``assert_exact_resume`` runs), with ``USER_CELL`` set for
``tests.data.user_code``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from lightning_scale import distributed
from lightning_scale.testing import runner


def main(path: str) -> None:
    for cell in json.loads(Path(path).read_text()):
        finished = Path(cell["out_dir"]) / "finished"
        if finished.exists():  # decided alike on every rank: nothing writes it while the cells before it run
            continue
        os.environ["USER_CELL"] = json.dumps(cell["cell"])
        runner.main(cell["config"])
        distributed.barrier()
        if distributed.rank() == 0:
            finished.write_text("")
        distributed.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
    distributed.destroy_process_group(process_ends=True)
