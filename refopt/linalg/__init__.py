"""Dense linear-algebra maps used by the matrix rules: the matrix sign / polar factor ``msign`` (CPU, or
numba-CUDA kernels with ``backend='cuda'``: :mod:`refopt.fast.msign_cuda`, imported only then)."""
from refopt.linalg._msign import (NS_PRESETS, POLAR_EXPRESS_RAW, msign, ns_band, ns_coefficients,
                                  ns_scalar_map)

__all__ = ["msign", "ns_coefficients", "ns_scalar_map", "ns_band", "NS_PRESETS", "POLAR_EXPRESS_RAW"]
