"""Running compiled layers: binding arguments, launching, exporting and loading.

Nothing imported by ``base``, ``binding`` or ``loading`` needs the TVM compiler:
they work under TVM's runtime-only import (``TVM_USE_RUNTIME_LIB=1``)."""
