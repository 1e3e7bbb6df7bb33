"""A job's schedule, as the Databricks Jobs API gives it: a Quartz cron expression in a time zone.

`seconds minutes hours day-of-month month day-of-week [year]`, each field `*`, `?` (day fields),
a number or name (`JAN`, `MON`), a range `a-b`, a step `*/n` or `a/n` or `a-b/n`, or a list of
these. Quartz's `L`, `W` and `#` are refused with the field named. As in Quartz, when one of the
day fields is `?` the other alone decides; when both are given, a day must match both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pipelines.errors import ConfigError

MONTHS = "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()
DAYS = "SUN MON TUE WED THU FRI SAT".split()  # Quartz: 1 = Sunday ... 7 = Saturday
FIELDS = (  # name, lowest, highest, names
    ("seconds", 0, 59, ()),
    ("minutes", 0, 59, ()),
    ("hours", 0, 23, ()),
    ("day-of-month", 1, 31, ()),
    ("month", 1, 12, MONTHS),
    ("day-of-week", 1, 7, DAYS),
    ("year", 1970, 2199, ()),
)


class InvalidScheduleError(ConfigError):
    """A cron expression or time zone that cannot be used; the message names the field."""


def _value(token: str, field: tuple) -> int:
    name, low, high, names = field
    upper = token.upper()
    if upper in names:
        return names.index(upper) + low
    if not token.isdigit() or not low <= int(token) <= high:
        raise InvalidScheduleError(f"{name}: {token!r} is not in {low}-{high}")
    return int(token)


def _field(text: str, field: tuple) -> frozenset[int] | None:
    """The values a field allows; None for `*` and `?` (any)."""
    name, low, high, _ = field
    if text in ("*", "?"):
        return None
    tokens = re.split(r"[,/-]", text.upper())
    if any(re.search("[LW#]", t) and t not in field[3] for t in tokens):
        raise InvalidScheduleError(f"{name}: {text!r}: Quartz's L, W and # are not supported")
    values: set[int] = set()
    for part in text.split(","):
        span, _, step = part.partition("/")
        if span == "*":
            first, last = low, high
        else:
            first_text, dash, last_text = span.partition("-")
            first = _value(first_text, field)
            last = _value(last_text, field) if dash else (high if step else first)
        if step and (not step.isdigit() or int(step) == 0):
            raise InvalidScheduleError(f"{name}: {part!r}: the step must be a positive number")
        if first > last:
            raise InvalidScheduleError(f"{name}: {part!r}: the range is empty")
        values.update(range(first, last + 1, int(step or 1)))
    return frozenset(values)


@dataclass(frozen=True)
class Schedule:
    """When a job runs: `next_after(t)` is the first fire time after t."""

    expression: str
    timezone: str = "UTC"
    paused: bool = False

    def __post_init__(self) -> None:
        self._fields  # noqa: B018 (checked when made, not when first used)
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidScheduleError(
                f"timezone_id: unknown time zone {self.timezone!r}"
            ) from None

    @property
    def _fields(self) -> list[frozenset[int] | None]:
        parts = self.expression.split()
        if len(parts) not in (6, 7):
            raise InvalidScheduleError(
                f"{self.expression!r}: a Quartz cron expression has 6 or 7 fields (seconds "
                "minutes hours day-of-month month day-of-week [year]), this one has "
                f"{len(parts)}"
            )
        try:
            return [_field(text, field) for text, field in zip(parts, FIELDS, strict=False)]
        except InvalidScheduleError as e:
            raise InvalidScheduleError(f"{self.expression!r}, {e}") from None

    def next_after(self, after: datetime) -> datetime | None:
        """The first fire time strictly after `after` (aware), in the schedule's time zone; None
        when there is none (a year field in the past)."""
        sec, minute, hour, dom, month, dow, *years = self._fields
        year = years[0] if years else None
        zone = ZoneInfo(self.timezone)
        t = after.astimezone(zone).replace(microsecond=0, tzinfo=None) + timedelta(seconds=1)
        day = t.replace(hour=0, minute=0, second=0)
        for _ in range(366 * 8):  # every day of 8 years: the longest gap between leap days
            if _day_matches(day, dom, month, dow, year):
                for h in _allowed(hour, 0, 23):
                    for m in _allowed(minute, 0, 59):
                        for s in _allowed(sec, 0, 59):
                            candidate = day.replace(hour=h, minute=m, second=s)
                            if candidate >= t:
                                # a time a DST change skips is run at the same wall time + 1 h
                                return candidate.replace(tzinfo=zone)
            day += timedelta(days=1)
        return None


def _allowed(values: frozenset[int] | None, low: int, high: int) -> list[int]:
    return sorted(values) if values is not None else list(range(low, high + 1))


def _day_matches(day: datetime, dom, month, dow, year) -> bool:
    quartz_dow = (day.isoweekday() % 7) + 1  # Sunday 1 ... Saturday 7
    return (
        (month is None or day.month in month)
        and (year is None or day.year in year)
        and (dom is None or day.day in dom)
        and (dow is None or quartz_dow in dow)
    )
