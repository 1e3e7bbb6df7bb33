"""A job's schedule, as the Databricks Jobs API gives it: a Quartz cron expression in a time zone.

`seconds minutes hours day-of-month month day-of-week [year]`, each field `*`, a number or name
(`JAN`, `MON`), a range `a-b` (`FRI-MON` wraps), a step `*/n`, `a/n` or `a-b/n`, or a list of
these; day-of-week 1 is Sunday. Exactly one day field is `?`: the other decides. Quartz's day
rules: `L` (the last day; in day-of-week, Saturday), `L-n`, `LW` (the last weekday), `nW` (the
weekday nearest day n, within its month), `nL` (the month's last weekday n), `n#k` (its k-th).
Fire times are Quartz's across daylight-saving changes: a skipped wall time does not fire, a
repeated one fires once, in standard time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
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
        if first > last and name not in ("hours", "day-of-week", "month"):
            raise InvalidScheduleError(f"{name}: {part!r}: the range is empty")
        span_values = (
            range(first, last + 1)
            if first <= last
            else [
                *range(first, high + 1),
                *range(low, last + 1),  # Quartz's ranges wrap: 22-2, FRI-MON
            ]
        )
        values.update(list(span_values)[:: int(step or 1)])
    return frozenset(values)


Rule = tuple[str, int, int]  # a day rule: kind, a, b


def _last(d: date) -> int:
    return ((d.replace(day=28) + timedelta(days=4)).replace(day=1) - timedelta(days=1)).day


def _weekday_nearest(d: date, n: int) -> int | None:
    """The day of `d`'s month that is the weekday nearest its day `n` (Quartz's `nW`)."""
    if n > _last(d):
        return None
    day = d.replace(day=n).weekday()  # Monday 0
    if day == 5:
        return n + 2 if n == 1 else n - 1
    if day == 6:
        return n - 2 if n == _last(d) else n + 1
    return n


def quartz_weekday(d: date) -> int:
    return d.isoweekday() % 7 + 1  # Sunday 1 ... Saturday 7


def _day_rule(text: str, field: tuple) -> list[Rule] | None:
    """A day field as rules a date may match (None for `*` and `?`), Quartz's L, W and #
    included: (kind, a, b)."""
    if text in ("*", "?"):
        return None
    month_day = field[0] == "day-of-month"
    rules: list[Rule] = []
    plain: list[str] = []
    for part in text.upper().split(","):
        if month_day and (m := re.fullmatch(r"L(?:-(\d+))?", part)):
            rules.append(("last", int(m[1] or 0), 0))
        elif month_day and (m := re.fullmatch(r"(\d*|L)W", part)):
            rules.append(("nearest", 0 if m[1] == "L" else _value(m[1], field), 0))
        elif not month_day and part == "L":
            plain.append("7")
        elif not month_day and (m := re.fullmatch(r"(\w+)L", part)):
            rules.append(("last of", _value(m[1], field), 0))
        elif not month_day and (m := re.fullmatch(r"(\w+)#(\d)", part)):
            if not 1 <= int(m[2]) <= 5:
                raise InvalidScheduleError(f"{field[0]}: {part!r}: the week is 1-5")
            rules.append(("nth", _value(m[1], field), int(m[2])))
        elif re.search("[LW#]", part) and part not in field[3]:
            raise InvalidScheduleError(f"{field[0]}: {part!r} is not a Quartz day rule")
        else:
            plain.append(part)
    kind = "day" if month_day else "weekday"
    rules += [(kind, v, 0) for v in sorted(_field(",".join(plain), field) or ())] if plain else []
    return rules


def _matches(d: date, rules: list[Rule]) -> bool:
    last, weekday = _last(d), quartz_weekday(d)
    return any(
        (kind == "day" and d.day == a)
        or (kind == "weekday" and weekday == a)
        or (kind == "last" and d.day == last - a)
        or (kind == "nearest" and d.day == _weekday_nearest(d, a or last))
        or (kind == "last of" and weekday == a and d.day + 7 > last)
        or (kind == "nth" and weekday == a and (d.day + 6) // 7 == b)
        for kind, a, b in rules
    )


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
    def _fields(self) -> tuple[list[frozenset[int] | None], list[Rule] | None, list[Rule] | None]:
        parts = self.expression.split()
        if len(parts) not in (6, 7):
            raise InvalidScheduleError(
                f"{self.expression!r}: a Quartz cron expression has 6 or 7 fields (seconds "
                "minutes hours day-of-month month day-of-week [year]), this one has "
                f"{len(parts)}"
            )
        if (parts[3] == "?") == (parts[5] == "?"):
            raise InvalidScheduleError(
                f"{self.expression!r}: one of day-of-month and day-of-week must be '?' (Quartz "
                "does not take both)"
            )
        try:
            fields = [
                None if i in (3, 5) else _field(text, field)
                for i, (text, field) in enumerate(zip(parts, FIELDS, strict=False))
            ]
            return fields, _day_rule(parts[3], FIELDS[3]), _day_rule(parts[5], FIELDS[5])
        except InvalidScheduleError as e:
            raise InvalidScheduleError(f"{self.expression!r}, {e}") from None

    def next_after(self, after: datetime) -> datetime | None:
        """The first fire time strictly after `after` (aware), in the schedule's time zone; None
        when there is none (a year field in the past)."""
        (sec, minute, hour, _, month, _, *years), dom, dow = self._fields
        year = years[0] if years else None
        zone = ZoneInfo(self.timezone)
        t = after.astimezone(zone).replace(microsecond=0, tzinfo=None) + timedelta(seconds=1)
        day = t.replace(hour=0, minute=0, second=0)
        for _ in range(366 * 8):  # every day of 8 years: the longest gap between leap days
            d = day.date()
            if (
                (month is None or d.month in month)
                and (year is None or d.year in year)
                and ((rules := dom if dom is not None else dow) is None or _matches(d, rules))
            ):
                for h in _allowed(hour, 0, 23):
                    for m in _allowed(minute, 0, 59):
                        for s in _allowed(sec, 0, 59):
                            wall = day.replace(hour=h, minute=m, second=s)
                            if wall >= t and (fire := _instant(wall, zone)) and fire > after:
                                return fire
            day += timedelta(days=1)
        return None


def _instant(wall: datetime, zone: ZoneInfo) -> datetime | None:
    """A wall time in `zone` as Quartz takes it: a repeated one in standard time (the later), a
    skipped one as none."""
    fire = wall.replace(tzinfo=zone, fold=1)
    return fire if fire.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall else None


def _allowed(values: frozenset[int] | None, low: int, high: int) -> list[int]:
    return sorted(values) if values is not None else list(range(low, high + 1))
