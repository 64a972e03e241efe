"""The CuPy backend (:mod:`mpqr.backends.cupy.backend`): cuBLAS, cuBLASLt, cuSOLVER and
mpqr's own CUDA kernels (``kernels/*.cu``, compiled through :mod:`mpqr.backends.cupy.modules`;
the list ``python -m mpqr warmup`` compiles ahead is ``data/cupy_kernels.json.gz``)."""
