"""A private, mutable view of the shared airline database per episode (copy on access, structural sharing).

The base `FlightDB` is parsed once per process. An episode sees three `CowTable`s (flights, users,
reservations) that return a private deep copy of a record the first time it is fetched by key, and the shared
record otherwise (iteration for searches). Every mutation the tools make goes through a keyed fetch
(`db.users[uid].reservations.append(...)`, `db.reservations[rid] = ...`), so the base is never modified and a
reset costs three empty dictionaries. Grading compares only the records either side touched.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping
from typing import Any

_MISSING = object()


class CowDict(dict):
    """A dict whose values are shared with a base dict until fetched by key; a keyed fetch stores and returns
    a private deep copy. Used for `Flight.dates` (30 statuses per flight; a tool touches one or two)."""

    __slots__ = ("_copied",)

    def __init__(self, base: dict[str, Any]) -> None:
        super().__init__(base)
        self._copied: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        value = dict.__getitem__(self, key)
        if key not in self._copied:
            value = value.model_copy(deep=True)
            dict.__setitem__(self, key, value)
            self._copied.add(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def __setitem__(self, key: str, value: Any) -> None:
        self._copied.add(key)
        dict.__setitem__(self, key, value)

    def __deepcopy__(self, memo: dict) -> dict[str, Any]:
        return {k: v.model_copy(deep=True) for k, v in dict.items(self)}


def copy_record(record: Any) -> Any:
    """A private, independent copy of one database record that dumps exactly like the original.

    Flights share their date statuses until one is fetched (`CowDict`); other records are rebuilt from their
    dump, several times faster than `deepcopy` (tests check every record round-trips unchanged)."""
    dates = getattr(record, "dates", None)
    if isinstance(dates, dict):
        return record.model_copy(update={"dates": CowDict(dates)})
    return type(record).model_validate(record.model_dump())


class CowTable(MutableMapping):
    """A dict-like table over a shared base dict: keyed reads copy the record into a private overlay."""

    __slots__ = ("_base", "_local", "_deleted")

    def __init__(self, base: dict[str, Any]) -> None:
        self._base = base
        self._local: dict[str, Any] = {}
        self._deleted: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        value = self._local.get(key, _MISSING)
        if value is not _MISSING:
            return value
        if key in self._deleted or key not in self._base:
            raise KeyError(key)
        # Any caller holding a keyed record may mutate it: give it a private copy.
        value = copy_record(self._base[key])
        self._local[key] = value
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        self._deleted.discard(key)
        self._local[key] = value

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._local.pop(key, None)
        self._deleted.add(key)

    def __contains__(self, key: object) -> bool:
        return key in self._local or (key not in self._deleted and key in self._base)

    def __iter__(self) -> Iterator[str]:
        for key in self._base:
            if key not in self._deleted:
                yield key
        for key in self._local:
            if key not in self._base:
                yield key

    def __len__(self) -> int:
        extra = sum(1 for k in self._local if k not in self._base)
        return len(self._base) - len(self._deleted) + extra

    def values(self):  # type: ignore[override]
        # Read-only iteration (searches): private copies where they exist, the shared records otherwise.
        for key in self:
            yield self._local[key] if key in self._local else self._base[key]

    def items(self):  # type: ignore[override]
        for key in self:
            yield key, (self._local[key] if key in self._local else self._base[key])

    def touched(self) -> set[str]:
        """Keys whose record may differ from the base (copied, added or deleted)."""
        return set(self._local) | self._deleted

    def current(self, key: str) -> Any:
        """The record now visible under `key` without copying it (None if absent)."""
        if key in self._local:
            return self._local[key]
        if key in self._deleted:
            return None
        return self._base.get(key)


TABLES = ("flights", "users", "reservations")


class EpisodeDB:
    """What the airline tools see as `self.db`: the three tables of one episode."""

    __slots__ = ("flights", "users", "reservations", "_base")

    def __init__(self, base: Any) -> None:
        self._base = base
        self.flights = CowTable(base.flights)
        self.users = CowTable(base.users)
        self.reservations = CowTable(base.reservations)

    def get_statistics(self) -> dict[str, int]:
        return {
            "num_flights": len(self.flights),
            "num_users": len(self.users),
            "num_reservations": len(self.reservations),
        }

    def touched(self) -> dict[str, set[str]]:
        return {t: getattr(self, t).touched() for t in TABLES}

    def record_json(self, table: str, key: str) -> str | None:
        """Canonical JSON of one record (sorted keys, as τ²'s DB hash serialises it); None if absent."""
        return record_json(getattr(self, table).current(key))


def record_json(record: Any) -> str | None:
    if record is None:
        return None
    # warnings=False: a value a tool stored as sent ("2" for a count, as τ² does) dumps as is, without a warning.
    return json.dumps(record.model_dump(warnings=False), sort_keys=True, default=str)


def diff_records(a: EpisodeDB, b: EpisodeDB) -> list[str]:
    """`table/key` of every record that differs between two views of the same base (empty = equal DBs).

    Records neither view touched are the same shared object, so only the union of touched keys is compared;
    this is equivalent to comparing τ²'s hash of the full database dump.
    """
    out = []
    for table in TABLES:
        keys = getattr(a, table).touched() | getattr(b, table).touched()
        for key in sorted(keys):
            if a.record_json(table, key) != b.record_json(table, key):
                out.append(f"{table}/{key}")
    return out


def full_db_json(view: Any) -> str:
    """Canonical JSON of a whole database (slow; for tests comparing against the naive full-hash method)."""
    return json.dumps(
        {t: {k: v.model_dump(warnings=False) for k, v in getattr(view, t).items()} for t in TABLES},
        sort_keys=True,
        default=str,
    )
