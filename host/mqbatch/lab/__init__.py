"""lab — local stand-ins for what a deployment has, to test and measure with (lab).

``broker``: a Mosquitto on a free loopback port with generated config and certificates;
``stack``: broker + accounts + certificates in one run directory; ``devices``: N
virtual devices (the real firmware in the MicroPython Unix port); ``vboard``: a
virtual board on a pseudo-terminal; ``romfs_run``: firmware from a ROMFS image;
``recproc``: the recorder as a child process.

May import: the product packages. Never imported by them.
"""
