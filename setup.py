"""Build step of the wheel (everything else is in pyproject.toml).

The device code stays where it lives in the repository (firmware/, boards/);
this copies it into the wheel as package data under mqbatch/_device/, where
mqbatch.util.paths finds it in an installed package. An editable install (make test)
needs no copy: mqbatch.util.paths then finds the checkout's own folders.
"""

import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
DEVICE_TREES = ("firmware", "boards")


class BuildPyWithDevice(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        for name in DEVICE_TREES:
            dst = pathlib.Path(self.build_lib) / "mqbatch" / "_device" / name
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(HERE / name, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.mpy"))
        # the firmware's mip package (its urls are relative: firmware/...), so that
        # `mpremote mip install <it>` works from an installed wheel too (`mqbatch deploy --print-mip`)
        shutil.copyfile(HERE / "package.json", pathlib.Path(self.build_lib) / "mqbatch" / "_device" / "package.json")


setup(cmdclass={"build_py": BuildPyWithDevice})
