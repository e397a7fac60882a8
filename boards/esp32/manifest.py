# Freeze mqbatch into a custom ESP32 build: make BOARD=ESP32_GENERIC FROZEN_MANIFEST=<this file>
include("$(PORT_DIR)/boards/manifest.py")
require("ntptime")
freeze("../../firmware")
module("mqb_board.py")
module("mqb_wifi.py", base_path="../common")
