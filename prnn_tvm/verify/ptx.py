"""Inline PTX in CUDA source, rewritten as host C++ for the emulator (``emulator.h``'s ``load``/``store``).

Only the memory operations the project's device code uses have a translation: loads and stores with a memory
order (``ld.acquire``, ``ld.relaxed``, ``ld.volatile``, ``st.relaxed``; scalar or vector), atomic adds
(``red``, ``atom``), ``%globaltimer`` and cache prefetches (``prefetch``: nothing on the host). Anything else
(tensor-core ``mma``, ``ldmatrix``, ``tanh.approx``) raises
:class:`~prnn_tvm.errors.PrnnError` naming the instruction: such a kernel runs on the GPU only.
"""

from __future__ import annotations

import re

from prnn_tvm.errors import PrnnError

ORDERS = {
    "acquire": "__ATOMIC_ACQUIRE",
    "relaxed": "__ATOMIC_RELAXED",
    "volatile": "__ATOMIC_RELAXED",
    "release": "__ATOMIC_RELEASE",
    "acq_rel": "__ATOMIC_ACQ_REL",
    "": "__ATOMIC_RELAXED",
}
WORDS = {
    "u16": ("uint16_t", 2),
    "b16": ("uint16_t", 2),
    "u32": ("uint32_t", 4),
    "b32": ("uint32_t", 4),
    "u64": ("uint64_t", 8),
    "b64": ("uint64_t", 8),
}
_SCOPE = r"(?:\.(?:cta|gpu|sys))?"
LOAD = re.compile(
    rf"ld\.(acquire|relaxed|volatile){_SCOPE}\.global\.(?:v(\d)\.)?(\w+) (\{{[^}}]*\}}|%\d+), "
    r"\[%(\d+)\];"
)
STORE = re.compile(rf"st\.(relaxed|release|volatile){_SCOPE}\.global\.(\w+) \[%(\d+)\], %(\d+);")
REDUCE = re.compile(rf"red\.(release|relaxed|acq_rel|){_SCOPE}\.?global\.add\.(u32) \[%(\d+)\], (\d+|%\d+);")
ATOMIC = re.compile(
    rf"atom\.(acquire|release|relaxed|acq_rel){_SCOPE}\.global\.add\.(u32) %(\d+), \[%(\d+)\], "
    r"(\d+|%\d+);"
)
TIMER = re.compile(r"mov\.u64 %(\d+), %%globaltimer;")
PREFETCH = re.compile(r"prefetch\.global\.L[12] \[%(\d+)\];")


def translate_source(source: str) -> str:
    """``source`` with every inline assembly statement (``asm volatile(...)``, ``__asm__ __volatile__(...)``,
    ``asm(...)``) replaced by its host translation."""
    out, at = [], 0
    for start in (m.start() for m in re.finditer(r"\b(?:__asm__|asm)(?:\s+(?:__volatile__|volatile))?\s*\(", source)):
        if start < at:
            continue
        end = _closing(source, source.index("(", start))
        semicolon = source.index(";", end)
        out += [source[at:start], translate(source[source.index("(", start) + 1 : end])]
        at = semicolon + 1
    return "".join(out) + source[at:]


def translate(body: str) -> str:
    """One asm statement's body (``"instr" : outputs : inputs : clobbers``) as a host C++ statement."""
    sections = _split(body, ":")
    instruction = " ".join(re.findall(r'"((?:[^"\\]|\\.)*)"', sections[0])).replace("\\n", " ")
    instruction = re.sub(r"\s+", " ", instruction).strip()
    operands = [expr for part in sections[1:3] for expr in _operands(part)]

    def op(ref: str) -> str:
        return f"({operands[int(ref.lstrip('%'))]})" if ref.startswith("%") else ref

    if m := LOAD.fullmatch(instruction):
        order, lanes, word, targets, address = m.groups()
        ctype, size = WORDS[word]
        refs = re.findall(r"%\d+", targets)
        if len(refs) != int(lanes or 1):
            raise PrnnError(f"PTX '{instruction}': {len(refs)} registers for {lanes or 1} lanes")
        loads = " ".join(
            f"{op(r)} = prnn_emu::load<{ctype}>((const char*){op('%' + address)} + {i * size}, {ORDERS[order]});"
            for i, r in enumerate(refs)
        )
        return "{ " + loads + " }"
    if m := STORE.fullmatch(instruction):
        order, word, address, value = m.groups()
        ctype = WORDS[word][0]
        return f"prnn_emu::store<{ctype}>((void*){op('%' + address)}, ({ctype}){op('%' + value)}, {ORDERS[order]});"
    if m := REDUCE.fullmatch(instruction):
        order, word, address, value = m.groups()
        ctype = WORDS[word][0]
        return f"__atomic_fetch_add(({ctype}*){op('%' + address)}, ({ctype}){op(value)}, {ORDERS[order]});"
    if m := ATOMIC.fullmatch(instruction):
        order, word, result, address, value = m.groups()
        ctype = WORDS[word][0]
        return (
            f"{op('%' + result)} = __atomic_fetch_add(({ctype}*){op('%' + address)}, ({ctype}){op(value)}, "
            f"{ORDERS[order]});"
        )
    if m := TIMER.fullmatch(instruction):
        return f"{op('%' + m.group(1))} = prnn_emu::globaltimer();"
    if m := PREFETCH.fullmatch(instruction):  # a hint to the caches: the address is evaluated, nothing else
        return f"(void){op('%' + m.group(1))};"
    raise PrnnError(
        f"the emulator has no host translation of the PTX '{instruction}': this kernel runs on the GPU only"
    )


def _operands(section: str) -> list[str]:
    """The C expressions of a constraint list: ``"=r"(v), "l"(p + 3)`` -> ``["v", "p + 3"]``."""
    out = []
    for part in _split(section, ","):
        part = part.strip()
        if part:
            paren = part.index("(")
            out.append(part[paren + 1 : _closing(part, paren)])
    return out


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside parentheses and string literals."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"' and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and ch in "([{":
            depth += 1
        elif not quoted and ch in ")]}":
            depth -= 1
        elif not quoted and depth == 0 and ch == sep:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _closing(text: str, opening: int) -> int:
    """The index of the parenthesis that closes the one at ``opening`` (string literals skipped)."""
    depth, quoted = 0, False
    for i in range(opening, len(text)):
        ch = text[i]
        if ch == '"' and text[i - 1] != "\\":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
            if depth == 0:
                return i
    raise PrnnError(f"unbalanced parentheses in CUDA source from {text[opening : opening + 60]!r}")
