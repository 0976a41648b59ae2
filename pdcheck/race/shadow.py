"""Shadow KV memory: per block page, a content tag and last writer for each token slot and the Mamba state.

Why content tags: a slot's tag is a hash of the token prefix it encodes, so a prefix-cache hit or
a recompute is checked by content, and a slot written by the wrong request shows up whoever reads
it next. One block id is one physical page that every group views: an attention group sees its
token slots, a Mamba group sees one state. The views alias, so a state write garbles the page's
slots and a slot write, load or zeroing garbles the state. Memory starts zeroed, as vLLM
allocates the KV cache with ``torch.zeros``.

Invariants the checker reads: a live request's slots [0, c) hold its own tags; with zeroing on,
the rest of its last block is zero or its own; its Mamba state at index (c-1)//bs equals
tag(c). Writers are ``(kind, request id, dispatch step, execution index)``.
"""

from __future__ import annotations

ZERO = 0
GARBLE = -1  # bytes of another view (a state over slots, or slots over a state)
POISON = -2  # a state computed from a bad read: propagates damage through the prefix cache
_STATE_SALT = 0x5DEECE66D

Writer = tuple[
    str, str, int, int
]  # (kind, request id, dispatch index of its step, execution index)
_INITIAL: Writer = ("init", "", 0, 0)


def prefix_tags(tokens: tuple[int, ...]) -> list[int]:
    """tags[p] identifies tokens[: p + 1]; equal prefixes give equal tags, never ZERO/GARBLE/POISON."""
    tags = []
    h = 1
    for tok in tokens:
        h = hash((h, tok)) & 0x7FFFFFFFFFFFFFFF or 1
        tags.append(h)
    return tags


def state_tag(tags: list[int], num_tokens: int) -> int:
    """The Mamba state after ``num_tokens`` tokens."""
    return (tags[num_tokens - 1] ^ _STATE_SALT) or 1


class ShadowMemory:
    """The pages of one run. Every mutation bumps the page version so readers re-check only changed pages."""

    __slots__ = ("block_size", "slot_writers", "slots", "state_writers", "states", "versions")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.slots = [[ZERO] * block_size for _ in range(num_blocks)]
        self.slot_writers: list[list[Writer]] = [[_INITIAL] * block_size for _ in range(num_blocks)]
        self.states = [ZERO] * num_blocks
        self.state_writers: list[Writer] = [_INITIAL] * num_blocks
        self.versions = [0] * num_blocks

    def write_slot(self, block: int, slot: int, tag: int, writer: Writer) -> None:
        self.slots[block][slot] = tag
        self.slot_writers[block][slot] = writer
        self.states[block] = GARBLE
        self.state_writers[block] = writer
        self.versions[block] += 1

    def write_state(self, block: int, tag: int, writer: Writer) -> None:
        self.states[block] = tag
        self.state_writers[block] = writer
        bs = self.block_size
        self.slots[block] = [GARBLE] * bs
        self.slot_writers[block] = [writer] * bs
        self.versions[block] += 1

    def zero(self, block: int, writer: Writer) -> None:
        bs = self.block_size
        self.slots[block] = [ZERO] * bs
        self.slot_writers[block] = [writer] * bs
        self.states[block] = ZERO
        self.state_writers[block] = writer
        self.versions[block] += 1

    def copy(self, src: int, dst: int, writer: Writer) -> None:
        self.slots[dst] = list(self.slots[src])
        self.slot_writers[dst] = list(self.slot_writers[src])
        self.states[dst] = self.states[src]
        self.state_writers[dst] = writer
        self.versions[dst] += 1
