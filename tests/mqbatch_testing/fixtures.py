"""pytest fixtures shared across test modules."""

from __future__ import annotations
