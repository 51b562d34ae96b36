"""NVIDIA's code in one place: the tensor-core GEMM kernels (``mma``, ``wgmma``, ``tma`` with
``tile_store`` and ``mma_skips``), the PTX rebuild for ``sm_90a`` (``ptx``), the K-major pass
(``kmajor``), and CUDA memory and launches shared with OpenCL (``share``, ``launch``).

Importing the package loads none of them: OpenCL's NVIDIA path imports the module it needs."""
