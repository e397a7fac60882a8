# vboot: the "ROM" of the unix virtual board (mqbatch.lab.vboard runs
# `micropython -i vboot.py` on a pseudo-terminal). It makes the Unix port look like
# a board: the board's own littlefs image (a host file the supervisor names in
# MQB_VBOARD_IMAGE, MQB_VBOARD_BLOCKS blocks of 4096 bytes, formatted on first boot)
# becomes the root filesystem and the host's is unmounted, so `open`, `os` and
# `import` see the image only (/lib, /tmp or ../ are paths inside it); sys.path is a
# board's ('', .frozen, /lib); machine.reset() ends the interpreter, which the
# supervisor starts again (a hard reset: boot.py and main.py run). After a soft
# reset (MQB_VBOARD_SOFT set) main.py does not run, as on a board whose soft reset
# came from the raw REPL. The Unix port still has os.system and ffi: this keeps a
# board's files and imports inside its image; it is not a sandbox.
import os
import sys
import vfs


class _ImageBlocks:
    """Block device over the image file (littlefs' extended block protocol)."""

    def __init__(self, f, blocks):
        self.f = f
        self.blocks = blocks

    def readblocks(self, block, buf, offset=0):
        self.f.seek(block * 4096 + offset)
        self.f.readinto(buf)

    def writeblocks(self, block, buf, offset=None):
        self.f.seek(block * 4096 + (offset or 0))
        self.f.write(buf)
        self.f.flush()

    def ioctl(self, op, arg):
        if op == 4:     # block count
            return self.blocks
        if op == 5:     # block size
            return 4096
        if op == 6:     # erase
            self.f.seek(arg * 4096)
            self.f.write(b"\xff" * 4096)
            self.f.flush()
        return 0


def _image(readonly=False):
    blocks = int(os.getenv("MQB_VBOARD_BLOCKS"))
    dev = _ImageBlocks(open(os.getenv("MQB_VBOARD_IMAGE"), "rb" if readonly else "r+b"), blocks)
    try:
        return vfs.VfsLfs2(dev)
    except OSError:
        if readonly:
            raise
        vfs.VfsLfs2.mkfs(dev)
        return vfs.VfsLfs2(dev)


def _mount():
    fs = _image()
    vfs.umount("/")
    vfs.mount(fs, "/")
    os.chdir("/")
    sys.path[:] = ["", ".frozen", "/lib"]


def _tool(spec):
    """The host's access to a board's image (VirtualBoard.put/get/listdir): the image at
    /flash beside the host's files; spec: {"put": [[host, name]], "get": [[name, host]],
    "ls": [[dir, host]]}; without "put" read-only (the board may be running)."""
    import json

    spec = json.loads(spec)
    ro = not spec.get("put")
    vfs.mount(_image(ro), "/flash", readonly=ro)
    for host, name in spec.get("put", ()):
        part = "/flash"
        for d in name.split("/")[:-1]:
            part += "/" + d
            try:
                os.mkdir(part)
            except OSError:
                pass
        with open(host, "rb") as src, open("/flash/" + name, "wb") as dst:
            dst.write(src.read())
    for name, host in spec.get("get", ()):
        try:
            with open("/flash/" + name, "rb") as src:
                data = src.read()
        except OSError:
            continue
        with open(host, "wb") as dst:
            dst.write(data)
    for name, host in spec.get("ls", ()):
        with open(host, "w") as dst:
            dst.write(json.dumps(sorted(os.listdir("/flash/" + name))))
    vfs.umount("/flash")


def _machine():
    import machine as real

    class Machine:
        pass

    m = Machine()
    for name in dir(real):
        if not name.startswith("__"):
            setattr(m, name, getattr(real, name))

    def reset():
        os.system("kill -TERM $PPID")   # the shell's parent: this interpreter (the supervisor restarts it)

    m.reset = reset
    sys.modules["machine"] = m


if os.getenv("MQB_VBOARD_TOOL"):
    _tool(os.getenv("MQB_VBOARD_TOOL"))
    sys.exit(0)
_soft = os.getenv("MQB_VBOARD_SOFT")
# The supervisor keeps the host's bytes in the port until the firmware is up, as a
# board's UART buffer does: a Ctrl-C must interrupt boot.py or main.py, not the
# interpreter's start or the mount. It passes them on once told here (one byte on
# the pipe MQB_VBOARD_UP names), or at the REPL's prompt when no script runs.
_up = os.getenv("MQB_VBOARD_UP")
_up = _up and open(int(_up), "wb")  # opened while the host's filesystem is still mounted
_mount()
_machine()
for _name in ("boot.py",) + (() if _soft else ("main.py",)):
    try:
        os.stat(_name)
    except OSError:
        continue
    with open(_name) as _f:
        _src = _f.read()
    if _up:
        _up.write(b"1")
        _up.close()
        _up = None
    exec(_src, {"__name__": "__main__", "__file__": _name})
if _up:
    _up.close()
del _soft, _name, _up
