"""Error hierarchy. Every error trustfl raises on purpose subclasses :class:`TrustFLError`.

Messages name the argument, the value found, what is allowed and, where there is one, the fix:
"`noise_multiplier` must be >= 0, found -1.0."
"""
from __future__ import annotations


class TrustFLError(Exception):
    """Base class of all trustfl errors."""


class ConfigError(TrustFLError, ValueError):
    """An invalid configuration value; the message names the key path (``client.lr``)."""


class RegistryError(TrustFLError, KeyError):
    """An unknown registered name; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DataError(TrustFLError):
    """A data set is missing or corrupt; the message names the command that fetches it."""


class PrivacyError(TrustFLError, ValueError):
    """An invalid privacy setting, or a setting that gives no privacy."""


class BudgetExceededError(PrivacyError):
    """A schedule or a step would spend more than a client's privacy budget."""


class UnsupportedEventError(PrivacyError):
    """An accountant cannot compose a DP event; the ledger is left untouched."""


class CheckpointError(TrustFLError):
    """A checkpoint is missing, corrupt or belongs to another configuration."""


class UsageError(TrustFLError):
    """Command-line arguments that do not fit together (``--resume`` with a CONFIG), or a path the command
    cannot use (a run directory that cannot be created)."""


class MessageError(TrustFLError, ValueError):
    """A malformed input given to a stage directly: a message matrix with non-finite rows, a wrong shape or dtype,
    or malformed per-row weights; the message names the component and the offending rows."""


class DistributedError(TrustFLError):
    """A torchrun (``torch.distributed``) run that cannot go on: a malformed ``WORLD_SIZE``/``RANK``/``LOCAL_RANK``,
    a part that does not run split across processes, or ranks that no longer hold the same state."""


class ResourceError(TrustFLError):
    """The machine cannot hold what a run asks for: an allocation failed (the message says what it was doing and
    how much it asked for, and names the settings that size it)."""
