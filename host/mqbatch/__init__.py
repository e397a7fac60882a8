"""mqbatch: telemetry from MicroPython devices into Spark (batch-format v1 over MQTT 5).

The host package has two halves, told apart by folder (docs/architecture.md):

- the product a user deploys: ``wire`` (codec, records, batch HMAC), ``ingest``
  (recorder, landing zone, end-to-end acks), ``spark`` (the job), ``fleet``
  (PKI, broker policy, provisioning, deploy), ``report`` (HTML report), ``util``;
- the lab that tests and measures it: ``lab`` (local broker and stack, virtual
  devices and boards), ``conformance`` (the inspecting proxy and its checks),
  ``scenarios`` (demo, fault scenarios), ``bench``.

``commands`` holds the thin CLI commands; ``cli`` wires them together. The product
never imports the lab (import-linter contracts in pyproject.toml, run by `make test`).
"""

__version__ = "0.1.0"


def version() -> str:
    """The installed distribution's version (package metadata)."""
    from importlib import metadata

    try:
        return metadata.version("mqbatch")
    except metadata.PackageNotFoundError:  # running from a checkout that was never installed
        return f"{__version__} (not installed)"
