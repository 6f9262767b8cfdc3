"""Host time of a ``prnn_tvm.torch`` LSTM called one timestep at a time (T=1, states in and out, no session), by
piece, against torch.nn's call of the same LSTM (cuDNN on the GPU): what issue 47's plain call costs the CPU.

    python bench/plain_call.py [--device cuda --layers 1 --hidden 640 --batch 8 --dtype float16]

Microseconds per call, the minimum over ``--rounds`` rounds of ``--calls`` calls issued back to back (the GPU
drained between rounds, so a figure is the host's work, not the GPU's, as long as the calls only enqueue):

- ``ours`` / ``torch.nn``: the whole call, ``module(x, (h, c))`` under ``torch.no_grad()``: from the third call on,
  the module's plan of it (``prnn_tvm.torch.repeat``): on the GPU one launch a layer (a wavefront stack: one in all),
  its input projected in the recurrent kernel, where the layer's config leaves room (``repeat.ONE_LAUNCH``);
- ``the one launch (x projected in it), bound``: that launch alone (the first layer's), with what it writes made by
  torch.empty each; ``the one launch, bound, into given tensors`` as the plan calls it, into the call's tensors (made
  once here: the launch alone, its outputs' allocation and views not counted);
- ``ours, two launches a layer``: the planned call with the projection a launch of its own (torch's GEMM) and the
  recurrent launch on its result: what ``ours`` was before; the rows after it measure this plan;
- ``ours, step latency``: the call and a wait for its results (the GPU's time included), as a decoder steps;
- ``ours, states passed back``: the call given the states the last call returned, as a decoder's loop passes them
  (``ours`` gives the same states every call): the plan takes each layer's rows of either from what it kept
  (:mod:`prnn_tvm.torch.state_rows`); ``..., rows taken each call``: the same with those rows forgotten before each
  call, so it takes them again (a torch view per layer and state), as every call did before they were kept;
- ``ours planned, launches memoized``: the planned call with each recurrent launch answered from a memo (the
  runtime's Launcher): the plan's checks, the projection, the states' views and stacks;
- ``ours, own path``: the call with plans off (every check and decision made again, as before plans);
- ``ours around its launches`` (own path): the call with each layer's run (projection and recurrent launch) answered
  from a memo: the module's own Python (checks, which layer, the launch's arguments, the final states stacked);
- ``ours, a layer's run``: one layer's projection and recurrent launch (``Dispatch._run``), and of it
  ``the recurrent launch`` (the runtime's Launcher: its arguments, outputs from torch's allocator, the launch);
- ``ours, states stacked after``: a stack's call as it was before its launch wrote the final states into the
  tensors the call returns (``torch.stack`` per state after the launch: a kernel each on the GPU; the CPU stacks
  either way, ``prnn_tvm.torch.dispatch.WRITTEN_IN_PLACE``);
- ``ours, kernels a no-op``: the call with every launch's kernel replaced by TVM's ``testing.nop`` (its arguments
  converted all the same): the host's whole work, and on the CPU the figure to compare (there a kernel's run is its
  arithmetic, not a launch); ``own path, kernels a no-op`` the same with plans off, ``ours, states passed back,
  kernels a no-op`` with the states passed back (and ``passed back, rows taken, ...`` its rows taken each call);
  ``projection answered, kernels a no-op``: the same with each layer's projection made once, the CPU's figure of
  the GPU's host work (whose launch projects its input in the kernel) with ``--in-place``.

Issue 47's levers, each a row of its own (the planned call is ``ours``):

- ``ours, projection answered``: the planned call with each layer's projection answered from a memo (its ``xp`` made
  once): the bound of a call whose layers are one launch each (the input projected inside the recurrent kernel, as a
  session's kernel does), what that lever can win;
- ``plan, launches unbound``: the plan's launches through the Launcher's whole call (every argument placed each call)
  instead of its bound launch (``Launcher.bound``: weights, params, lengths placed once);
- ``the recurrent launch, bound`` / ``, kernel a no-op``: one bound launch (what it writes made by torch.empty
  each), and the same with TVM's ``testing.nop`` for its kernel (the difference: the launch itself, driver and TVM's
  CUDA module); ``recurrent launch, no-op, into given tensors``: the no-op's, into tensors made once, as the plan
  passes them (the arguments' passing alone);
- the projection at T=1 alone (``projection: ...``): as planned (``b_ih`` folded into the recurrent bias: the GEMM
  alone), with ``b_ih`` (float32: ``addmm``; half: the GEMM into float32 then ``add_``), and the other ways to make a
  half layer's float32 ``xp`` (the input widened, then a float32 GEMM on a float32 copy of ``W_ih``; for reference, the
  half GEMM into half);
- ``torch.empty on the device``, ``a view``: what each output and each state's view costs the call; ``outputs: ...``
  the output and the final states (an LSTM's) as a tensor each, or as views of one allocation; ``outputs and launch
  rows, as planned``: those views and the (B, H) rows of the final states the launch writes, as the plan makes them
  (``repeat.Written``: one allocation, split once, unbound once), and ``..., an unbind a state`` as it made them
  before (an unbind of each state's (layers, B, H)).

``--clock thread`` counts the process's CPU time instead of the wall clock (a machine shared with other work);
``--in-place`` (the CPU) has the launches write the final states into the tensors the call returns, as on the GPU,
so the CPU's ``kernels a no-op`` rows run the GPU's Python.
"""

