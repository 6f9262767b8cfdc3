"""Packed tagged words: the ``tags`` exchange of a split layer with three 16-bit values a word (device code:
``packed.cuh``; the split's knob ``words="packed"``, ``schedules/split.py``).

A word is 8 bytes as :class:`~.peers.PeerTags`' are, one 64-bit store and one 64-bit load (single-copy atomic), but
holds three float16/bfloat16 values of consecutive units of a batch row and the low 16 bits of their step's tag: a
CTA's ``U`` units of a row take ``W = ceil(U / 3)`` words (the last partly empty where ``U`` is not a multiple of
3), and a row of the workspace ``ctas * W`` words instead of ``hidden``: LSTM fp16 H=2048 B=8 over two GPUs polls
6.3 MB a GPU a step instead of 16.8, and a row of 768 words instead of 2048.

A value is one thread's (its pointwise item's), a word three threads': each item writes its new states into a small
shared staging tile (``(operands, batch, U)`` values of the storage type), and after a block barrier the CTA's
threads pack and store its ``B x W`` words of each operand (:meth:`PackedTags.flush`), into this GPU's copy and each
peer's. The staging tile also gives a thread its own previous state (:meth:`PackedTags.previous`).

Why 16 bits of tag cannot alias. A reader at step ``s`` waits for the words tagged ``base + s`` (written at step
``s - 1``). Each value goes to the slot of its tag's parity (``(base + s) & 1``, not ``s & 1``): the tags written
over a layer's launches are consecutive (every launch starts at the base the last one ended at), so a slot's words
are rewritten every other tag, launch after launch, whatever the launches' lengths. Within a launch no writer is more
than one step ahead of a reader of its words: to write step ``s + 1`` it must have polled every block's step ``s``
(every block's step-``s`` words: the product reads the whole state, own GPU's included), which the reader publishes
only after it polled step ``s - 1``. So while a reader polls, a slot holds the words tagged ``base + s - 2`` or
``base + s``, and 2 is not 0 modulo 65536. Between launches the runtime joins the GPUs' streams (a launch starts after
every GPU's last one ended). A bounded wait that times out leaves the launch (every block stops publishing, so no
writer gets further ahead), and the host then zeroes the barrier state (base 0) with the workspace (tags 0), whose
first waits are for tags 1 and 2. The 32-bit tags of ``Tags`` keep the step's parity for the slot: a session of
one-step launches leaves the other slot unwritten, and a stale word there would look fresh after 2^32 of them (after
65536 with 16 bits, which is why the slot follows the tag here).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from ...dtypes import itemsize
from ...signature import PEER_WORKSPACE
from ..pointwise import bind_value
from .base import ExchangeSite, abort_on, payload_type, sync_threads
from .peers import PeerTags
from .source import cuda_source

LANES = 3  # 16-bit values a word, beside its 16-bit tag
STAGING_BYTES = 768  # at most, of the static shared staging tile (target.STATIC_SMEM_RESERVE leaves 1024)


def words_of(units: int, units_per_cta: int) -> int:
    """Packed words holding ``units`` consecutive units from a CTA's first (whole CTAs of ``units_per_cta``, then the
    words of the rest)."""
    per_cta = -(-units_per_cta // LANES)
    return units // units_per_cta * per_cta + -(-(units % units_per_cta) // LANES)


def slot_of(base, tag_step):
    """The workspace parity the words tagged ``base + tag_step`` go to: the tag's own (module doc). ``base`` and
    ``tag_step`` are ints or int32 expressions."""
    return (base + tag_step) & 1


def packed_problem(plan, units_per_cta: int, headed: bool) -> str | None:
    """Why ``plan`` cannot exchange packed words with ``units_per_cta`` units a CTA, or None."""
    fix = "run it with words='single' (one value a word)"
    if itemsize(plan.dtype) != 2:
        return f"words='packed' holds three 16-bit values a word: a float16 or bfloat16 layer, not {plan.dtype}; {fix}"
    if plan.phases > 1:
        return f"words='packed' publishes the states once a step; cell '{plan.cell.name}' exchanges stages: {fix}"
    if headed:
        return f"words='packed' packs a CTA's units of each dense product's whole state, not head-wise spans: {fix}"
    per_unit = max(1, len(plan.operands)) * itemsize(plan.dtype)  # a state's bytes of each exchanged operand
    staged = plan.batch * units_per_cta * per_unit
    if staged > STAGING_BYTES:
        return (f"words='packed' stages a CTA's new states in {staged} bytes of static shared memory, more than "
                f"{STAGING_BYTES}: take fewer units_per_cta (batch x units_per_cta at most "
                f"{STAGING_BYTES // per_unit}) or {fix}")
    return None


class PackedTags(PeerTags):
    """``PeerTags`` with packed words (see the module's doc): ``units_per_cta`` units a CTA, ``ctas`` CTAs in the
    whole grid (a row of the workspace: ``ctas * W`` words)."""

    def __init__(self, gpus: int, chunk_rows: int, units_per_cta: int, ctas: int, floor_parts: int | None = None):
        super().__init__(gpus, chunk_rows, floor_parts)
        self.units, self.per_cta = units_per_cta, -(-units_per_cta // LANES)
        self.row_words = ctas * self.per_cta

    def polled_loads(self, values: int, threads: int, hidden: int, itemsize: int, operands: int = 1) -> tuple:
        """A load holds two packed words where a row's are even (one otherwise); ``values`` are rows of ``hidden``."""
        words = -(-values // hidden) * words_of(hidden, self.units)
        vec = 2 if words_of(hidden, self.units) % 2 == 0 and self.row_words % 2 == 0 else 1
        return -(-words // (threads * vec)), 2 * vec + 2

    # ------------------------------------------------------------------ reading
    def load_operands(self, site: ExchangeSite, names: list, t, b0, phase: int) -> None:
        """Step 0 reads the initial states (plain loads); a later step polls the words tagged ``base + t``."""
        with T.If(t == 0):
            with T.Then():
                for name in names:
                    site.copy_tile(name, t, b0, phase, initial=True)
                sync_threads()
            with T.Else():
                self.poll_tiles(site, names, t, b0, parity=slot_of(site.barrier_base, t), step=t)

    def _poll_columns(self, site: ExchangeSite, name: str, b0, parity, step, first, width, source=None) -> None:
        """Operand ``name``'s rows b0.. from unit ``first`` (a CTA's first): ``width`` units of each row (None: the
        whole row), read from the words of unit ``source`` on (None: ``first``)."""
        _dst, _n, _most, sleep_ns, row = site.polled_tile(name, b0)
        width = width or row
        BT, B, U = site.c.batch_tile, site.B, self.units
        rows = min(self.chunk_rows * (row // width), BT)
        column = 0 if width == row else first  # of the operand tile
        cols = min(width, site.H)  # units of the part that exist (the last CTA's may run past hidden)
        wrow = words_of(cols, U)
        part = 0 if width == row else words_of(width, U)  # words between the parts a floor polls
        vec = 2 if wrow % 2 == 0 and self.row_words % 2 == 0 and part % 2 == 0 else 1
        at = first if source is None else source
        word = 0 if isinstance(at, int) and at == 0 else at // U * self.per_cta
        here = T.min(BT, B - b0)
        for r0 in range(0, min(BT, B), rows):
            count = tirx.max(T.min(here - r0, rows), 0) * wrow
            most = min(rows, B - r0) * wrow
            per = -(-most // (site.g.threads * vec))
            src = T.address_of(site.a.ws[site.ws_at(name, parity, T.min(b0 + r0, B - 1), word)])
            dst = T.address_of(site.smem[(site.slot[name] * site.tile_rows + r0) * site.stride + column])
            call = T.cuda.func_call(
                f"prnn_packed_copy<{payload_type(site.dt, self.name)}, {per}, {vec}, {wrow}, {self.per_cta}, {U}, "
                f"{cols}, {site.stride}, {sleep_ns}, {self.row_words}>",
                src, dst, count, site.barrier_base, step, site.sync.sync.data, site.sync.timeout_us,
                source_code=cuda_source("packed.cuh"), return_type="int32")
            abort_on(site, T.bind(call, var=tirx.Var("exchange_abort", "int32")))

    # ------------------------------------------------------------------ writing
    def start(self, site: ExchangeSite) -> None:
        """Before the time loop: the staging tile of the CTA's new states."""
        super().start(site)
        shape = (max(1, len(site.ops)) * site.B * self.units,)
        site.staging = T.alloc_buffer(shape, site.dt, scope="shared")

    def staged(self, site: ExchangeSite, name: str, b, ul):
        """Index into the staging tile of operand ``name``'s value of row ``b``, unit ``ul`` of the CTA."""
        return (site.ops[name] * site.B + b) * self.units + ul

    def publish(self, site: ExchangeSite, name: str, t, b, unit, value) -> None:
        """Into the staging tile; :meth:`flush` packs and stores the CTA's words once every item wrote."""
        ul = unit - site.cta * self.units
        T.buffer_store(site.staging, value, [self.staged(site, name, b, ul)])

    def previous(self, site: ExchangeSite, name: str, t, b, unit):
        """The thread's own value of the step before, as it staged it (only its own item writes that place)."""
        return site.staging[self.staged(site, name, b, unit - site.cta * self.units)]

    def flush(self, site: ExchangeSite, t) -> None:
        """After step ``t``'s items staged their states: a block barrier, then the CTA's ``B x W`` words of each
        operand packed (zeros past the CTA's units and past hidden), each stored into this GPU's copy and each
        peer's; CTA 0 of the whole grid stores none at ``stall_step`` (the test knob: every GPU then times out)."""
        sync_threads()
        U, W, B, threads = self.units, self.per_cta, site.B, site.g.threads
        total = len(site.ops) * B * W
        tag = bind_value(T.Cast("uint32", site.barrier_base + t + 1), "packed_tag")
        parity = bind_value(slot_of(site.barrier_base, t + 1), "packed_slot")
        first = T.address_of(site.a.ws[(0,) * len(site.a.ws.shape)])
        zero = tirx.const(0.0, site.dt)
        stalled = tirx.all(site.bx == 0, t == site.sync.stall_step)
        for i in range(-(-total // threads)):
            idx = i * threads + site.tx
            with T.If(tirx.all(idx < total, tirx.Not(stalled))):
                with T.Then():
                    e, b, j = idx // (B * W), idx // W % B, idx % W
                    lanes = []
                    for lane in range(LANES):
                        ul = j * LANES + lane
                        inside = tirx.all(ul < U, site.cta * U + ul < site.H)
                        at = T.min((e * B + b) * U + ul, total // W * U - 1)  # in the tile where not inside
                        lanes.append(T.if_then_else(inside, site.staging[at], zero))
                    word = bind_value(T.cuda.func_call(
                        f"prnn_pack<{payload_type(site.dt, self.name)}>", *lanes, tag,
                        source_code=cuda_source("packed.cuh"), return_type="uint64"), "packed_word")
                    slot = T.address_of(site.a.ws[e, parity, b, site.cta * W + j])
                    T.evaluate(T.cuda.func_call("prnn_packed_store", slot, word,
                                                source_code=cuda_source("packed.cuh"), return_type="void"))
                    for k in range(self.gpus - 1):
                        peer = site.a.named[PEER_WORKSPACE.format(k)] if self.floor_parts is None else first
                        T.evaluate(T.cuda.func_call("prnn_packed_store_peer", slot, first, peer, word,
                                                    source_code=cuda_source("packed.cuh"), return_type="void"))
