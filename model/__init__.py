"""prefixcache.model: the executable abstract model, usable as a reference oracle.

>>> from prefixcache.model import Model
>>> m = Model(num_blocks=8, block_size=4)
>>> a = m.allocate_immutable_block(None, [1, 2, 3, 4])
>>> b = m.allocate_immutable_block(None, [1, 2, 3, 4])
>>> (a.block_id, b.block_id, m.get_prefix_cache_hit_rate())
(0, 0, 0.5)
"""

from .device import DeviceModel
from .errors import ChoiceNotAllowed, ModelError, ModelInvariantError
from .handles import ChainKey, Handle
from .model import Chooser, Model

__all__ = [
    "ChainKey",
    "ChoiceNotAllowed",
    "DeviceModel",
    "Chooser",
    "Handle",
    "Model",
    "ModelError",
    "ModelInvariantError",
]