import argparse
import time

import torch
import tvm_ffi

import prnn_tvm.torch as pt
from prnn_tvm.runtime.launcher import Bound
from prnn_tvm.torch import dispatch, repeat
from prnn_tvm.torch.arguments import aligned_state
from prnn_tvm.torch.projection import project, projector, rounds

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--layers", type=int, default=1)
parser.add_argument("--hidden", type=int, default=640)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
parser.add_argument("--calls", type=int, default=200)
parser.add_argument("--rounds", type=int, default=40)
parser.add_argument("--clock", default="wall", choices=["wall", "thread"])
parser.add_argument("--in-place", action="store_true", help="on the CPU: final states written as on the GPU")
args = parser.parse_args()
if args.in_place:  # the CPU build's plan as the GPU's: the launch writes the final states into the returned tensors
    dispatch.WRITTEN_IN_PLACE = (*dispatch.WRITTEN_IN_PLACE, "cpu")
clock = time.perf_counter if args.clock == "wall" else time.thread_time
cuda = args.device == "cuda"
drain = torch.cuda.synchronize if cuda else (lambda: None)
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
if not cuda:
    torch.set_num_threads(1)


def us(call) -> float:
    """Microseconds per call: the minimum over rounds of back-to-back calls, the GPU drained between rounds."""
    for _ in range(20):
        call()
    drain()
    found = []
    for _ in range(args.rounds):
        start = clock()
        for _ in range(args.calls):
            call()
        found.append((clock() - start) / args.calls * 1e6)
        drain()
    return min(found)


dtype = getattr(torch, args.dtype)
L, H, B = args.layers, args.hidden, args.batch
reference = torch.nn.LSTM(H, H, L).to(args.device, dtype).eval()
ours = pt.from_torch(reference).eval()
x = torch.randn(1, B, H, device=args.device, dtype=dtype)
state = tuple(torch.zeros(L, B, H, device=args.device, dtype=dtype) for _ in range(2))


class Rows(dict):
    """The figures by row, each printed as it is measured (a run cut short keeps what it printed)."""

    def __setitem__(self, name: str, value: float) -> None:
        super().__setitem__(name, value)
        print(f"  {name:44s} {value:8.1f}", flush=True)


where = torch.cuda.get_device_name() if cuda else "CPU"
print(f"LSTM {L}x{H} B={B} {args.dtype}, T=1, on {where}, us per call ({args.clock} clock):", flush=True)
rows = Rows()
carried = [state]  # a decoder's states: each call given those the last returned


def passed_back():
    carried[0] = ours(x, carried[0])[1]


def written_into(plan) -> list | None:
    """What the plan's first launch writes into, made once, as the plan's call passes them (the output and the final
    states' rows, views of one allocation; a layer-by-layer plan's first layer's output, where it is not the call's,
    made by the launch), or None where the plan's launches make what they write (torch.empty for each)."""
    if plan.whole is None:
        return None
    output, _, made = plan.whole(x)
    return [output, *made] if plan.stack else [output if L == 1 else None, *made[: len(ours._states)]]


