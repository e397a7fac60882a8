# Freeze mqbatch into a custom ESP32 build: make BOARD=ESP32_GENERIC FROZEN_MANIFEST=<this file>
# Then deploy only main.py and the config: mqbatch deploy --config-only (docs/application.md).
# include("<this file>", freeze_main=True) from your own manifest also freezes main.py.
include("$(PORT_DIR)/boards/manifest.py")
require("ntptime")
include("../common/manifest.py", freeze_main=options.freeze_main)
module("mqb_board.py")
module("mqb_wifi.py", base_path="../common")
