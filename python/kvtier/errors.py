"""errors.py - kvtier's return codes (include/kvtier.h) and the exceptions
that carry them: every failed call raises a KvtierError whose .code is the
C code and whose message is kvt_last_error()'s detail when the call left
one (else kvt_strerror()). tests/test_errors.py checks this table against
the header, so a code added in C must be added here too.
"""
from __future__ import annotations

import errno as _errno
from typing import Dict, Optional, Type

# The values of include/kvtier.h, in its order.
ESHAPE = -30900
EDTYPE = -30901
ECOUNT = -30902
ENULL = -30903
ENONFINITE = -30904
EFULL = -30905
ELOCKED = -30906
ERDONLY = -30907
ENOTFOUND = -30908
ENSCONFLICT = -30909
EOPTION = -30910
ESTATE = -30911
EBUSY = -30912
EBUFSIZE = -30913
ENOPAYLOAD = -30914
ELIMIT = -30915
ECORRUPT = -30916
EVERSION = -30917
ENOTRESIDENT = -30918
ENOTDURABLE = -30919
EINDEX = -30920
EAUTH = -30921

CODES: Dict[str, int] = {name: value for name, value in globals().items()
                         if name.startswith("E") and isinstance(value, int)}
_NAMES: Dict[int, str] = {v: "KVT_" + k for k, v in CODES.items()}


def code_name(code: int) -> str:
    """"KVT_ESHAPE" for a kvtier code, "ENOMEM" for -ENOMEM, else the number."""
    if code in _NAMES:
        return _NAMES[code]
    if code < 0 and -code in _errno.errorcode:
        return _errno.errorcode[-code]
    return str(code)


class KvtierError(Exception):
    """A kvtier call failed.

    Attributes:
        code: the C return code (KVT_E* value, or -errno).
        name: its symbolic name, e.g. "KVT_ESHAPE" or "ENOMEM".
        call: the C function (or binding method) that failed.
        detail: kvt_last_error()'s one-line message, "" when it left none.
    """

    def __init__(self, code: int, message: str, call: str = "", detail: str = ""):
        super().__init__(f"{code_name(code)} ({code}): {message}")
        self.code = code
        self.name = code_name(code)
        self.call = call
        self.detail = detail


class ShapeError(KvtierError, ValueError):
    """An array's shape, dtype, layout or size is not what the call needs
    (KVT_ESHAPE, KVT_EDTYPE, KVT_ECOUNT, KVT_EBUFSIZE)."""


class NotFoundError(KvtierError, LookupError):
    """No such namespace, block or layer (KVT_ENOTFOUND)."""


class NotResidentError(KvtierError):
    """Blocks the sequence references are only in the cold tier
    (KVT_ENOTRESIDENT); .blocks lists them when the call could say which."""

    blocks: list = []


class FullError(KvtierError):
    """Every tier is full and all it holds is referenced (KVT_EFULL)."""


class LockedError(KvtierError):
    """Another writer has the store open (KVT_ELOCKED)."""


class CorruptError(KvtierError):
    """Stored data failed a check (KVT_ECORRUPT, KVT_EINDEX)."""


_CLASSES: Dict[int, Type[KvtierError]] = {
    ESHAPE: ShapeError, EDTYPE: ShapeError, ECOUNT: ShapeError, EBUFSIZE: ShapeError,
    ENOTFOUND: NotFoundError, ENOTRESIDENT: NotResidentError, EFULL: FullError,
    ELOCKED: LockedError, ECORRUPT: CorruptError, EINDEX: CorruptError,
}


def error_class(code: int) -> Type[KvtierError]:
    return _CLASSES.get(code, KvtierError)


def make_error(code: int, message: str, call: str = "", detail: str = "",
               cls: Optional[Type[KvtierError]] = None) -> KvtierError:
    return (cls or error_class(code))(code, message, call, detail)
