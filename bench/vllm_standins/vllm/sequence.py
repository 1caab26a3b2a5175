"""Stand-in for ``vllm.sequence``, written by prefixcache for vLLM's block unit
tests (bench/vllm_block_tests.py).  It models what the block manager, the
trackers of ``prefix_caching_block`` and ``tests/core/utils.py`` use of
vLLM 0.8.5's sequences:

* a ``Sequence`` holds its prompt's token ids and the tokens appended since
  (``get_token_ids()`` is one live list, as in vLLM), a status (WAITING
  first), its LoRA request and so its extra hash
  (``hash((prompt_adapter_id, lora_int_id))``, None without either);
* its ``data`` counts computed tokens: the sequence is in prefill until
  every token is computed, then in decode (vLLM's stage stays DECODE after
  that, as here, until a recompute, which the block tests never do);
* a ``SequenceGroup`` holds sequences (filtered by status on request), an
  optional encoder sequence and the request's LoRA request.

Scheduling, detokenization, cumulative logprobs, recomputation, prompt and
output kept apart, multi-modal inputs and the metrics of vLLM's classes are
left out.  Where vLLM asserts on a caller's mistake, this raises ValueError."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional


@dataclass
class Logprob:
    """The log probability of a sampled token, with its rank and text."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


class SequenceStatus(enum.IntEnum):
    """The status of a sequence; every status after SWAPPED is finished."""

    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_IGNORED = 6

    @staticmethod
    def is_finished(status: SequenceStatus) -> bool:
        """Whether ``status`` is a finished one."""
        return status > SequenceStatus.SWAPPED


class SequenceStage(enum.Enum):
    """Whether a sequence still has prompt tokens to compute."""

    PREFILL = enum.auto()
    DECODE = enum.auto()


class SequenceData:
    """The tokens of a sequence (prompt, then output) and how many of them
    are computed."""

    def __init__(self, prompt_token_ids: Iterable[int]) -> None:
        self._token_ids = list(prompt_token_ids)
        self._num_computed_tokens = 0
        self._stage = SequenceStage.PREFILL

    @property
    def stage(self) -> SequenceStage:
        """PREFILL until every token is computed, then DECODE."""
        return self._stage

    def append_token_id(self, token_id: int, logprob: float) -> None:
        """Append an output token (its log probability is not kept)."""
        self._token_ids.append(token_id)

    def get_len(self) -> int:
        """Prompt and output tokens."""
        return len(self._token_ids)

    def get_token_ids(self) -> List[int]:
        """Every token, prompt first: the live list, which later appends extend."""
        return self._token_ids

    def get_num_computed_tokens(self) -> int:
        """How many tokens are computed."""
        return self._num_computed_tokens

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        """Count ``num_new_computed_tokens`` more tokens computed (never more
        than the sequence holds: ValueError); with none left to compute, the
        sequence is in decode."""
        total = self._num_computed_tokens + num_new_computed_tokens
        if total > self.get_len():
            raise ValueError(f"{total} tokens computed of {self.get_len()}")
        self._num_computed_tokens = total
        if total == self.get_len():
            self._stage = SequenceStage.DECODE


