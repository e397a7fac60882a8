# Freeze mqbatch into a custom Pico W build: make BOARD=RPI_PICO_W FROZEN_MANIFEST=<this file>
include("$(PORT_DIR)/boards/RPI_PICO_W/manifest.py")
require("ntptime")
freeze("../../firmware")
module("mqb_board.py")
module("mqb_wifi.py", base_path="../common")
