"""Checks of what the compiler emits, without a GPU: the emitted CUDA kernel run on the host (``emulator``) and
its shared-memory accesses bounded from its own TIR (``bounds``)."""
