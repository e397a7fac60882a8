# Freeze mqbatch into a custom Unix-port build: make -C ports/unix FROZEN_MANIFEST=<this file>
include("$(PORT_DIR)/variants/manifest.py")
freeze("../../firmware")
module("mqb_board.py")
