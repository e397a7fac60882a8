#!/usr/bin/env bash
# Set up everything `make demo` and `make test` need, on a fresh Debian/Ubuntu
# machine with Python 3.11: Debian packages (as root: installed with apt;
# otherwise the exact apt command is printed and we stop), then .venv at the
# repo root with the pinned Python packages from pyproject.toml, then the pinned
# 32-bit MicroPython (npm's WebAssembly port) in .venv/wasm32 for tests/mpy32.
# Re-running is cheap: the venv is rebuilt only when pyproject.toml changes, the
# npm package is fetched only when it is missing or its pin changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
APT_PKGS=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || APT_PKGS+=(mosquitto)
command -v socat >/dev/null 2>&1 || APT_PKGS+=(socat)
command -v strace >/dev/null 2>&1 || APT_PKGS+=(strace)     # tests count socket writes per PUBLISH
command -v chromium >/dev/null 2>&1 || APT_PKGS+=(chromium) # a test renders the demo's HTML report headless (layout at 1280/800 px)
command -v nft >/dev/null 2>&1 || APT_PKGS+=(nftables)     # the connection-flood test applies the fleet's generated per-source limits
command -v ip >/dev/null 2>&1 || APT_PKGS+=(iproute2)      # ... inside a network namespace of its own
command -v systemd-analyze >/dev/null 2>&1 || APT_PKGS+=(systemd)   # `systemd-analyze verify` of the generated service units
java_ok() {    # a JDK 17+: Spark runs on it, and javac builds the decoder's JVM fast path (mqbatch.spark.jvm)
    command -v java >/dev/null 2>&1 || return 1
    command -v javac >/dev/null 2>&1 || return 1
    local v
    v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
    [ -n "$v" ] && [ "$v" -ge 17 ]
}
java_ok || APT_PKGS+=(openjdk-17-jdk-headless)
"$PY" -c 'import ensurepip, venv' >/dev/null 2>&1 || APT_PKGS+=(python3-venv)
# node + npm: the 32-bit MicroPython (WebAssembly port, below) that tests/mpy32 runs
command -v node >/dev/null 2>&1 || APT_PKGS+=(nodejs)
command -v npm >/dev/null 2>&1 || APT_PKGS+=(npm)

if [ ${#APT_PKGS[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "bootstrap: installing Debian packages: ${APT_PKGS[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${APT_PKGS[@]}" >/dev/null
    else
        echo "bootstrap: missing Debian packages. Run:" >&2
        echo "    sudo apt-get update && sudo apt-get install -y ${APT_PKGS[*]}" >&2
        exit 1
    fi
fi
# The Debian package may start a system mosquitto on 1883; mqbatch never uses it
# (tests and the demo start their own on a free loopback port).

"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "bootstrap: Python >= 3.11 required, found $("$PY" --version)" >&2; exit 1; }

stamp=.venv/.mqbatch-stamp
want=$( (cat pyproject.toml; "$PY" --version) | sha256sum | cut -d' ' -f1)   # rebuilt when either changes
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "bootstrap: creating .venv with pinned packages (pyproject.toml)"
    "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
    echo "$want" > "$stamp"
fi

# --- wasm32: the 32-bit MicroPython (ESP32 and RP2040 are 32-bit; the Unix port is
# 64-bit). tests/mpy32 runs the device tests in it with node. Pinned version;
# npm checks the registry's integrity hash.
WASM32_PKG=@micropython/micropython-webassembly-pyscript@1.27.0
WASM32_DIR=${WASM32_DIR:-.venv/wasm32}
if [ ! -f "$WASM32_DIR/node_modules/@micropython/micropython-webassembly-pyscript/micropython.mjs" ] \
        || [ "$(cat "$WASM32_DIR/.mqbatch-stamp" 2>/dev/null)" != "$WASM32_PKG" ]; then
    echo "bootstrap: installing $WASM32_PKG into $WASM32_DIR (npm)"
    mkdir -p "$WASM32_DIR"
    npm install --prefix "$WASM32_DIR" --no-save --no-package-lock --no-audit --no-fund --loglevel=error "$WASM32_PKG" >/dev/null
    echo "$WASM32_PKG" > "$WASM32_DIR/.mqbatch-stamp"
fi
# --- end wasm32
