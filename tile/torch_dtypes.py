"""The dtypes ``tile.torch`` maps between torch and numpy (Tile's dtypes are numpy's, with
ml_dtypes' bfloat16)."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["IN_PLACE", "TO_NUMPY", "TO_TORCH"]

TO_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(np.bool_),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
}
try:
    import ml_dtypes

    TO_NUMPY[torch.bfloat16] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency of Tile's dtypes
    pass
TO_TORCH = {v: k for k, v in TO_NUMPY.items()}
IN_PLACE = frozenset(TO_NUMPY) - {torch.bfloat16}  # what Tensor.numpy() views as it is
