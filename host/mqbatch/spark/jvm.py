"""The JVM fast path of the decode step (docs/spark.md, "JVM fast path").

`java/BatchDecoder.java` (shipped with the package as source) recognises the landed
PUBLISHes that the reference decoder delivers whole (a valid batch of valid binary
records on a valid telemetry topic) and decodes them inside the executors' JVM, as a
function of the session that Spark's generated code calls with its own values and
whose result is Spark's own rows (an Invoke expression, not a UDF: nothing is
converted): no Python worker and no Arrow round trip for the common case. Every other
landed row goes to the Python decoders (mqbatch.spark.vdecode, reference: mqbatch.wire.codec +
mqbatch.wire.records), which name its reason. The tests hold both paths to the same rows.

The jar is compiled once per source and Spark version with the JDK's `javac` against
PySpark's own jars and cached (`jar()`): in the checkout's build/jvm/, else in
$XDG_CACHE_HOME/mqbatch/jvm (~/.cache), or in $MQBATCH_JVM_CACHE. It reaches the JVM as
`spark.jars` (`session()`, the test session, and `mqbatch spark`, which also ships it
to a cluster's executors). Without a JDK, or in a session started without the jar, the
job decodes everything in Python (about 2.5x slower at 1 M records) and says so once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

SOURCE = pathlib.Path(__file__).resolve().with_name("java") / "BatchDecoder.java"
# every Java source of the jar: the decoder, and the report's per-boot figures (boot_figures)
OTHER_SOURCES = ("BootFigures.java",)
CLASS = "mqbatch.jvm.BatchDecoder"
DECODE, IS_FAST = "mqbatch_jvm_decode", "mqbatch_jvm_is_fast"  # the functions' name prefixes
# their arguments, as SQL. Spark's Invoke makes the result null when a nullable argument of a
# primitive parameter (the long) is null, whatever propagateNull says: that long is never null,
# the flag after it says whether received_at is
ARGUMENTS = "topic, payload, user_properties, coalesce(unix_micros(received_at), 0), received_at IS NULL"
# what javac needs of Spark: InternalRow, ArrayData, the types (spark-sql-api), Invoke, Literal
# (spark-catalyst), the classic SparkSession (spark-sql), UTF8String (spark-unsafe, and the Kryo
# interface it implements), LongAccumulator (spark-core), Logging (spark-common-utils), Scala's Seq
_COMPILE_JARS = (
    "spark-sql-api_*.jar",
    "spark-catalyst_*.jar",
    "spark-sql_*.jar",
    "spark-unsafe_*.jar",
    "kryo-shaded-*.jar",
    "spark-core_*.jar",
    "spark-common-utils_*.jar",
    "scala-library-*.jar",
)
_notes: set[str] = set()
# set by `mqbatch spark` for the job it submits when it found no jar to ship (it said why)
OFF_SAID = "MQBATCH_JVM_FAST_PATH_OFF"


def _note(text: str) -> None:
    """Say a fallback once per process, on stderr (the driver's log)."""
    if text not in _notes:
        _notes.add(text)
        print(f"mqbatch.spark: {text}", file=sys.stderr, flush=True)


def pyspark_home() -> pathlib.Path:
    """The pyspark installation of this interpreter, found, not imported (`mqbatch spark`
    imports no pyspark itself); ImportError when there is none."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ImportError("pyspark is not installed")
    return pathlib.Path(spec.origin).parent


def spark_jars_dir() -> pathlib.Path:
    """PySpark's jars/ (the Spark the job runs with), or $SPARK_HOME/jars."""
    home = os.environ.get("SPARK_HOME")
    if home and (pathlib.Path(home) / "jars").is_dir():
        return pathlib.Path(home) / "jars"
    return pyspark_home().resolve() / "jars"


def cache_dir() -> pathlib.Path:
    if os.environ.get("MQBATCH_JVM_CACHE"):
        return pathlib.Path(os.environ["MQBATCH_JVM_CACHE"])
    from mqbatch.util.paths import cache_dir as mqbatch_cache

    return mqbatch_cache("jvm")


def jdk_tool(name: str) -> str | None:
    """A JDK tool (java, javac) as spark-submit finds java: $JAVA_HOME/bin/NAME, else NAME on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (pathlib.Path(home) / "bin" / name).is_file():
        return str(pathlib.Path(home) / "bin" / name)
    return shutil.which(name)


def _javac() -> str | None:
    return jdk_tool("javac")


def sources() -> list[pathlib.Path]:
    """The jar's Java sources: SOURCE first, then OTHER_SOURCES beside it."""
    return [SOURCE, *(SOURCE.with_name(n) for n in OTHER_SOURCES)]


def source_bytes() -> bytes:
    """All of the jar's sources, what its name is made from (OSError where they cannot be read)."""
    return b"\0".join(p.read_bytes() for p in sources())


def jar_name(source: bytes, classpath: list[pathlib.Path]) -> str:
    """The jar's file name: one per Java sources (source_bytes) and set of Spark jars it was compiled against."""
    key = hashlib.sha256(source + "|".join(p.name for p in classpath).encode()).hexdigest()[:16]
    return f"mqbatch-jvm-{key}.jar"


def compile_jar(target: pathlib.Path, classpath: list[pathlib.Path], javac: str) -> str | None:
    """Compiles the sources against `classpath` into the jar `target` (atomically: a temp jar in
    its directory, then renamed). None when done, else javac's complaint."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mqbatch-jvm-", dir=target.parent) as tmp:
        classes = pathlib.Path(tmp) / "classes"
        done = subprocess.run(
            [
                javac,
                "--release",
                "17",
                "-nowarn",
                "-d",
                str(classes),
                "-cp",
                os.pathsep.join(map(str, classpath)),
                *map(str, sources()),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return f"javac failed (exit {done.returncode}): {(done.stderr + done.stdout).strip()[:500]}"
        built = pathlib.Path(tmp) / target.name
        with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: mqbatch\n\n")
            for f in sorted(classes.rglob("*.class")):
                z.write(f, f.relative_to(classes).as_posix())
        os.replace(built, target)
    return None


def compile_classpath(jars: pathlib.Path) -> list[pathlib.Path]:
    """The Spark jars javac compiles against (_COMPILE_JARS in `jars`)."""
    return [p for pattern in _COMPILE_JARS for p in sorted(jars.glob(pattern))]


def jar() -> pathlib.Path | None:
    """The compiled fast path, or None when it cannot be had here (said once on stderr).

    In order: the jar shipped inside the installed package (built with the wheel against
    the pinned PySpark: a JRE is enough), the cached jar, else compiled now with the JDK's
    javac and cached. None without a JDK, when javac fails, when Spark's jars are missing,
    or where the Java source cannot be read (e.g. a driver importing mqbatch from a zip)."""
    try:
        source = source_bytes()
    except OSError as e:  # NotADirectoryError inside a zip
        _note(f"the JVM fast path is off: its source cannot be read here ({type(e).__name__}: {SOURCE})")
        return None
    jars = spark_jars_dir()
    classpath = compile_classpath(jars)
    name = jar_name(source, classpath)
    if (SOURCE.parent / name).is_file():  # shipped in the wheel
        return SOURCE.parent / name
    target = cache_dir() / name
    if target.is_file():
        return target
    failed = build_jar(target, classpath, jars)
    if failed == NO_JAVAC:
        _note(
            f"{NO_JAVAC}: the JVM fast path is off, every landed row is decoded in Python "
            "(install a JDK 17, e.g. apt install openjdk-17-jdk-headless)"
        )
    elif failed and failed.startswith(NO_JARS):
        _note(f"{failed}: the JVM fast path is off, every landed row is decoded in Python")
    elif failed:
        _note(f"{failed}; the JVM fast path is off, every landed row is decoded in Python")
    return None if failed else target


NO_JAVAC, NO_JARS = "no javac (a JDK) found", "Spark's jars not found in"  # build_jar's reasons


def build_jar(target: pathlib.Path, classpath: list[pathlib.Path], jars: pathlib.Path | str) -> str | None:
    """Compiles the fast path into the jar `target` against `classpath` (compile_classpath of
    Spark's `jars`) with the JDK's javac: None when done, else why not in one phrase
    (NO_JAVAC, NO_JARS + where, or javac's complaint). Used by jar() and by setup.py
    (the wheel's shipped jar)."""
    javac = _javac()
    if javac is None:
        return NO_JAVAC
    if len(classpath) != len(_COMPILE_JARS):
        return f"{NO_JARS} {jars}"
    try:
        return compile_jar(target, classpath, javac)
    except OSError as e:  # javac not executable, the directory not writable, ...
        return f"javac could not run or its jar could not be written: {e}"


def with_jar(jars: str | None) -> str | None:
    """A spark.jars value with the fast path's jar added (unchanged when there is none)."""
    path = jar()
    if path is None:
        return jars
    listed = [j for j in (jars or "").split(",") if j]
    return ",".join(listed + [str(path)] if str(path) not in listed else listed)


def options_text(opts) -> str:
    """The job's options as BatchDecoder reads them (clamped to what a Java long holds;
    the values that large mean 'no limit' in the reference too)."""
    big = 1 << 62
    return ",".join(
        str(v)
        for v in (
            min(opts.max_batch_size, big),
            min(opts.max_payload_bytes, big),
            int(bool(opts.allow_empty)),
            min(opts.max_future_s * 1000, big),
        )
    )


def keys_text(opts) -> str | None:
    """The job's --hmac-keys as BatchDecoder reads them ("device:hexkey,..."), or None (no check).
    Only valid device ids (mqbatch.wire.device_id: no ':' or ','); no topic names another."""
    from mqbatch.wire.device_id import DEVICE_ID_RE  # here: setup.py loads this file without the package

    if opts.hmac_keys is None:
        return None
    return ",".join(f"{d}:{bytes(k).hex()}" for d, k in opts.hmac_keys if DEVICE_ID_RE.fullmatch(d))


def _function(spark, name: str, method: str, opts, accumulator, result) -> None:
    """Registers `name` in the session: BatchDecoder.`method` on an instance holding the options
    (and the keys, which its toString never shows). Once per session: a name without an
    accumulator stands for its options and keys (_key), and a stream asks for it in every
    micro-batch; each new instance held its own parse of the keys, and the session's plans kept
    old instances (a 1 GB driver ran out of heap after about 140 micro-batches of a
    10,000-device fleet's keys). Asked of the session's function registry itself (the catalog's
    functionExists also looks in the current catalog and database)."""
    if accumulator is None:
        ident = spark._jvm.org.apache.spark.sql.catalyst.FunctionIdentifier.apply(name)
        if spark._jsparkSession.sessionState().functionRegistry().functionExists(ident):
            return
    target = decoder(spark, opts, accumulator)
    spark._jvm.mqbatch.jvm.BatchDecoder.register(
        spark._jsparkSession, name, target, method, spark._jsparkSession.parseDataType(result.json())
    )


_SHARED: tuple = ()  # (application id, _key, the keys' broadcast): the last one made


def decoder(spark, opts, accumulator=None):
    """A BatchDecoder (a py4j object) of the options; the keys reach it as a Spark broadcast,
    read once per executor: in the decoder itself they went into every stage's task binary
    (about 75 bytes a device: 2 MB with 10,000 devices, five stages a micro-batch). One
    broadcast per key set and application: the batch job's counting decoders (a function of
    their own per call) share it."""
    global _SHARED
    text = keys_text(opts)
    shared = None
    if text is not None:
        tag = (spark.sparkContext.applicationId, _key(opts))
        if _SHARED[:2] != tag:
            _SHARED = (*tag, spark.sparkContext._jsc.broadcast(text))
        shared = _SHARED[2]
    return spark._jvm.mqbatch.jvm.BatchDecoder(options_text(opts), accumulator, shared)


_SALT = os.urandom(16)  # the functions' names tell key sets apart without saying anything of them


def _key(opts) -> str:
    return hashlib.sha256(_SALT + f"{options_text(opts)}|{keys_text(opts)}".encode()).hexdigest()[:12]


def is_fast(spark, opts):
    """Column: whether the fast path decodes this landed row (the Python decoders take the others)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    name = f"{IS_FAST}_{_key(opts)}"
    _function(spark, name, "isFast", opts, None, T.BooleanType())
    return F.expr(f"{name}({ARGUMENTS})")


_counting = 0


def decoded(spark, opts, counting: bool = False):
    """(Column, accumulator): the decoded landed row (result_type()). counting: with a Spark
    accumulator of its own that counts the landed rows the fast path does not take (read
    .value() after the Spark job that evaluated the column: Spark merges the counts of
    successful tasks; a recomputed stage can only count more); else the accumulator is None."""
    from pyspark.sql import functions as F

    global _counting
    accumulator = None
    name = f"{DECODE}_{_key(opts)}"
    if counting:
        _counting += 1
        name = f"{DECODE}_{_counting}"
        accumulator = spark.sparkContext._jsc.sc().longAccumulator(name)
    _function(spark, name, "decode", opts, accumulator, result_type())
    return F.expr(f"{name}({ARGUMENTS})"), accumulator


def result_type():
    """The decoding function's result: struct(fast, batch_id, device, count, records)."""
    from pyspark.sql import types as T

    from mqbatch.spark.schema import READING

    record = T.StructType(
        [
            T.StructField("boot", T.LongType()),
            T.StructField("seq", T.LongType()),
            T.StructField("kind", T.StringType()),
            T.StructField("synced", T.BooleanType()),
            T.StructField("time_us", T.LongType()),
            T.StructField("start", T.IntegerType()),
            T.StructField("length", T.IntegerType()),
            T.StructField("readings", T.ArrayType(READING)),
            T.StructField("dropped_total", T.LongType()),
        ]
    )
    return T.StructType(
        [
            T.StructField("fast", T.BooleanType()),
            T.StructField("batch_id", T.StringType()),
            T.StructField("device", T.StringType()),
            T.StructField("count", T.IntegerType()),
            T.StructField("records", T.ArrayType(record)),
        ]
    )


FIGURES_CLASS = "mqbatch.jvm.BootFigures"  # the report's pass (boot_figures)


def registered(spark, name: str = CLASS) -> bool:
    """Whether the session's JVM has the fast path's class (or the class `name` of its jar);
    False (said once) when it does not, e.g. a session started without spark.jars, or with
    an older mqbatch jar that has no such class."""
    try:
        spark._jvm.java.lang.Class.forName(
            name, False, spark._jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        )
    except Exception as e:  # noqa: BLE001 - py4j's error for a missing class: the Python path decodes
        if not os.environ.get(OFF_SAID):  # else `mqbatch spark` already said why (no jar to ship)
            _note(
                f"the JVM fast path is off in this session ({name} is not on its class path: start it with "
                f"mqbatch.spark.session() or spark.jars=mqbatch.spark.jvm.jar()): {type(e).__name__}"
            )
        return False
    return True


# the by-device pass's columns after arrival.SCHEMA's, in BootFigures' order, and their types
DEVICE_EXTRAS = {"released": "long", "latency_n": "long", "p50": "double", "p95": "double", "p99": "double"}


def boot_figures(rows, window: int, by_device: bool = False):
    """DataFrame: the report's per-boot figures (mqbatch.spark.arrival.SCHEMA) of `rows`
    (arrival.IN_COLUMNS, a boot in one partition, sorted by device, boot and arrival), by
    java/BootFigures.java in the executors' JVM: what arrival.boot_figures computes in Python
    workers, without them. by_device: `rows` also have `released` and `latency` (null where
    not synchronised), a device's rows in one partition, and the result DEVICE_EXTRAS (each
    boot's highest released, the device's latency n and percentiles on its last boot). Only
    in a session with the jar (registered())."""
    from pyspark.sql.classic.dataframe import DataFrame
    from pyspark.sql.pandas.types import from_arrow_schema

    from mqbatch.spark import arrival

    spark = rows.sparkSession
    schema = from_arrow_schema(arrival.SCHEMA)
    if by_device:
        for name, kind in DEVICE_EXTRAS.items():
            schema = schema.add(name, kind)
    java_schema = spark._jsparkSession.parseDataType(schema.json())
    return DataFrame(spark._jvm.mqbatch.jvm.BootFigures.apply(rows._jdf, int(window), java_schema), spark)
