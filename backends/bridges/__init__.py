"""PyTorch tensors and JAX arrays on mpqr's own backends, through DLPack.

:mod:`mpqr.backends.bridges.dispatch` tells a foreign array and hands the call to the
framework's side (:mod:`mpqr.backends.bridges.torch`, :mod:`mpqr.backends.bridges.jax`);
:mod:`mpqr.backends.bridges._common` holds what both sides share.
"""