def forgotten(call):  # the call with its plan's kept state rows forgotten first: taken again, as before they were kept
    (plan,) = [p for p in ours._plans.values() if type(p) is repeat.Plan]

    def again():
        plan.rows.given = plan.rows.returned = None
        call()

    return again


with torch.no_grad():
    want, got = reference(x, state)[0], ours(x, state)[0]  # compiled here, and checked
    assert (want.float() - got.float()).abs().max() < 1e-2, "our call differs from torch.nn's"
    rows["torch.nn"] = us(lambda: reference(x, state))
    rows["ours"] = us(lambda: ours(x, state))
    rows["ours, step latency"] = us(lambda: (ours(x, state), drain()))
    rows["ours, states passed back"] = us(passed_back)
    rows["ours, state rows taken each call"] = us(forgotten(lambda: ours(x, state)))
    rows["ours, passed back, rows taken each call"] = us(forgotten(passed_back))
    (plan,) = [p for p in ours._plans.values() if type(p) is repeat.Plan]
    stream = torch.cuda.current_stream().cuda_stream if cuda else 0
    if plan.steps[0].project is aligned_state:  # one launch a layer (repeat.ONE_LAUNCH): the first one alone
        states = [t[layer] for layer in range(L if plan.stack else 1) for t in state]
        rows["the one launch (x projected in it), bound"] = us(lambda: plan.steps[0].launch([x, *states], stream))
        into = written_into(plan)
        rows["the one launch, bound, into given tensors"] = us(lambda: plan.steps[0].launch([x, *states], stream, into))
    # the rows below: the plan with each layer's projection a launch of its own (torch's GEMM)
    repeat.ONE_LAUNCH = False
    ours._plans.clear()
    ours(x, state), ours(x, state)  # seen, then planned again
    rows["ours, two launches a layer"] = us(lambda: ours(x, state))
    launched, launch = {}, Bound.__call__

    def answered(self, varying, stream=0, into=None):  # the launch's first outputs, or the caller's arrays
        if id(self) not in launched:
            launched[id(self)] = launch(self, varying, stream)
        return [mine if mine is not None else made for mine, made in zip(into or [None] * 99, launched[id(self)])]

    Bound.__call__ = answered
    rows["ours planned, launches memoized"] = us(lambda: ours(x, state))
    Bound.__call__ = launch
    (plan,) = [p for p in ours._plans.values() if type(p) is repeat.Plan]
    bound, projections = [step.launch for step in plan.steps], [step.project for step in plan.steps]

    def unbound(step):  # the Launcher's whole call with the plan's arguments, as the plan made it before Bound
        b, order = step.launch, step.launch.launcher.slots.data
        data, at = [dict(b.fixed).get(i) for i in order], [order.index(i) for i in b.varying]

        def call(varying, stream=0, into=None):
            given = data.copy()
            for i, value in zip(at, varying):
                given[i] = value
            return b.launcher(given, stream, None, into)

        return call

    made = [step.project(x) for step in plan.steps]  # every layer's input is (1, B, H) here: each xp, made once
    plan.steps[:] = [step._replace(project=lambda _x, xp=xp: xp) for step, xp in zip(plan.steps, made)]
    rows["ours, projection answered"] = us(lambda: ours(x, state))
    plan.steps[:] = [step._replace(project=project) for step, project in zip(plan.steps, projections)]
    plan.steps[:] = [step._replace(launch=unbound(step)) for step in plan.steps]
    rows["plan, launches unbound"] = us(lambda: ours(x, state))
    plan.steps[:] = [step._replace(launch=b) for step, b in zip(plan.steps, bound)]
    xp = plan.steps[0].project(x)
    states = [t[layer] for layer in range(L if plan.stack else 1) for t in state]  # the first launch's
    rows["the recurrent launch, bound"] = us(lambda: bound[0]([xp, *states], stream))
    real_kernel, bound[0].launcher.function = bound[0].launcher.function, tvm_ffi.get_global_func("testing.nop")
    rows["the recurrent launch, bound, kernel a no-op"] = us(lambda: bound[0]([xp, *states], stream))
    into = written_into(plan)
    rows["recurrent launch, no-op, into given tensors"] = us(lambda: bound[0]([xp, *states], stream, into))
    bound[0].launcher.function = real_kernel
    W, b = ours.weight_ih_l0.detach(), ours.bias_ih_l0.detach()
    rows["projection: as planned"] = us(lambda: plan.steps[0].project(x))
    rows["projection: with b_ih"] = us(lambda: projector(W, b)(x))
    if dtype != torch.float32:
        wide, narrow, rows2d = W.float().t(), W.t(), x.view(B, -1)
        rows["projection: widened x, float32 GEMM"] = us(lambda: torch.mm(rows2d.float(), wide))
        rows["projection: half GEMM into half"] = us(lambda: torch.mm(rows2d, narrow))
    on, sizes = torch.device(args.device), [1, L, L]  # the output at T=1, then each state's (L, B, H)
    rows["torch.empty on the device"] = us(lambda: torch.empty(B, H, device=on, dtype=dtype))
    rows["a view"] = us(lambda: state[0][0])
    rows["outputs: an allocation each"] = us(lambda: [torch.empty(n, B, H, device=on, dtype=dtype) for n in sizes])
    rows["outputs: one allocation, split"] = us(
        lambda: torch.empty(2 * L + 1, B, H, device=on, dtype=dtype).split_with_sizes(sizes)
    )
    if plan.whole is not None:  # what the plan's call makes for its launches to write (repeat.Written)
        rows["outputs and launch rows, as planned"] = us(lambda: plan.whole(x))

        def per_state():  # as the plan made them before repeat.Written: an unbind per state
            output, *wholes = torch.empty(2 * L + 1, B, H, device=on, dtype=dtype).split_with_sizes(sizes)
            return output, wholes, dispatch.final_slots(wholes, L)[1]

        rows["outputs and launch rows, an unbind a state"] = us(per_state)
    planned_key, repeat.call_key = repeat.call_key, lambda *_: None  # plans off: the module's own path
    rows["ours, own path"] = us(lambda: ours(x, state))
    runs, memo, real = [], {}, ours._run

    def remembered(layer, arguments, grad=False, into=None):  # into: where the launch writes, as the call asks
        runs.append((layer, arguments))
        if id(layer) not in memo:
            memo[id(layer)] = real(layer, arguments, grad)
        out, ends = memo[id(layer)]
        return out, ends if into is None else [mine if mine is not None else end for mine, end in zip(into[1:], ends)]

    ours._run = remembered
    rows["ours around its launches"] = us(lambda: ours(x, state))
    ours._run = real
    layer, arguments = runs[0]
    rows["ours, a layer's run"] = us(lambda: real(layer, arguments))
    if ours._launchers:  # none on the CPU in an older checkout
        launcher = next(iter(ours._launchers.values()))
        data = [project(*arguments[:3], biased_weight=ours._biased_weight, rounded=rounds(layer)), *arguments[3:]]
        rows["of it, the recurrent launch"] = us(lambda: launcher(data, stream))
    if L > 1:
        ours._whole_finals = lambda *_: None  # the module's method shadowed: every state stacked after the launch
        rows["ours, states stacked after"] = us(lambda: ours(x, state))
        del ours._whole_finals
    functions = {key: launcher.function for key, launcher in ours._launchers.items()}
    for launcher in ours._launchers.values():
        launcher.function = tvm_ffi.get_global_func("testing.nop")
    rows["own path, kernels a no-op"] = us(lambda: ours(x, state))
    repeat.call_key = planned_key
    rows["ours, kernels a no-op"] = us(lambda: ours(x, state))
    rows["ours, states passed back, kernels a no-op"] = us(passed_back)
    rows["passed back, rows taken, kernels a no-op"] = us(forgotten(passed_back))
    (plan,) = [p for p in ours._plans.values() if type(p) is repeat.Plan]
    made = [step.project(x) for step in plan.steps]  # each xp made once, as for 'ours, projection answered'
    plan.steps[:] = [step._replace(project=lambda _x, xp=xp: xp) for step, xp in zip(plan.steps, made)]
    rows["projection answered, kernels a no-op"] = us(lambda: ours(x, state))
    for key, launcher in ours._launchers.items():
        launcher.function = functions[key]
