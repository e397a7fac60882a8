# boot.py of the unix virtual board: mount the firmware's ROMFS image, as boards
# with a ROMFS partition (ESP32, RP2040 builds since MicroPython 1.25) do at boot.
# The image is mapped outside the MicroPython heap by the host launcher
# (mqbatch.romfs_run, which passes its address in MQB_ROMFS), so bytecode and
# constants run in place and cost no heap, like frozen or ROMFS code on a board.
# Without MQB_ROMFS nothing happens and modules load from the working directory.
import os
import sys

_spec = os.getenv("MQB_ROMFS")
if _spec:
    import uctypes
    import vfs

    _addr, _size = _spec.split(":")
    vfs.mount(vfs.VfsRom(uctypes.bytearray_at(int(_addr), int(_size))), "/rom")
    sys.path.insert(0, "/rom")
    del _addr, _size, uctypes, vfs
del _spec
