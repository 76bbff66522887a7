"""op-plugin's npu_ffn (being written)."""
from __future__ import annotations
