"""Job schedules: Quartz cron expressions as the Databricks Jobs API gives them, the next fire time
computed exactly (time zones, day fields, steps), and every unusable one refused by name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from pipelines.orchestration.runner import fires_between
from pipelines.orchestration.schedule import InvalidScheduleError, Schedule
from pipelines.orchestration.spec import InvalidJobSpecError, load_job_spec

JOB = Path(__file__).resolve().parents[2] / "pipelines/jobs/maintenance_job.py"
TASK = {"task_key": "m", "spark_python_task": {"python_file": str(JOB)}}


def fires(expression: str, after: datetime, count: int = 3, timezone: str = "UTC") -> list[str]:
    schedule, found = Schedule(expression, timezone), []
    for _ in range(count):
        after = schedule.next_after(after)
        found.append(after.isoformat())
    return found


def test_fire_times_follow_the_expression():
    t = datetime(2026, 11, 25, 23, 47, 12, tzinfo=UTC)  # a Wednesday
    assert fires("0 15 * * * ?", t) == [
        "2026-11-26T00:15:00+00:00",
        "2026-11-26T01:15:00+00:00",
        "2026-11-26T02:15:00+00:00",
    ]
    assert fires("*/20 * * * * ?", t) == [
        "2026-11-25T23:47:20+00:00",
        "2026-11-25T23:47:40+00:00",
        "2026-11-25T23:48:00+00:00",
    ]
    # weekdays at 02:30, by name; a range with a step; a list of months
    assert fires("0 30 2 ? * MON-FRI", t, 3) == [
        "2026-11-26T02:30:00+00:00",
        "2026-11-27T02:30:00+00:00",
        "2026-11-30T02:30:00+00:00",
    ]
    assert fires("0 0 0-12/6 1 JAN,JUL ?", t, 4) == [
        "2027-01-01T00:00:00+00:00",
        "2027-01-01T06:00:00+00:00",
        "2027-01-01T12:00:00+00:00",
        "2027-07-01T00:00:00+00:00",
    ]
    # Quartz day-of-week numbers: 1 is Sunday; 29 February: the next leap year
    assert fires("0 0 12 ? * 1", t, 1) == ["2026-11-29T12:00:00+00:00"]
    assert fires("0 0 0 29 2 ?", t, 1) == ["2028-02-29T00:00:00+00:00"]
    # an exact fire time is not "after" itself
    assert fires("0 15 * * * ?", datetime(2026, 11, 26, 0, 15, tzinfo=UTC), 1) == [
        "2026-11-26T01:15:00+00:00"
    ]


def test_quartz_day_rules_last_nearest_weekday_nth_and_wrapping_ranges():
    """Expected times as Quartz 2.5.2's CronExpression gives them (2026-01-01 is a Thursday)."""
    t = datetime(2026, 1, 1, tzinfo=UTC)

    def days(expression: str, count: int) -> list[str]:
        return [f[:10] for f in fires(expression, t, count)]

    assert days("0 0 12 L * ?", 3) == ["2026-01-31", "2026-02-28", "2026-03-31"]
    assert days("0 0 12 L-3 * ?", 2) == ["2026-01-28", "2026-02-25"]
    assert days("0 0 12 LW * ?", 3) == ["2026-01-30", "2026-02-27", "2026-03-31"]
    assert days("0 0 12 15W * ?", 2) == ["2026-01-15", "2026-02-16"]  # 15 Feb: a Sunday
    assert days("0 0 12 1W * ?", 2) == ["2026-01-01", "2026-02-02"]  # never into January
    assert days("0 0 12 31W * ?", 3) == ["2026-01-30", "2026-03-31", "2026-05-29"]
    assert days("0 0 12 ? * 6L", 2) == ["2026-01-30", "2026-02-27"]  # last Friday
    assert days("0 0 12 ? * 6#3", 2) == ["2026-01-16", "2026-02-20"]  # third Friday
    assert days("0 0 12 ? * MON#5", 2) == ["2026-03-30", "2026-06-29"]
    assert days("0 0 12 ? * L", 2) == ["2026-01-03", "2026-01-10"]  # L alone: Saturday
    assert days("0 0 12 ? * FRI-MON", 4) == ["2026-01-02", "2026-01-03", "2026-01-04", "2026-01-05"]
    assert days("0 0 12 LW,15 * ?", 3) == ["2026-01-15", "2026-01-30", "2026-02-15"]
    assert [f[11:16] for f in fires("0 0 22-2 ? * *", t, 4)] == ["01:00", "02:00", "22:00", "23:00"]


