# Freeze mqbatch into a custom Unix-port build: make -C ports/unix FROZEN_MANIFEST=<this file>
# Then deploy only main.py and the config: mqbatch deploy --config-only (docs/application.md).
# include("<this file>", freeze_main=True) from your own manifest also freezes main.py.
include("$(PORT_DIR)/variants/manifest.py")
include("../common/manifest.py", freeze_main=options.freeze_main)
module("mqb_board.py")
