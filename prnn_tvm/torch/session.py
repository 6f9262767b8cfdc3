"""``module.session(batch)``: a resident session of a module (``prnn_tvm.runtime.session``), with torch.nn's
layout: a step takes ``x`` (batch, input) and returns ``(y, states)``, ``y`` (batch, hidden) the last layer's output
and ``states`` as the module returns its final states (``(h_n, c_n)`` of an LSTM, each (layers, batch, hidden)).
Where ``x`` is decides the transport:

- a GPU tensor: the device transport, on torch's current stream, without waiting for the GPU; the results are GPU
  tensors;
- a CPU tensor (pinned or not) or a NumPy array: the host transport (no CUDA call: the step's input goes through
  page-locked memory the resident kernel polls), waiting for the step; the results are CPU tensors of their own.
  Where the session's host step is native (``session.session.native``), a tensor's memory is read and the new states
  written through ``data_ptr()``: no copy, no NumPy.

Mixing them in one session costs a relaunch of the resident kernel at each switch. A module of several layers
serves a step per call as the deep stack of its cell (``<cell>_d<layers>``). The parameters are read where they
are (no copy) when the resident kernel starts: a session opened before an in-place update keeps the old weights
until it is released (``session.release()``, or ``release_after`` seconds without a step).
"""

from __future__ import annotations

import numpy as np
import torch  # PyTorch itself: absolute import
import tvm_ffi

from prnn_tvm.deferred import compile_cell, resolve, stacked
from prnn_tvm.errors import ConfigError, InputError
from prnn_tvm.runtime.limits import ALIGNMENT

from .arguments import parameter_suffix
from .dispatch import DTYPES


