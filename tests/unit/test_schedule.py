"""Job schedules: Quartz cron expressions as the Databricks Jobs API gives them, the next fire time
computed exactly (time zones, day fields, steps), and every unusable one refused by name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import yaml

from pipelines.orchestration.runner import fires_between
from pipelines.orchestration.schedule import InvalidScheduleError, Schedule
from pipelines.orchestration.spec import InvalidJobSpecError, load_job_spec

TASK = {"task_key": "m", "spark_python_task": {"python_file": "pipelines/jobs/maintenance_job.py"}}


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
        ("0 0 0 L * ?", "day-of-month: 'L': Quartz's L, W and # are not supported"),
        ("0 0 0 ? * MON#2", "day-of-week: 'MON#2'"),
        ("0 0 0 ? XYZ *", "month: 'XYZ' is not in 1-12"),
        ("0 0 12-3 * * ?", "hours: '12-3': the range is empty"),
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
    assert "job.schedule.tz: unknown key" in str(e.value)
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
