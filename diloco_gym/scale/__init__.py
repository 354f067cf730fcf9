"""Scale-out: run the protocol's cells, sweeps and tuning on local processes or on Ray.

Ray is optional (``pip install "diloco-gym[ray]"``); nothing here imports it until the
``ray`` backend is asked for. See docs/scale-out.md.
"""

from diloco_gym.backends import BACKENDS, CellError, default_jobs, require_ray, run_cells

__all__ = ["BACKENDS", "CellError", "default_jobs", "require_ray", "run_cells"]
