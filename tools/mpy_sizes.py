"""What loading .mpy files from a filesystem puts into the heap that frozen or ROMFS
code keeps in flash: the bytecode of every function and the str/bytes constants
(docs/application.md, "Heap on 32-bit boards"). Parses .mpy v6 (bytecode only).

    .venv/bin/python tools/mpy_sizes.py BUILD_DIR [MODULE ...]

Prints the totals and the heap they take with 16-byte (32-bit ports) and 32-byte
(64-bit) GC blocks: each function's bytecode is one allocation, each constant's
data another (its text + NUL).
"""

from __future__ import annotations

import json
import pathlib
import sys

_STR, _BYTES, _TUPLE = 5, 6, 10  # persistent object kinds of .mpy v6


class MpyError(ValueError):
    pass


def _uint(b: bytes, i: int) -> tuple[int, int]:
    v = 0
    while True:
        if i >= len(b):
            raise MpyError("truncated .mpy (variable-length int runs past the end)")
        c = b[i]
        i += 1
        v = (v << 7) | (c & 0x7F)
        if not c & 0x80:
            return v, i


def parse(b: bytes) -> dict:
    """Bytecode sizes (one per function) and str/bytes constant sizes of one .mpy file."""
    if b[:2] != b"M\x06" or len(b) < 4:
        raise MpyError("not a .mpy v6 file")
    if b[2] >> 2:
        raise MpyError("native code .mpy (arch %d): only bytecode is measured" % (b[2] >> 2))
    i = 4
    n_qstr, i = _uint(b, i)
    n_obj, i = _uint(b, i)
    for _ in range(n_qstr):
        v, i = _uint(b, i)
        if not v & 1:  # odd: a static qstr's index, no text
            i += (v >> 1) + 1
    consts: list[int] = []

    def obj(i: int) -> int:
        if i >= len(b):
            raise MpyError("truncated .mpy (constant table)")
        kind = b[i]
        i += 1
        if kind <= 4:  # function table, None, False, True, Ellipsis
            return i
        n, i = _uint(b, i)
        if kind == _TUPLE:
            for _ in range(n):
                i = obj(i)
            return i
        if kind in (_STR, _BYTES):
            consts.append(n)
            return i + n + 1
        return i + n  # int, float, complex as text

    for _ in range(n_obj):
        i = obj(i)
    code: list[int] = []

    def raw_code(i: int) -> int:
        kind_len, i = _uint(b, i)
        if kind_len & 3 > 1:
            raise MpyError("native or viper function: only bytecode is measured")
        code.append(kind_len >> 3)
        i += kind_len >> 3
        if (kind_len >> 2) & 1:
            n, i = _uint(b, i)
            for _ in range(n):
                i = raw_code(i)
        return i

    i = raw_code(i)
    if i != len(b):
        raise MpyError(f".mpy parsed to byte {i} of {len(b)}")
    return {"bytecode": code, "consts": consts}


def heap_bytes(sizes: list[int], block: int, extra: int = 0) -> int:
    return sum((n + extra + block - 1) // block * block for n in sizes)


def main(argv: list[str]) -> int:
    build = pathlib.Path(argv[0])
    names = set(argv[1:])
    code: list[int] = []
    consts: list[int] = []
    for p in sorted(build.glob("*.mpy")):
        if names and p.stem not in names:
            continue
        got = parse(p.read_bytes())
        code += got["bytecode"]
        consts += got["consts"]
    out = {
        "functions": len(code),
        "bytecode_bytes": sum(code),
        "str_bytes_constants": len(consts),
        "constant_bytes": sum(consts),
        "heap_32bit": heap_bytes(code, 16) + heap_bytes(consts, 16, 1),
        "heap_64bit": heap_bytes(code, 32) + heap_bytes(consts, 32, 1),
    }
    print("MPY_SIZES", json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
