"""The NumPy backend: the CPU reference, every engine emulated with the GPU's roundings
(:mod:`mpqr.backends.numpy.backend`), and NumPy's types where the core meets them
(:mod:`mpqr.backends.numpy.types`)."""