@pytest.mark.parametrize(
    ("expression", "zone", "after", "expected"),
    [
        # New York falls back at 02:00 EDT: 01:00-01:59 twice; fired once, in standard time (as
        # Quartz does), and never before the time asked after
        ("0 */15 * * * ?", "America/New_York", "2026-11-01T00:30:00-04:00",
         ["2026-11-01T00:45:00-04:00", "2026-11-01T01:00:00-05:00", "2026-11-01T01:15:00-05:00",
          "2026-11-01T01:30:00-05:00", "2026-11-01T01:45:00-05:00", "2026-11-01T02:00:00-05:00"]),
        ("0 */15 * * * ?", "America/New_York", "2026-11-01T01:10:00-05:00",
         ["2026-11-01T01:15:00-05:00", "2026-11-01T01:30:00-05:00"]),
        ("0 30 1 * * ?", "America/New_York", "2026-10-31T12:00:00-04:00",
         ["2026-11-01T01:30:00-05:00", "2026-11-02T01:30:00-05:00"]),
        # it springs forward at 02:00 EST: 02:00-02:59 does not exist and does not fire
        ("0 */30 * * * ?", "America/New_York", "2026-03-08T01:00:00-05:00",
         ["2026-03-08T01:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-08T03:30:00-04:00"]),
        ("0 30 2 * * ?", "America/New_York", "2026-03-07T12:00:00-05:00",
         ["2026-03-09T02:30:00-04:00", "2026-03-10T02:30:00-04:00"]),
        # Berlin, the same rules at its own hours
        ("0 */20 * * * ?", "Europe/Berlin", "2026-03-29T01:30:00+01:00",
         ["2026-03-29T01:40:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T03:20:00+02:00"]),
        ("0 30 2 * * ?", "Europe/Berlin", "2026-03-28T12:00:00+01:00",
         ["2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"]),
        ("0 */20 * * * ?", "Europe/Berlin", "2026-10-25T02:10:00+02:00",
         ["2026-10-25T02:20:00+01:00", "2026-10-25T02:40:00+01:00", "2026-10-25T03:00:00+01:00"]),
        ("0 30 2 * * ?", "Europe/Berlin", "2026-10-24T12:00:00+02:00",
         ["2026-10-25T02:30:00+01:00", "2026-10-26T02:30:00+01:00"]),
    ],
)  # fmt: skip
def test_fire_times_across_daylight_saving_changes_are_quartzs(expression, zone, after, expected):
    """Each list as Quartz 2.5.2's CronExpression gives it (the same instants, checked)."""
    assert fires(expression, datetime.fromisoformat(after), len(expected), zone) == expected


def test_fire_times_are_in_the_schedule_time_zone():
    t = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    [fire] = fires("0 0 3 * * ?", t, 1, "America/New_York")
    assert fire == "2026-11-26T03:00:00-05:00"  # 08:00 UTC


def test_a_year_in_the_past_has_no_fire_time():
    assert Schedule("0 0 0 1 1 ? 2020").next_after(datetime(2026, 1, 1, tzinfo=UTC)) is None


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 15 * * *", "has 6 or 7 fields"),
        ("0 61 * * * ?", "minutes: '61' is not in 0-59"),
        ("0 0 12 * * *", "one of day-of-month and day-of-week must be '?'"),
        ("0 0 12 ? * ?", "one of day-of-month and day-of-week must be '?'"),
        ("0 0 12 5 * MON", "one of day-of-month and day-of-week must be '?'"),
        ("0 0 0 ? * MON#6", "day-of-week: 'MON#6': the week is 1-5"),
        ("0 0 0 3L * ?", "day-of-month: '3L' is not a Quartz day rule"),
        ("0 0 0 ? XYZ *", "month: 'XYZ' is not in 1-12"),
        ("0 0 0 12-3 * ?", "day-of-month: '12-3': the range is empty"),
        ("0 */0 * * * ?", "minutes: '*/0': the step must be a positive number"),
    ],
)
def test_an_unusable_expression_is_refused_naming_its_field(expression, message):
    with pytest.raises(InvalidScheduleError, match=message.replace("*", r"\*")):
        Schedule(expression)


def test_a_spec_schedule_is_read_and_its_problems_named(tmp_path):
    spec = {"name": "m", "tasks": [TASK]}
    path = tmp_path / "ok.yaml"
    schedule = {"quartz_cron_expression": "0 15 * * * ?", "timezone_id": "Europe/Paris"}
    path.write_text(yaml.safe_dump({**spec, "schedule": schedule}))
    job = load_job_spec(path)
    assert job.schedule == Schedule("0 15 * * * ?", "Europe/Paris", paused=False)

    bad = {"quartz_cron_expression": "0 15 * *", "pause_status": "OFF", "tz": "UTC"}
    path.write_text(yaml.safe_dump({**spec, "schedule": bad}))
    with pytest.raises(InvalidJobSpecError) as e:
        load_job_spec(path)
    assert "job.schedule.tz: not a field of the Jobs API's CronSchedule" in str(e.value)
    assert "job.schedule.pause_status: 'OFF' is not PAUSED or UNPAUSED" in str(e.value)
    assert "job.schedule: '0 15 * *': a Quartz cron expression has 6 or 7 fields" in str(e.value)

    path.write_text(yaml.safe_dump({**spec, "schedule": {**schedule, "timezone_id": "Mars/Base"}}))
    with pytest.raises(InvalidJobSpecError, match="timezone_id: unknown time zone 'Mars/Base'"):
        load_job_spec(path)


def test_fire_times_a_long_run_overlapped_are_counted_as_skipped():
    schedule = Schedule("0 */10 * * * ?")
    first = datetime(2026, 11, 25, 10, 10, tzinfo=UTC)
    # a run from 10:10 that ended at 10:41: 10:20, 10:30 and 10:40 passed meanwhile
    assert fires_between(schedule, first + timedelta(minutes=10), first.replace(minute=41)) == 3
