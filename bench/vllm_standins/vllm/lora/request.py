"""Stand-in for ``vllm.lora.request``, written by prefixcache for vLLM's block
unit tests: a LoRA adapter request, which gives a sequence its
``lora_int_id`` and so its extra hash."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class LoRARequest:
    """A request for the LoRA adapter ``lora_int_id``.  Like vLLM's it needs a
    non-empty ``lora_path`` (vLLM asserts; this raises ValueError)."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_local_path: Optional[str] = None
    long_lora_max_len: Optional[int] = None
    base_model_name: Optional[str] = None

    def __post_init__(self) -> None:
        if not self.lora_path:
            self.lora_path = self.lora_local_path or ""
        if not self.lora_path:
            raise ValueError("lora_path cannot be empty")

    @property
    def adapter_id(self) -> int:
        """The adapter's id (``lora_int_id``)."""
        return self.lora_int_id
