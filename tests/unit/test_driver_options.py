"""The driver JVM's options: the parallel collector unless the environment chooses one."""

from __future__ import annotations

import pytest

from pipelines.local import cds


@pytest.mark.parametrize("variable", ["JDK_JAVA_OPTIONS", "JAVA_TOOL_OPTIONS"])
def test_a_collector_chosen_in_the_environment_wins(monkeypatch, variable):
    monkeypatch.delenv("JDK_JAVA_OPTIONS", raising=False)
    monkeypatch.delenv("JAVA_TOOL_OPTIONS", raising=False)
    assert cds.driver_java_options().split()[0] == "-XX:+UseParallelGC"
    monkeypatch.setenv(variable, "-Xmx2g -XX:+UseG1GC -Dx=1")
    options = cds.driver_java_options().split()
    assert options[0].startswith("-Dlog4j2.configurationFile=")
    assert not [o for o in options if o.endswith("GC")]
    monkeypatch.setenv(variable, "-XX:+UseGCOverheadLimit")  # not a collector
    assert cds.driver_java_options().split()[0] == "-XX:+UseParallelGC"
