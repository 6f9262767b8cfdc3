"""The recurrent launch of a layer split over GPUs (:class:`~prnn_tvm.runtime.split.SplitLayer`) called again and
again with the caller's arrays: what ``prnn_tvm.torch``'s modules with ``devices=[...]`` run.

:meth:`SplitLayer.bind_each <prnn_tvm.runtime.split.SplitLayer.bind_each>` binds a call by name and allocates its
outputs as TVM tensors, whose memory TVM takes with ``cudaMalloc`` and gives back with ``cudaFree`` (which waits for
the whole GPU: a call whose outputs die waits for every GPU it ran on). A :class:`SplitLauncher` is one
:class:`~prnn_tvm.runtime.launcher.Launcher` per GPU: the positions worked out once, what a launch writes made by
the caller's array library (torch's caching allocator), each GPU's workspace and barrier state kept per stream, every
GPU's launch issued before any is waited for, and nothing waiting for any GPU. Imports only TVM's runtime and NumPy.
"""

from __future__ import annotations

import contextlib

import tvm_ffi

from ..errors import BarrierTimeout, InputError
from . import peers
from .launcher import Arrays, Launcher


class SplitLauncher:
    """The recurrent launch of ``layer`` (a :class:`~prnn_tvm.runtime.split.SplitLayer`) on every GPU, with buffers
    from ``arrays`` (one :class:`~prnn_tvm.runtime.launcher.Arrays` per GPU, in the layer's device order).

    A call passes each GPU's data arguments by name (:attr:`names`: ``xp`` its own columns of the input projection,
    as :meth:`~prnn_tvm.runtime.split.SplitLayer.own_columns` makes them, then the weights, params, initial states
    and lengths, each on that GPU, 64-byte aligned and compact: unchecked) and the raw handle of the stream to run
    on for each GPU. It raises an earlier call's barrier timeout first (every GPU's), makes every GPU's workspace
    for its stream before any launch names its peers' (:meth:`~prnn_tvm.runtime.split.DevicePart.scalars`),
    launches every GPU's kernel, then orders every stream's next work after every GPU's launch
    (:class:`~prnn_tvm.runtime.peers.StreamJoin`), and returns each GPU's ``[out, *finals]`` (it wrote its own
    units of each). Nothing waits for a GPU."""

    @peers.keeps_current_device
    def __init__(self, layer, arrays: list[Arrays]):
        if len(arrays) != len(layer.parts):
            raise InputError(f"{len(arrays)} array libraries given for a layer split over {len(layer.parts)} GPUs")
        layer._enable_peers()
        self.layer = layer
        self.launchers = [Launcher(part, "recurrent", a, part.device) for part, a in zip(layer.parts, arrays)]
        launch = layer.signature.launch("recurrent")
        self.names = [a.name for a in launch.args if a.role.data]

    def __call__(self, per_gpu: list[dict], streams: list[int]) -> list[list]:
        layer, launchers = self.layer, self.launchers
        T = int(per_gpu[0]["xp"].shape[0])
        if T > launchers[0].max_steps:
            raise InputError(f"a sequence of {T} steps runs in chunks on one GPU, which a split layer does not do "
                             "yet: call it on shorter pieces, passing each piece's final states on")
        layer.check(wait=False)  # an earlier call's timeout (every GPU's), before this one starts
        outputs = []
        with contextlib.ExitStack() as scope:
            scope.enter_context(peers.current_device_kept())
            for part, stream in zip(layer.parts, streams):  # each GPU's stream TVM's, so that peers name its state
                if tvm_ffi.get_raw_stream(part.device) != stream:
                    scope.enter_context(tvm_ffi.use_raw_stream(part.device, stream))
            for part, launcher, stream in zip(layer.parts, launchers, streams):
                part.launch_state(stream, launcher.arrays.zeros)  # every workspace before any launch names it
            try:
                for launcher, named, stream in zip(launchers, per_gpu, streams):
                    outputs.append(launcher([named[n] for n in self.names], stream))
            except Exception:
                # the GPUs launched before this one wait for it until they time out: let them, and start clean
                with contextlib.suppress(BarrierTimeout):
                    layer.check()
                raise
            layer.join.join(streams)  # the next launch anywhere after all of these
        for part in layer.parts:
            part.launched = True
        return outputs
