"""Built-in cells, one file each, written only with the public cell API (``prnn_tvm.frontend.cell``).

A module here that defines ``CELL = Cell(...)`` is a built-in cell; the registry
(``prnn_tvm.frontend.registry``) finds it by its name. Adding a file is all it takes.
"""
