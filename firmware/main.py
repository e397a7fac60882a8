# Boot entry on the board (deployed as source): run the mqbatch application.
# The two batch buffers are allocated first, while the heap is still in one
# piece: importing the modules scatters small objects over it, and a small heap
# (64 KB) then has free space but no free run of 2-4 KB.
import json

with open("config.json") as f:
    cfg = json.load(f)
size = cfg.get("flush", {}).get("max_bytes", 4096) + 256    # 4096: mqb_app.DEFAULTS; 256: header room
buffers = (bytearray(size), bytearray(size))

import mqb_app

mqb_app.main(cfg, buffers)
