# Freeze mqbatch into a custom Pico W build: make BOARD=RPI_PICO_W FROZEN_MANIFEST=<this file>
# Then deploy only main.py and the config: mqbatch deploy --config-only (docs/application.md).
# include("<this file>", freeze_main=True) from your own manifest also freezes main.py.
include("$(PORT_DIR)/boards/RPI_PICO_W/manifest.py")
require("ntptime")
include("../common/manifest.py", freeze_main=options.freeze_main)
module("mqb_board.py")
module("mqb_wifi.py", base_path="../common")
