"""Which GPU architectures a compiled library carries: the entries of its ``.nv_fatbin`` ELF section.

nvcc embeds device code in a host library as fat binaries: one container per translation unit,
each holding SASS (a cubin, ``sm_XY``) or PTX (``compute_XY``) entries, one per target of
``-gencode`` (``cuobjdump --list-elf`` / ``--list-ptx`` print them: docs.nvidia.com/cuda/
cuda-binary-utilities). CUDA's ``include/fatbinary_section.h`` defines the container's header
(magic ``0xBA55ED50``, u16 version, u16 header size, u64 size of what follows); the entry header's
layout is not documented by NVIDIA, and is read here as the public reverse-engineered
descriptions give it (for example ``GrigoryEvko/nvopen-tools`` ``fatbin/FORMAT_SPECIFICATION.md``):
u16 kind (1 PTX, 2 ELF), u16, u32 header size, u64 payload size, ..., u32 SM architecture at
byte 28. Only headers are read: payloads (often compressed) are skipped by their size, so a
1 GB library costs a few milliseconds of seeks.

The rule a GPU of compute capability ``X.y`` runs a kernel by (NVIDIA's Blackwell and Hopper
compatibility guides): a cubin built for ``X.z`` with ``z <= y`` (same major), or PTX for any
architecture at or below ``X.y``, which the driver compiles at load. Arch-specific targets
(``sm_90a``) give up that forward compatibility; they are rare in shipped libraries and are
counted here as their base architecture.

Python's standard library has no ELF reader and the image ships none, so the few section-header
fields needed are read with ``struct`` (the ELF-64 layout of the System V gABI).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable
from dataclasses import dataclass

FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
KIND_PTX, KIND_ELF = 1, 2
SECTION = b".nv_fatbin"


class NotAnElfFile(ValueError):
    """The file is not a 64-bit little-endian ELF file."""


@dataclass(frozen=True, order=True)
class Target:
    """One compiled target: ``kind`` ``sass`` (a cubin) or ``ptx``, for ``arch`` (e.g. 90 for 9.0)."""

    arch: int
    kind: str

    def __str__(self) -> str:
        return f"{'sm' if self.kind == 'sass' else 'compute'}_{self.arch}"


def _section(data: mmap.mmap | bytes, name: bytes) -> tuple[int, int] | None:
    """``(offset, size)`` of the ELF section ``name``, or ``None``.

    Raises:
        NotAnElfFile: not an ELF-64 little-endian file.
    """
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise NotAnElfFile("not a 64-bit little-endian ELF file")
    section_offset, = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    if not section_offset or not count:
        return None

    def header(index: int) -> tuple[int, int, int]:   # sh_name, sh_offset, sh_size
        base = section_offset + index * entry_size
        name_offset, = struct.unpack_from("<I", data, base)
        offset, size = struct.unpack_from("<QQ", data, base + 0x18)
        return name_offset, offset, size

    _, names_at, names_size = header(names_index)
    names = data[names_at:names_at + names_size]
    for index in range(count):
        name_offset, offset, size = header(index)
        if names[name_offset:names.find(b"\0", name_offset)] == name:
            return offset, size
    return None


def targets_in(data: mmap.mmap | bytes) -> set[Target]:
    """Every target in the ``.nv_fatbin`` section of the ELF file whose bytes are ``data``
    (empty when the file has no device code).

    Raises:
        NotAnElfFile: ``data`` is not an ELF-64 little-endian file.
    """
    found: set[Target] = set()
    section = _section(data, SECTION)
    if section is None:
        return found
    start, size = section
    end, position = start + size, start
    while True:
        position = data.find(FATBIN_MAGIC, position, end)
        if position < 0 or position + 16 > end:
            return found
        header_size, = struct.unpack_from("<H", data, position + 6)
        container_size, = struct.unpack_from("<Q", data, position + 8)
        entry, container_end = position + header_size, min(position + header_size + container_size, end)
        while entry + 32 <= container_end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch, = struct.unpack_from("<I", data, entry + 28)
            if entry_header == 0:
                break
            if kind in (KIND_PTX, KIND_ELF) and arch:
                found.add(Target(arch, "ptx" if kind == KIND_PTX else "sass"))
            entry += entry_header + payload
        position = max(container_end, position + 4)


def targets_of(path: str) -> set[Target]:
    """``targets_in`` the library at ``path`` (read through ``mmap``, never wholly loaded).

    Raises:
        OSError: unreadable. NotAnElfFile: not an ELF-64 file.
    """
    with open(path, "rb") as handle:
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:   # an empty file cannot be mapped
            raise NotAnElfFile(f"{path} is empty") from None
        with data:
            return targets_in(data)


def runs_on(targets: Iterable[Target], capability: tuple[int, int]) -> Target | None:
    """The target a GPU of compute capability ``(major, minor)`` would run, or ``None`` when it has
    neither a cubin of its major at or below its minor nor PTX at or below its capability: the best
    cubin first (the driver prefers SASS), else the newest PTX it can JIT-compile."""
    major, minor = capability
    own = major * 10 + minor
    sass = [t for t in targets if t.kind == "sass" and t.arch // 10 == major and t.arch <= own]
    if sass:
        return max(sass)
    ptx = [t for t in targets if t.kind == "ptx" and t.arch <= own]
    return max(ptx) if ptx else None


def describe(targets: Iterable[Target]) -> str:
    """``sm_80 sm_90 compute_90``: cubins, then PTX, each ascending (``none`` when empty)."""
    ordered = sorted(targets, key=lambda t: (t.kind == "ptx", t.arch))
    return " ".join(map(str, ordered)) or "none"