class ModuleSession:
    """A module's resident session (see the module's doc). Make one with ``module.session(batch)``; a context
    manager. ``options`` pass to :class:`prnn_tvm.runtime.session.Session` (``release_after``, ``free_sms``,
    timeouts)."""

    def __init__(self, module, batch: int, **options):
        kind = type(module).__name__
        if module.bidirectional:
            raise ConfigError(
                f"{kind}: a session serves one step at a time in order, so a bidirectional module cannot have one"
            )
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise InputError(f"{kind}.session: batch must be a positive integer, got {batch!r}")
        parameter = next(module.parameters())
        if parameter.device.type != "cuda":
            raise InputError(f"{kind}.session: a session runs on the GPU; move the module there (.cuda()) first")
        self.module, self.batch, self.layers = module, batch, module.num_layers
        cell = stacked(resolve(module.cell), self.layers, wavefront=False)
        self.layer = compile_cell(
            cell,
            module.hidden_size,
            batch,
            input_size=module.input_size,
            dtype=DTYPES[parameter.dtype],
            arch=module.arch,
        )
        suffix = None if self.layers > 1 else parameter_suffix(0, 0)
        weights = {}
        for arg, name, shape in module._parameter_arguments(self.layer, suffix):
            weights[arg] = (
                getattr(module, name).detach()
                if name is not None
                else torch.zeros(*shape, device=parameter.device, dtype=parameter.dtype)
            )
        self._keep = weights  # the session reads them in place
        self.session = self.layer.session(**weights, **options)
        self._x = torch.empty(batch, module.input_size, device=parameter.device, dtype=parameter.dtype)
        # the torch kernels a step launches, once before the resident kernel starts: under CUDA's lazy loading a
        # kernel's first launch waits for every running kernel (the resident one would leave, idle, to let it)
        states = torch.zeros(
            len(self.session.state_names), batch, module.hidden_size, device=parameter.device, dtype=parameter.dtype
        )
        self._torch_states(dict(zip(self.session.state_names, states)))
        self._x.copy_(states[0, :, :1].expand(batch, module.input_size))

    def step(self, x) -> tuple:
        """One step: ``x`` (batch, input) in the module's dtype, a GPU tensor (results on the GPU, without waiting),
        or a CPU tensor or NumPy array (results on the CPU, waiting for the step). Returns ``(y, states)`` (see the
        module's doc), fresh tensors."""
        if isinstance(x, np.ndarray) or (isinstance(x, torch.Tensor) and x.device.type == "cpu"):
            return self._host_step(x)
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != (self.batch, self.module.input_size):
            raise InputError(
                f"step takes a tensor of shape ({self.batch}, {self.module.input_size}), got "
                f"{getattr(x, 'shape', type(x).__name__)}"
            )
        if not x.is_contiguous() or x.data_ptr() % ALIGNMENT:  # the publish reads it in place: a copy of ours
            self._x.copy_(x)
            x = self._x
        s = self.session
        out = torch.empty(len(s.state_names), self.batch, self.module.hidden_size, device=x.device, dtype=x.dtype)
        with tvm_ffi.use_raw_stream(s.device, torch.cuda.current_stream(x.device).cuda_stream):
            s.post(x, out)
        return out[s.output_index], self._torch_states(dict(zip(s.state_names, out)))

    def _host_step(self, x) -> tuple:
        """A step through the host transport: ``x`` a CPU tensor or a NumPy array; CPU tensors back."""
        s = self.session
        if isinstance(x, torch.Tensor) and s.native:  # the tensors' memory through their addresses
            dtype = next(self.module.parameters()).dtype
            if tuple(x.shape) != (self.batch, self.module.input_size) or x.dtype != dtype:
                raise InputError(
                    f"step takes a tensor of shape ({self.batch}, {self.module.input_size}) and dtype {dtype}, got "
                    f"{tuple(x.shape)} {x.dtype}"
                )
            x = x.detach().contiguous()
            states = torch.empty(len(s.state_names), self.batch, self.module.hidden_size, dtype=dtype)
            s.step_into(x.data_ptr(), states.data_ptr())
            return states[s.output_index], self._torch_states(dict(zip(s.state_names, states)))
        if isinstance(x, torch.Tensor):
            x = _numpy(x.detach())
        y, states = s.step(x)
        return _tensor(y), self._torch_states({name: _tensor(value) for name, value in states.items()})

    @property
    def state(self) -> tuple:
        """The states after the last step, as the module returns final states (the resident kernel is released to
        read them; the next step relaunches it)."""
        device = next(self.module.parameters()).device
        return self._torch_states({n: torch.from_numpy(v).to(device) for n, v in self.session.state.items()})

    def set_state(self, states) -> None:
        """The states the next step starts from, as the module takes initial states (``(h0, c0)`` of an LSTM)."""
        states = (states,) if isinstance(states, torch.Tensor) else tuple(states)
        names = self.module._states
        if len(states) != len(names):
            raise InputError(f"set_state takes {len(names)} state tensor(s) ({', '.join(names)}), got {len(states)}")
        given = {}
        for name, value in zip(names, states):
            if tuple(value.shape) != (self.layers, self.batch, self.module.hidden_size):
                raise InputError(
                    f"{name}: shape {tuple(value.shape)}, expected "
                    f"({self.layers}, {self.batch}, {self.module.hidden_size})"
                )
            for layer in range(self.layers):
                given[self._state_name(layer, name)] = value[layer].detach().cpu().numpy()
        self.session.set_state(given)

    def reset(self, rows=None) -> None:
        """Zero the states of batch rows ``rows`` (all when None)."""
        self.session.reset(None if rows is None else torch.as_tensor(rows).cpu().numpy())

    def reorder(self, index) -> None:
        """Row ``b`` of every state becomes row ``index[b]``'s (beam search)."""
        self.session.reorder(torch.as_tensor(index).cpu().numpy())

    def release(self) -> None:
        self.session.release()

    def close(self) -> None:
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _state_name(self, layer: int, name: str) -> str:
        return f"l{layer}_{name}" if self.layers > 1 else name

    def _torch_states(self, by_name: dict) -> tuple:
        """Each of the module's states stacked over its layers, (layers, batch, hidden); one tensor for a one-state
        cell, as torch.nn's GRU and RNN return it."""
        found = []
        for name in self.module._states:
            found.append(torch.stack([by_name[self._state_name(layer, name)] for layer in range(self.layers)]))
        return found[0] if len(found) == 1 else tuple(found)


def _numpy(x: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values as NumPy, in place where NumPy has the dtype (bfloat16: through its bits)."""
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().view("bfloat16")
    return x.numpy()


def _tensor(x: np.ndarray) -> torch.Tensor:
    """A NumPy array as a CPU tensor sharing its memory (bfloat16: through its bits)."""
    if x.dtype == np.dtype("bfloat16"):
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x)
