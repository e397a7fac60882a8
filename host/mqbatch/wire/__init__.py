"""wire — the batch-format v1 wire format on the host (product).

The reference codec (``codec``: batch payloads and their MQTT properties),
the binary record formats (``records``) and batch integrity (``integrity``:
the batch-hmac MAC and the keys file). Pure Python, no I/O beyond the keys file.

May import: ``mqbatch.util`` only. Everything else builds on it.
"""
