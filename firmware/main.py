# Boot entry on the board (deployed as source): run the mqbatch application.
#
# Heap layout matters in a small heap (64 KB). Importing the modules creates
# garbage between the objects that stay (old dict tables as module namespaces
# grow, loader scratch); collected only when the heap is full, it leaves many
# holes and no free run of even 1 KB for the application's objects. A GC
# threshold makes the collector run after every 4 KB allocated, so each hole is
# reused by the next allocations and the free space stays in one piece (measured:
# the largest free block after the imports grows from 1.4 KB to 13 KB). It stays
# on while the application runs: few allocations happen per step, so it rarely fires.
# The large blocks are also allocated before the imports: the two batch buffers
# and, with broker.tls, the TLS context (~3 KB). The config is read here only for
# those; mqb_app reads it again (the parsed dict is not kept).
import gc

gc.threshold(4096)


def _restart(e):
    # Anything the application could not handle, while importing (a MemoryError in a
    # heap too small for the modules, a missing or stale module) or while running:
    # log it and reboot the board, never stop at a dead REPL.
    import sys
    import time
    gc.collect()
    sys.print_exception(e)
    print("mqb: fatal error, restarting the board in 5 s:", repr(e))
    time.sleep(5)            # no reboot loop at full speed
    try:
        import mqb_board
    except (ImportError, MemoryError) as e2:     # the board module itself cannot load
        print("mqb: mqb_board unavailable (%r): machine.reset()" % e2)
        import machine
        machine.reset()
    mqb_board.reset(1)


buffers = ctx = reserve = None
try:
    import json

    try:
        with open("config.json") as f:
            cfg = json.load(f)
        # 4096: mqb_config.defaults(); + header room: mqb_app needs 64 + the topic's length (here up to 96 bytes)
        size = cfg.get("flush", {}).get("max_bytes", 4096) + 160
        if type(size) is not int or not 224 <= size <= 1048736:
            raise ValueError(size)   # mqb_config's flush.max_bytes rule (64..1048576) + 160
        use_tls = cfg.get("broker", {}).get("tls", True)
        del cfg, f
    except Exception:
        # missing, not JSON, not an object, a wrong type: mqb_app.main's load_config refuses
        # it in one line and does not run (a reboot here would refuse it again every 5 s)
        cfg = f = None
        size, use_tls = 160, False
    buffers = (bytearray(size), bytearray(size))
    if use_tls:
        try:
            import tls     # MicroPython's TLS module, as mqb_transport uses it
            ctx = tls.SSLContext(tls.PROTOCOL_TLS_CLIENT)
        except ImportError:
            ctx = None     # a port without TLS: mqb_transport.Transport says so, with the way out

    # A free run kept through the imports: they leave the heap in small holes, and App()
    # then needs runs of up to ~600 bytes (its attribute dict, the outbox index); released
    # just before, App() finds them here whatever the imports left. The start-up-only
    # modules are loaded under it too (mqb_app.main and Outbox unload them once used):
    # loaded later they would take that run, and their holes the TLS handshake's.
    reserve = bytearray(3328)
    import mqb_app
    import mqb_config, mqb_outbox_recover  # noqa: E401  (one statement: the reserve above is tuned to this bytecode)

    del mqb_config, mqb_outbox_recover
    reserve = None
    mqb_app.main(buffers=buffers, ssl_context=ctx)
except Exception as e:
    buffers = ctx = reserve = None     # give the heap back before logging
    _restart(e)
