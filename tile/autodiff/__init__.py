"""Automatic differentiation of Tile programs, producing Tile programs."""

from tile.autodiff.combined import TileGradientMemoryWarning
from tile.autodiff.grad import Gradient, grad, gradient

__all__ = ["Gradient", "TileGradientMemoryWarning", "grad", "gradient"]
