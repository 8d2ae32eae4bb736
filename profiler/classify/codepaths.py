"""The closed set of serialization codepaths serwatt attributes to.

This set is a contract: it bounds the `codepath` Prometheus label and every
codepath appears (zeros included) in the profile document.
"""

from __future__ import annotations

from dataclasses import dataclass

CODEPATHS: tuple[str, ...] = (
    "pickle",
    "torch",
    "protobuf",
    "json",
    "msgpack",
    "yaml",
    "safetensors",
    "numpy",
    "many",
    "other",
)

SERIALIZATION_CODEPATHS: tuple[str, ...] = tuple(c for c in CODEPATHS if c != "other")

# Codepaths whose writer makes every checkpoint durable as a property of its code, not
# of what the samples saw (an fsync shorter than a sample period escapes them): the
# report takes these as durable whatever share of their episodes showed the fsync.
KNOWN_DURABLE: dict[str, str] = {
    "many": "the .many writer fsyncs every file and its directory (profiler/many/writer.py; "
    "many.Checkpointer, DCP and torch_compat save through it)",
}


@dataclass(frozen=True)
class Classification:
    """Why a sample landed where it did.

    `rule_id` names the rule that fired (None for `other`); `confidence` is "high"
    or "low" (a call-site line that also runs other non-trivial calls is "low").
    `ambiguous` marks such a mixed call-site line (always with "low"); an `other`
    sample with `ambiguous=True` was a line calling two different serializers.
    `direction`: "encode", "decode" or "unknown" (profiler/classify/direction.py).
    """

    codepath: str
    rule_id: str | None = None
    confidence: str = "high"
    ambiguous: bool = False
    direction: str = "unknown"

    @property
    def low_confidence(self) -> bool:
        return self.confidence != "high"


OTHER = Classification("other")
