// Runs MicroPython code in the 32-bit WebAssembly port (npm package
// @micropython/micropython-webassembly-pyscript, installed by tools/bootstrap.sh
// into .venv/wasm32), the way tests/mpy/mpyunit.py runs it in the Unix port.
//
//   node run_wasm32.mjs PKGDIR [--put HOSTDIR=FSDIR]... [--path FSDIR]...
//        [--heap BYTES] [--env NAME=VALUE]... [--cwd FSDIR] [--tls-stub]
//        (--test MODULE NAME... | --script FILE [ARG...] | --calls FILE)
//
// --put copies the regular files of HOSTDIR (not its subfolders) into the port's in-memory filesystem at
// FSDIR (the firmware, the tests), --path puts FSDIR on sys.path. Before the test
// runs, wasm32_prelude.py (next to this file) adapts the port to look like a board
// (see there). --test prints "MPYTEST PASS|FAIL name" per test like mpyunit.py;
// --script runs FILE as __main__ with sys.argv = [FILE, ARG...]. --tls-stub
// installs tls_stub.py as `tls` (this port has none; heap measurements only).
// --calls FILE (a path in the port's filesystem) runs the parts of FILE between
// lines "#-- call" as separate top-level calls in __main__: gc.collect() at the
// start of a call then sees only live objects (within one call this port's GC
// keeps recent garbage that stale pointers on its stack still reach).
// Exit status: 0 when every test passed (or the script raised nothing), 1 otherwise,
// 2 for bad arguments.
import fs from "node:fs";
import path from "node:path";
import url from "node:url";

const here = path.dirname(url.fileURLToPath(import.meta.url));
const argv = process.argv.slice(2);
if (argv.length < 1) {
  console.error("usage: node run_wasm32.mjs PKGDIR [options] (--test MODULE NAME... | --script FILE)");
  process.exit(2);
}
const pkgdir = argv.shift();
const puts = [], paths = [], env = {};
let heap = 1024 * 1024, mode = null, rest = [], cwd = "/", tlsStub = false;
while (argv.length) {
  const a = argv.shift();
  if (a === "--put") puts.push(argv.shift().split("="));
  else if (a === "--path") paths.push(argv.shift());
  else if (a === "--cwd") cwd = argv.shift();
  else if (a === "--tls-stub") tlsStub = true;
  else if (a === "--heap") heap = parseInt(argv.shift(), 10);
  else if (a === "--env") { const [k, ...v] = argv.shift().split("="); env[k] = v.join("="); }
  else if (a === "--test" || a === "--script" || a === "--calls") { mode = a; rest = argv.splice(0); }
  else { console.error("run_wasm32: unknown argument " + a); process.exit(2); }
}
if (!mode || rest.length < 1) {
  console.error("run_wasm32: --test MODULE NAME..., --script FILE or --calls FILE needed");
  process.exit(2);
}

const entry = path.join(pkgdir, "micropython.mjs");
if (!fs.existsSync(entry)) { console.error("run_wasm32: no " + entry + " (run tools/bootstrap.sh)"); process.exit(2); }
const { loadMicroPython } = await import(url.pathToFileURL(entry).href);
let out = "";
const mp = await loadMicroPython({
  heapsize: heap,
  linebuffer: true,
  stdout: (line) => { out += line + "\n"; process.stdout.write(line + "\n"); },
  stderr: (line) => process.stderr.write(line + "\n"),
});

function mkdirs(p) {
  let cur = "";
  for (const part of p.split("/").filter(Boolean)) {
    cur += "/" + part;
    try { mp.FS.mkdir(cur); } catch (e) { /* exists */ }
  }
}
for (const [hostdir, fsdir] of puts) {
  mkdirs(fsdir);
  for (const name of fs.readdirSync(hostdir)) {
    if (fs.statSync(path.join(hostdir, name)).isFile()) mp.FS.writeFile(fsdir + "/" + name, fs.readFileSync(path.join(hostdir, name)));
  }
}
mkdirs("/mpy32");
// socket_stub.py is the port's `socket` (named apart so that CPython never imports it)
const helpers = [["wasm32_prelude.py", "wasm32_prelude.py"], ["socket_stub.py", "socket.py"]];
if (tlsStub) helpers.push(["tls_stub.py", "tls.py"]);
for (const [src, dst] of helpers) {
  mp.FS.writeFile("/mpy32/" + dst, fs.readFileSync(path.join(here, src)));
}

const q = (s) => JSON.stringify(s);   // a JSON string is a valid Python str literal for these paths/names
let code = "import sys\nsys.path[:] = " + q(["/mpy32", ...paths, ""]) + "\n";
code += "import wasm32_prelude\nwasm32_prelude.setup(" + q(env) + ", " + q(cwd) + ")\n";
if (mode === "--test") {
  code += "wasm32_prelude.run_tests(" + q(rest[0]) + ", " + q(rest.slice(1)) + ")\n";
} else if (mode === "--script") {
  code += "wasm32_prelude.run_script(" + q(rest[0]) + ", " + q(rest.slice(1)) + ")\n";
}
let status = 0;
try {
  mp.runPython(code);
  if (mode === "--calls") {
    for (const part of mp.FS.readFile(rest[0], { encoding: "utf8" }).split(/^#-- call$/m)) mp.runPython(part);
  }
} catch (e) {
  process.stdout.write(String(e.message || e) + "\n");
  status = 1;
}
if (mode === "--test" && (out.includes("MPYTEST FAIL") || !out.includes("MPYTEST PASS"))) status = 1;
process.exit(status);
