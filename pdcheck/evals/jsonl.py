"""Read a JSONL file of typed lines, or fail with `InputFileError` naming the file, the line and the problem.

The files read here are appended by a process that may be killed mid-write (records, the
plugin's injection log). A torn last line is a write cut short, not bad input: it has no line
end and is not JSON (a cut JSON object never is), and it is skipped with a warning. Anything
else that does not decode, or does not match the line's type, is refused. A last line without
its line end that is a whole, valid line is kept: files made by other tools often end so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from pdcheck.errors import InputFileError

__all__ = ["read_jsonl"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def read_jsonl(
    path: str | Path,
    kind: type[T],
    *,
    what: str,
    keep: Callable[[bytes], bool] | None = None,
) -> Iterator[tuple[int, T]]:
    """Yield (line number, line decoded as `kind`) for every non-blank line of `path`.

    `what` names a line in error messages ("a question record"). `keep`, when given, sees each
    raw line first; lines it rejects are skipped undecoded.
    """
    path = Path(path)
    decode = msgspec.json.Decoder(kind).decode
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the `with` below, inside the generator
    except OSError as exc:
        raise InputFileError(f"cannot be read ({exc.strerror})", path=path) from None
    with f:
        for number, line in enumerate(f, 1):
            if not line.strip() or (keep is not None and not keep(line)):
                continue
            try:
                value = _decode_line(line, decode, kind)
            except msgspec.ValidationError as exc:  # JSON, of the wrong shape
                raise InputFileError(f"not {what}: {exc}", path=path, line=number) from None
            except msgspec.DecodeError as exc:  # not JSON
                if not line.endswith(b"\n"):
                    logger.warning(
                        "%s:%d: skipping a torn last line (a write cut short)", path, number
                    )
                    return
                raise InputFileError(
                    f"not a JSON line ({exc}); each line must be {what}", path=path, line=number
                ) from None
            yield number, value


def _nan_as_none(constant: str) -> float | None:
    return None if constant == "NaN" else float(constant)


def _decode_line(line: bytes, decode: Callable[[bytes], T], kind: type[T]) -> T:
    try:
        return decode(line)
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError as exc:
        # Files written before msgspec came in (json module) hold NaN and Infinity literals,
        # which msgspec refuses and the json module reads. Their NaN stood for a value the
        # server did not give, which today's files hold as null: it reads as None too.
        try:
            loaded: Any = json.loads(line, parse_constant=_nan_as_none)
        except (ValueError, RecursionError):
            raise exc from None
        return msgspec.convert(loaded, kind)
