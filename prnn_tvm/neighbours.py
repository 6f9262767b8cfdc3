"""Configs carried over from the tuning records of neighbouring hidden sizes: what a compile builds first where its
own shapes have no record.

A record serves one key (cell, batch, hidden, dtype, GPU, template, TVM version). A layer of the same cell, batch,
dtype and GPU at a hidden size nobody tuned would otherwise take its template's ranked defaults, which a cost
estimate fitted at a few shapes orders; the records of the nearest tuned hidden sizes on the same GPU know more
(LSTM float16 at batch 16 on the H100: the defaults spread a few units over every SM with a grid-wide counter,
the records at 256, 512 and 1024 all chose 16 units per CTA, sentinel polling and the batch in groups).

The rule: the keys equal to this one but for ``hidden``, within a factor ``NEIGHBOUR_RATIO`` of it, nearest first
(by ratio; a tie goes to the larger, whose configs hold more weights per thread than the same knobs do here, so
they fit here too); of each, its fastest configs, each carried over by its template
(``Template.carried_over``: for the tensor-core template the knobs kept, the units per CTA raised only as far as
one CTA per SM needs, ``schedules.ranking.carried_over``), at most ``limit`` in all. A layer of a half dtype with
no neighbour of its own takes those of the other half dtypes, as for its own records
(``prnn_tvm.dtypes.sharing_records``).
"""

from __future__ import annotations

import math
from dataclasses import replace

from . import records
from .dtypes import sharing_records
from .errors import ConfigError

NEIGHBOUR_RATIO = 2.0  # hidden sizes further apart than this share no records


def neighbour_keys(found: list, key: records.TuneKey) -> list:
    """The keys of ``found`` (records) equal to ``key`` but for ``hidden``, with a successful record, within
    ``NEIGHBOUR_RATIO`` of it, nearest first; those of ``key``'s dtype, else of the first dtype sharing its records
    that has any."""
    for dtype in (key.dtype, *sharing_records(key.dtype)):
        want = replace(key, dtype=dtype)
        near = {
            k
            for k, recs in records.grouped(found).items()
            if k.hidden != key.hidden
            and replace(k, hidden=want.hidden) == want
            and _ratio(k.hidden, key.hidden) <= NEIGHBOUR_RATIO
            and any(r.ok for r in recs)
        }
        if near:
            return sorted(near, key=lambda k: (_ratio(k.hidden, key.hidden), -k.hidden))
    return []


def carried_configs(found: list, plan, template, gpu, key: records.TuneKey, limit: int) -> list:
    """``(config, record, neighbour key)`` for the fastest records of each neighbour of ``key`` (nearest first), each
    record's config as ``template`` carries it over to ``plan``, distinct, at most ``limit``."""
    out, seen = [], set()
    for cfg, record, near in _carried(found, plan, template, gpu, key, limit):
        if cfg in seen:
            continue
        seen.add(cfg)
        out.append((cfg, record, near))
        if len(out) == limit:
            break
    return out


def _carried(found: list, plan, template, gpu, key: records.TuneKey, top: int, variants=lambda knobs: (knobs,)):
    """``(config, record, neighbour key)``: for the ``top`` fastest records of each neighbour of ``key``, nearest
    first, each knob set of ``variants(record.config)`` as ``template`` carries it over to ``plan``; those it
    cannot carry (knobs the template no longer has, no config that validates) left out."""
    for near in neighbour_keys(found, key):
        for record in records.ranked(found, near, top):
            for knobs in variants(record.config):
                try:
                    cfg = template.carried_over(template.config_from_dict(knobs), plan, gpu)
                except ConfigError:  # a record of knobs this template no longer has
                    continue
                if cfg is not None:
                    yield cfg, record, near


def _ratio(a: int, b: int) -> float:
    return math.exp(abs(math.log(a / b)))


def carried_seeds(found: list, plan, template, gpu, key: records.TuneKey, top: int, knob: str, values) -> list:
    """Configs to measure first at a key whose neighbours have records (``tune(first=...)``): the ``top`` fastest
    records of every neighbour of ``key``, nearest first, each carried over as it is and with ``knob`` set to each
    of ``values`` (``bench/tune_neighbours.py``: ``batch_groups`` 2 and 4, the units raised as the grid needs),
    distinct, in that order; first of all the config a compile carries over (:func:`carried_configs`' first), which
    is not the fastest record's variant where that record carries over only with ``knob`` changed."""

    def variants(knobs: dict) -> tuple:
        return (knobs, *({**knobs, knob: v} for v in values))

    out = [cfg for cfg, _record, _near in carried_configs(found, plan, template, gpu, key, top)[:1]]
    for cfg, _record, _near in _carried(found, plan, template, gpu, key, top, variants):
        if cfg not in out:
            out.append(cfg)
    return out
