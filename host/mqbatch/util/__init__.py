"""util — small shared helpers with no mqbatch dependencies (product base).

``paths``: where the device code, the venv tools and Mosquitto are; ``procs``:
child processes and stop signals; ``rundir``: run directories we own;
``argtypes``: checked command-line values; ``paho_compat``: paho-mqtt work-arounds.

May import: nothing of mqbatch.
"""
