# The firmware's modules, for the boards' manifest.py files (included from there).
# main.py is not frozen by default: it stays on the filesystem, where
# `mqbatch deploy --config-only` replaces it with the config (a frozen main.py
# would always be the one that runs). include(..., freeze_main=True) freezes it too.
options.defaults(freeze_main=False)
for _name in ("mqb_app.py", "mqb_boot.py", "mqb_client.py", "mqb_codec.py", "mqb_config.py", "mqb_native.py",
              "mqb_e2e.py", "mqb_flush.py", "mqb_hmac.py", "mqb_inflight.py", "mqb_net.py", "mqb_outbox.py",
              "mqb_outbox_format.py", "mqb_outbox_recover.py", "mqb_packet.py", "mqb_packet_build.py",
              "mqb_packet_e2e.py", "mqb_record.py", "mqb_sub.py", "mqb_transport.py"):
    module(_name, base_path="../../firmware")
if options.freeze_main:
    module("main.py", base_path="../../firmware")
