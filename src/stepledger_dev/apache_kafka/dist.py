"""The Apache Kafka broker's jars: resolved once by Maven into a cache outside the project.

The cache is ``$STEPLEDGER_KAFKA_CACHE`` or ``$XDG_CACHE_HOME/stepledger`` (default
``~/.cache/stepledger``), holding ``kafka-<version>/lib/*.jar``.  Two processes fetching at
once are safe: an exclusive lock file serialises the fetches (so Maven's local repository is
not written twice at once), and each fetch fills a private directory that is renamed into
place in one step, so a reader sees either no cache entry or a complete one.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from importlib import resources
from pathlib import Path

from stepledger.errors import BrokerError, ConfigError

#: The Apache Kafka version the launcher runs (Maven Central serves 4.0.0 to 4.4.0 here).
KAFKA_VERSION = "4.4.0"
#: Kafka 4.x brokers need this Java release or newer.
MIN_JAVA = 17
#: How long one Maven fetch may take before it is abandoned.
FETCH_TIMEOUT_S = 900.0
_JAVA_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def cache_root() -> Path:
    """The directory holding one ``kafka-<version>`` entry per fetched version."""
    explicit = os.environ.get("STEPLEDGER_KAFKA_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "stepledger"


def java_executable() -> str:
    """Return the ``java`` on PATH if it is Java 17 or newer; ConfigError otherwise."""
    java = shutil.which("java")
    if java is None:
        raise ConfigError(
            f"Apache Kafka needs Java {MIN_JAVA}+ and no 'java' is on PATH "
            "(install a JDK or JRE, e.g. apt-get install openjdk-17-jre-headless)"
        )
    major = _java_major(java)
    if major < MIN_JAVA:
        raise ConfigError(f"Apache Kafka needs Java {MIN_JAVA}+, but {java} is Java {major}")
    return java


def _java_major(java: str) -> int:
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot run {java} -version: {exc}") from None
    found = _JAVA_VERSION.search(done.stderr + done.stdout)
    if found is None:
        raise ConfigError(f"cannot tell the Java version of {java}")
    major = int(found.group(1))
    # Java 8 and older call themselves "1.8".
    return int(found.group(2) or 0) if major == 1 else major


def kafka_libs(version: str = KAFKA_VERSION, timeout: float = FETCH_TIMEOUT_S) -> Path:
    """Return the directory of the broker's jars, fetching them with Maven the first time."""
    final = cache_root() / f"kafka-{version}"
    lib = final / "lib"
    if _complete(lib):
        return lib
    cache_root().mkdir(parents=True, exist_ok=True)
    with _exclusive(cache_root() / f"kafka-{version}.lock", timeout):
        if not _complete(lib):
            _fetch_into(final, version, timeout)
    return lib


def class_archive(version: str = KAFKA_VERSION) -> Path:
    """Where the broker's class-data archive lives (made by ``cluster.archive_classes``).

    A JVM started with it maps the classes a broker loads instead of parsing and verifying
    them: a third less CPU per broker start and per storage format, which the test passes
    do a hundred times over on two cores.  Absent, or made by another JDK, it is not used.
    """
    return cache_root() / f"kafka-{version}" / "classes.jsa"


def _complete(lib: Path) -> bool:
    return (lib.parent / "complete").is_file()


class _exclusive:
    """An exclusive ``flock`` on a lock file, waited for at most ``timeout`` seconds."""

    def __init__(self, path: Path, timeout: float) -> None:
        self._path = path
        self._timeout = timeout
        self._fd = -1

    def __enter__(self) -> None:
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self._fd)
                    raise BrokerError(
                        f"another process held {self._path} for {self._timeout:.0f}s"
                    ) from None
                time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


def _fetch_into(final: Path, version: str, timeout: float) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError(
            f"fetching Apache Kafka {version} needs Maven and no 'mvn' is on PATH "
            f"(install it, e.g. apt-get install maven, or fill {final} yourself)"
        )
    staging = Path(tempfile.mkdtemp(prefix=f".kafka-{version}-", dir=final.parent))
    try:
        pom = staging / "pom.xml"
        pom.write_bytes(resources.files(__package__).joinpath("pom.xml").read_bytes())
        _run_maven(mvn, pom, staging / "lib", version, timeout)
        (staging / "complete").write_text(f"{version}\n")
        if final.exists():  # left half-made by an older layout or by hand: replace it
            shutil.rmtree(final)
        os.rename(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _run_maven(mvn: str, pom: Path, lib: Path, version: str, timeout: float) -> None:
    command = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-Dkafka.version={version}",
        f"-DoutputDirectory={lib}",
        "-DincludeScope=runtime",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BrokerError(f"Maven did not fetch Apache Kafka {version} in {timeout:.0f}s") from None
    if done.returncode != 0 or not any(lib.glob("kafka_2.13-*.jar")):
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise BrokerError(f"Maven could not fetch Apache Kafka {version}: {' / '.join(tail)}")
