"""The OpenCL backend: Stripe kernels -> OpenCL C (``backends.clike``) -> any OpenCL device."""

from backends.opencl.compiler import DeviceTypeError
from backends.opencl.device import OpenCLDevice, discover

__all__ = ["DeviceTypeError", "OpenCLDevice", "discover"]
