"""Cron expressions as Cloud Scheduler and Airflow read them: the five unix-cron fields checked, the times a cron
fires in an IANA time zone (CronTimes), and the fires after or before a moment, which a schedule's sample runs
(runners/scheduling.py) are built from. Must not know schedules or launch anything.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
import zoneinfo
from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone

# unix-cron, as Cloud Scheduler documents it: field, lowest, highest, names (numbered from lowest).
MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
CRON_FIELDS = (("minute", 0, 59, ()), ("hour", 0, 23, ()), ("day of month", 1, 31, ()),
               ("month", 1, 12, MONTHS), ("day of week", 0, 7, WEEKDAYS))  # day of week 7 is Sunday too
_CRON_PART = re.compile(r"^(?:(\*)|(\w+)(?:-(\w+))?)(?:/(\d+))?$")


def _cron_value(text: str, name: str, low: int, high: int, names: tuple[str, ...]) -> int:
    if text.upper() in names:  # names in any case, as cron and Airflow's croniter read them
        return low + names.index(text.upper())
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:  # int() also reads other scripts' digits
        spelled = f" or {names[0]}-{names[-1]}" if names else ""
        raise ValueError(f"{name} {text!r} is not {low}-{high}{spelled}")
    return int(text)


DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February 29 comes in leap years


def check_cron(cron: str) -> None:
    """Five unix-cron fields: numbers in range or names (JAN, MON), *, a-b ranges, lists, /steps (after *, a
    range, or a start: 5/15 is minute 5 and every 15 after it); and a day of the month that some chosen month
    has (30 2 fires never), unless a day of the week is chosen too (cron fires on either)."""
    fields, values = cron_values(cron)
    days, months = values[2], values[3]
    if fields[4] == "*" and not any(day <= DAYS_IN_MONTH[month - 1] for day in days for month in months):
        raise ValueError(f"cron {cron!r}: no chosen month has day {min(days)}, so it would never run; choose days "
                         "the months have")


def cron_values(cron: str) -> tuple[list[str], list[set[int]]]:
    """The cron's five fields as written and the values each chooses (minutes, hours, days, months, weekdays)."""
    fields = cron.split()
    if len(fields) != 5:
        raise ValueError(f"cron {cron!r}: write five fields (minute hour day month weekday), e.g. '0 3 * * MON-FRI'")
    values = []
    for text, (name, low, high, names) in zip(fields, CRON_FIELDS):
        chosen: set[int] = set()
        for part in text.split(","):
            match = _CRON_PART.match(part)
            try:
                if not match:
                    raise ValueError(f"{name} {part!r} is not N, a-b, *, N/step, a-b/step or */step")
                first, last = low, high
                if match.group(2):
                    first = last = _cron_value(match.group(2), name, low, high, names)
                    if match.group(3):
                        last = _cron_value(match.group(3), name, low, high, names)
                    elif match.group(4):  # N/step: from N to the field's end
                        last = high
                    if last < first:
                        raise ValueError(f"{name} range {part!r} runs backwards")
                step = int(match.group(4) or 1)
                if step < 1:
                    raise ValueError(f"{name} step {part!r} must be at least 1")
                chosen.update(range(first, last + 1, step))
            except ValueError as e:
                raise ValueError(f"cron {cron!r}: {e}") from None
        values.append(chosen)
    return fields, values


@dataclasses.dataclass(frozen=True)
class CronTimes:
    """When a checked cron fires in its time zone, as cron (Cloud Scheduler, Airflow's croniter) reads it."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 is Sunday (a written 7 too)
    either_day: bool  # both day fields chosen (neither is *): cron fires on a day that matches either
    zone: zoneinfo.ZoneInfo

    def runs_on(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        by_date, by_weekday = day.day in self.days, day.isoweekday() % 7 in self.weekdays
        return (by_date or by_weekday) if self.either_day else (by_date and by_weekday)

    def fires_on(self, day: date) -> list[datetime]:
        """The day's fire times in UTC (Airflow's dates are UTC), in order; a local time the clocks skip is left out."""
        if not self.runs_on(day):
            return []
        fires = []
        for hour, minute in itertools.product(self.hours, self.minutes):
            local = datetime(day.year, day.month, day.day, hour, minute, tzinfo=self.zone)
            fire = local.astimezone(timezone.utc)
            if fire.astimezone(self.zone).replace(tzinfo=None) == local.replace(tzinfo=None):  # not in a DST gap
                fires.append(fire)
        return fires


def cron_times(cron: str, time_zone: str) -> CronTimes:
    """The fire times of a cron check_cron accepted, in an IANA time zone check_time_zone accepted."""
    fields, (minutes, hours, days, months, weekdays) = cron_values(cron)
    return CronTimes(tuple(sorted(minutes)), tuple(sorted(hours)), frozenset(days), frozenset(months),
                     frozenset(d % 7 for d in weekdays), fields[2] != "*" and fields[4] != "*", zoneinfo.ZoneInfo(time_zone))


# A cron of 29 February fires once in four years: the three fires after a day lie within twelve years of it.
# check_cron has refused a cron that never fires.
SEARCH_DAYS = 366 * 13


def fires_after(times: CronTimes, start: datetime) -> Iterator[datetime]:
    """The cron's fire times from `start` on, in order (UTC), for SEARCH_DAYS days."""
    day, last = start.astimezone(times.zone).date(), None
    for _ in range(SEARCH_DAYS):
        for fire in times.fires_on(day):
            if fire >= start and (last is None or fire > last):  # a time the clocks repeat fires once
                last = fire
                yield fire
        day += timedelta(days=1)


def fire_before(times: CronTimes, start: datetime) -> datetime:
    """The cron's last fire time before `start` (UTC)."""
    day = start.astimezone(times.zone).date()
    for _ in range(SEARCH_DAYS):
        earlier = [fire for fire in times.fires_on(day) if fire < start]
        if earlier:
            return earlier[-1]
        day -= timedelta(days=1)
    raise ValueError(f"the cron fires nowhere in the {SEARCH_DAYS} days before {start:%Y-%m-%d}")


def check_time_zone(time_zone: str) -> None:
    """An IANA time zone name, as Cloud Scheduler and Airflow take it: not this machine's `localtime` file, nor
    the tz database's right/ and posix/ variants."""
    try:
        zoneinfo.ZoneInfo(time_zone)
        known = time_zone not in ("localtime", "posixrules") and not time_zone.startswith(("right/", "posix/"))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        known = False
    if not known:
        raise ValueError(f"time_zone {time_zone!r} is not an IANA time zone; write e.g. Etc/UTC or Europe/Berlin")
