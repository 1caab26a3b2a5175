"""Stand-in for ``vllm.inputs``, written by prefixcache for vLLM's block unit
tests: the token-only inputs a ``Sequence`` is built from.  As in vLLM they
are plain dicts: ``{"type": "token", "prompt_token_ids": [...]}`` plus
``"prompt"`` and ``"token_type_ids"`` when given."""

from __future__ import annotations

from typing import List, Optional, TypedDict


class TokenInputs(TypedDict, total=False):
    """The inputs of one sequence, as token ids (``type`` and
    ``prompt_token_ids`` are always set; the others are optional)."""

    type: str
    prompt_token_ids: List[int]
    token_type_ids: List[int]
    prompt: str


class EncoderDecoderInputs(TypedDict):
    """The inputs of an encoder/decoder request: one TokenInputs each."""

    encoder: TokenInputs
    decoder: TokenInputs


def token_inputs(prompt_token_ids: List[int], token_type_ids: Optional[List[int]] = None,
                 prompt: Optional[str] = None) -> TokenInputs:
    """A new TokenInputs holding ``prompt_token_ids`` (the list itself) and the
    optional fields that are not None."""
    inputs = TokenInputs(type="token", prompt_token_ids=prompt_token_ids)
    if prompt is not None:
        inputs["prompt"] = prompt
    if token_type_ids is not None:
        inputs["token_type_ids"] = token_type_ids
    return inputs
