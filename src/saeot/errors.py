"""Typed errors for bad external input (SAE files, activation files, text, layer choices).

Every one is a ``ValueError`` subclass whose message is one line naming the path and the cause;
the CLI prints it as ``saeot: error: <message>`` with exit status 2, never a traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """Base class: a user-supplied file or option that saeot cannot use."""


class SAEFormatError(InputError):
    """An SAE folder whose cfg.json or weights are malformed (shapes, dtypes, NaN/inf, sizes, k)."""


class LayerMismatchError(InputError):
    """An SAE whose own hook (``hook_name``) is not the residual layer it is being used for."""


class ActivationFileError(InputError):
    """An activation cache or array file that is malformed (shape, dtype, NaN/inf, size, rows)."""


class TextInputError(InputError):
    """A user text source (file, folder, JSONL field) that is missing, empty or malformed."""
