"""Build step of the wheel (everything else is in pyproject.toml).

The device code stays where it lives in the repository (firmware/, boards/);
this copies it into the wheel as package data under mqbatch/_device/, where
mqbatch.util.paths finds it in an installed package. An editable install (make test)
needs no copy: mqbatch.util.paths then finds the checkout's own folders.

It also compiles the Spark job's JVM fast path (host/mqbatch/spark/java/BatchDecoder.java)
with the JDK's javac against the build environment's PySpark jars, into
mqbatch/spark/java/mqbatch-jvm-<key>.jar: installed with that PySpark, the package needs a
JRE only (mqbatch.spark.jvm.jar() takes the shipped jar first). `make wheel` builds it so
(--no-build-isolation, from the project venv) and MQBATCH_WHEEL_JVM=require makes a missing
JDK or PySpark an error. Otherwise the wheel is built without the jar and says so in one
line; the installed package then compiles it on first use where a JDK is, else decodes in
Python.
"""

import importlib.util
import os
import pathlib
import shutil
import sys

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
        build_jvm_jar(pathlib.Path(self.build_lib) / "mqbatch" / "spark" / "java")


def build_jvm_jar(directory: pathlib.Path) -> pathlib.Path | None:
    """The fast path's jar, compiled by mqbatch.spark.jvm's own functions (loaded from the
    source tree: the package is not importable while it is being built). None, said in one
    line, when this environment has no javac or no PySpark (an error under
    MQBATCH_WHEEL_JVM=require)."""
    spec = importlib.util.spec_from_file_location("_mqbatch_jvm", HERE / "host" / "mqbatch" / "spark" / "jvm.py")
    jvm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(jvm)
    for old in directory.glob("mqbatch-jvm-*.jar"):
        old.unlink()
    try:
        jars = jvm.spark_jars_dir()
        classpath = jvm.compile_classpath(jars)
    except ImportError:  # an isolated build: no pyspark
        jars, classpath = "the build environment (no pyspark)", []
    target = directory / jvm.jar_name(jvm.source_bytes(), classpath)
    failed = jvm.build_jar(target, classpath, jars)
    if not failed:
        return target
    failed += (
        " (it needs a JDK 17's javac, e.g. apt install openjdk-17-jdk-headless, and pyspark in the build "
        "environment: make wheel, or pip wheel --no-build-isolation from the project venv)"
    )
    if os.environ.get("MQBATCH_WHEEL_JVM") == "require":
        raise SystemExit(f"mqbatch wheel: the Spark job's JVM fast path was not built: {failed}")
    print(f"mqbatch wheel: built without the Spark job's JVM fast path jar: {failed}", file=sys.stderr)
    return None


setup(cmdclass={"build_py": BuildPyWithDevice})
