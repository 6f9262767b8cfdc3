"""The persistent backward without its exchange of gate gradients, for timing only (``bench/backward_timeline.py
--no-copy``): what a backward step costs besides the copy, the step's measured floor.

:func:`without_copy` rewrites the generated CUDA of ``recurrent_backward_kernel`` so that its time loop neither
copies the published gate gradients into shared memory nor waits for them: the ``cp.async`` copies, their commits
and waits (``copy_stages``), or in clusters (``schedules/cluster_copy.py``) the bulk copies, their mbarrier waits
(the wait's result taken as "landed") and the re-arming of the mbarriers. The products then multiply whatever the
shared tile holds: the gradients are wrong. The grid barrier, the publish of the gate gradients, the products, the
partial sums and the block and warp barriers stay. A copy by plain loads (an odd number of gate gradients a batch
row) is refused.
"""

from __future__ import annotations

import re

from .backward_timeline import KERNEL

WARNING = "timing only, gradients wrong: the backward without its copy of the gate gradients (--no-copy)"
_LOOP = r"^  for \(int v = 0; v < seq_len; \+\+v\) \{\n"
_END = r"^  int barrier_error = "
# statements of the copy and its waits, deleted from the time loop
_DELETED = (
    r"^\s*prnn_cp_async<\d+>\(.*\);\n",
    r"^\s*prnn_cp_async_commit\(\);\n",
    r"^\s*prnn_cp_async_wait_(all|group<\d+>)\(\);\n",
    r"^\s*prnn_cluster_copy<\d+>\(.*\);\n",
    r"^\s*prnn_cluster_wait_warp\(.*\);\n",
    r"^\s*prnn_mbar_arm\(.*\);\n",
)
_WAIT = r"prnn_cluster_wait\(.*\);$"  # the block's wait in clusters: its result "landed", not aborted


def without_copy(source: str) -> str:
    """``source`` with the gate gradients' copy and its waits removed from ``recurrent_backward_kernel``'s time loop;
    a source without that kernel comes back unchanged. ValueError where the loop holds no such copy."""
    kernel = re.search(KERNEL, source, re.M)
    if kernel is None:
        return source
    loop = re.compile(_LOOP, re.M).search(source, kernel.end())
    end = re.compile(_END, re.M).search(source, loop.end()) if loop else None
    if end is None:
        raise ValueError("backward without copy: no time loop in the backward kernel's source (the generated code "
                         "changed: update prnn_tvm/bench/backward_no_copy.py)")
    body, removed = source[loop.end() : end.start()], 0
    for pattern in _DELETED:
        body, n = re.subn(pattern, "", body, flags=re.M)
        removed += n
    body, n = re.subn(_WAIT, "0;", body, flags=re.M)
    if not removed + n:
        raise ValueError("backward without copy: the backward copies its gate gradients by plain loads (an odd "
                         "number a batch row: no cp.async or cluster copy to remove); --no-copy takes a layer with "
                         "an even number of gate rows x hidden")
    return source[: loop.end()] + body + source[end.start() :]
