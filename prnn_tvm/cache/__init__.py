"""The on-disk cache of compiled layers: compile once, load in every later process.

``compile_cell`` (and ``compile_backward`` / ``compile_training`` on its layers) look a layer up
here before building it and store what they built: the layer's exported library
(:mod:`prnn_tvm.runtime.library`) and what the library does not carry (the CUDA source), in a
folder per key. A key holds everything that changes the generated code (:mod:`.key`): the
cell's math, shapes, dtype, target and GPU, the config asked for and the tuning records that
could choose one, the versions of TVM, tvm-ffi and prnn-tvm and a hash of the project's own
code generators, so a change to any of them is a miss, never a stale kernel.

- :mod:`.settings`: where the cache lives and how large it may grow (environment variables);
- :mod:`.store`: the folders on disk, safe under concurrent processes, evicted least recently used first;
- :mod:`.key`: what keys an entry;
- :mod:`.layers`: a compiled layer to an entry and back;
- :mod:`.nvcc`: nvcc's results by source, beside the layers;
- :mod:`.ptxas_table`: a table of known ptxas reports (``PRNN_TVM_PTXAS_TABLE``; the test suite's), read
  instead of running nvcc where only the report is wanted.

``settings`` and ``store`` import only the standard library (``prnn-tvm cache list`` needs no TVM).
"""