class Sequence:
    """One sequence of a request: its inputs (a TokenInputs dict), tokens,
    status and adapter requests."""

    def __init__(self, seq_id: int, inputs: Dict[str, Any], block_size: int,
                 eos_token_id: Optional[int] = None, lora_request: Optional[Any] = None,
                 prompt_adapter_request: Optional[Any] = None) -> None:
        self.seq_id = seq_id
        self.inputs = inputs
        self.block_size = block_size
        self.lora_request = lora_request
        self.prompt_adapter_request = prompt_adapter_request
        self.data = SequenceData(inputs["prompt_token_ids"])
        self.output_logprobs: List[Dict[int, Logprob]] = []
        self.status = SequenceStatus.WAITING

    @property
    def n_blocks(self) -> int:
        """Blocks of ``block_size`` tokens the sequence fills (the last partly)."""
        return -(-self.get_len() // self.block_size)

    @property
    def lora_int_id(self) -> int:
        """The LoRA adapter's id, 0 without one."""
        return self.lora_request.lora_int_id if self.lora_request else 0

    @property
    def prompt_adapter_id(self) -> int:
        """The prompt adapter's id, 0 without one."""
        request = self.prompt_adapter_request
        return request.prompt_adapter_id if request else 0

    def extra_hash(self) -> Optional[int]:
        """What besides its tokens keys the sequence's blocks in the prefix
        cache: None without adapters, else the hash of the two adapter ids."""
        if self.prompt_adapter_id == 0 and self.lora_int_id == 0:
            return None
        return hash((self.prompt_adapter_id, self.lora_int_id))

    def append_token_id(self, token_id: int, logprobs: Dict[int, Logprob]) -> None:
        """Append a sampled token; ``logprobs`` must hold it (ValueError)."""
        if token_id not in logprobs:
            raise ValueError(f"token {token_id} is not among its logprobs")
        self.output_logprobs.append(logprobs)
        self.data.append_token_id(token_id, logprobs[token_id].logprob)

    def get_len(self) -> int:
        """Prompt and output tokens."""
        return self.data.get_len()

    def get_token_ids(self) -> List[int]:
        """Every token, prompt first (the live list)."""
        return self.data.get_token_ids()

    def get_num_computed_tokens(self) -> int:
        """How many tokens are computed."""
        return self.data.get_num_computed_tokens()

    def is_prefill(self) -> bool:
        """Whether some of its tokens are not computed yet."""
        return self.data.stage == SequenceStage.PREFILL

    def is_finished(self) -> bool:
        """Whether its status is a finished one."""
        return SequenceStatus.is_finished(self.status)

    def __repr__(self) -> str:
        return (f"Sequence(seq_id={self.seq_id}, status={self.status.name}, "
                f"num_blocks={self.n_blocks})")


class SequenceGroup:
    """The sequences of one request (sampled from one prompt), with the
    request's encoder sequence, if any, and LoRA request.  The other
    arguments of vLLM's constructor are accepted and not kept."""

    def __init__(self, request_id: str, seqs: List[Sequence], arrival_time: float,
                 sampling_params: Optional[Any] = None, lora_request: Optional[Any] = None,
                 pooling_params: Optional[Any] = None, pooled_data: Optional[Any] = None,
                 encoder_seq: Optional[Sequence] = None, trace_headers: Optional[Any] = None,
                 prompt_adapter_request: Optional[Any] = None, priority: int = 0,
                 draft_size: int = 1) -> None:
        self.request_id = request_id
        self.seqs = seqs
        self.first_seq = seqs[0]
        self.arrival_time = arrival_time
        self.sampling_params = sampling_params
        self.lora_request = lora_request
        self.encoder_seq = encoder_seq

    def get_seqs(self, status: Optional[SequenceStatus] = None) -> List[Sequence]:
        """The sequences (the group's own list), or a new list of those with ``status``."""
        if status is None:
            return self.seqs
        return [seq for seq in self.seqs if seq.status == status]

    def is_encoder_decoder(self) -> bool:
        """Whether the request has an encoder sequence."""
        return self.encoder_seq is not None

    def get_encoder_seq(self) -> Optional[Sequence]:
        """The encoder sequence, or None."""
        return self.encoder_seq

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        """Count ``num_new_computed_tokens`` more computed in every unfinished sequence."""
        for seq in self.seqs:
            if not seq.is_finished():
                seq.data.update_num_computed_tokens(num_new_computed_tokens)

    def is_prefill(self) -> bool:
        """Whether the first sequence is in prefill."""
        return self.first_seq.is_prefill()

    def __repr__(self) -> str:
        return (f"SequenceGroup(request_id={self.request_id}, "
                f"sampling_params={self.sampling_params}, num_seqs={len(self.seqs)})")


class SequenceGroupMetadata:
    """Placeholder: ``tests/core/utils.py`` names it in a type annotation only."""
