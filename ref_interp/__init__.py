"""The exact reference interpreter of Tile: ground truth for every transform and backend."""

from ref_interp.numerics import PRECISIONS
from ref_interp.run import run

__all__ = ["run", "PRECISIONS"]
