"""Conformance, verify and certify results as a JUnit XML report (what CI systems read): one testcase per check.

Each testcase carries what the check measured as its ``measured`` property and in ``system-out``;
a failed check has a ``failure`` element with the reason.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

__all__ = ["junit_xml"]


def junit_xml(results: Sequence[Any], *, backend: str, suite_name: str = "mixle-parallel conformance") -> str:
    """A JUnit XML document for ``results`` (``suite.CheckResult``s) of the backend ``backend``, as the test suite
    ``suite_name`` (``mixle-parallel verify`` and ``certify`` write theirs under their own names)."""
    failures = sum(1 for r in results if not r.passed)
    total = sum(r.seconds for r in results)
    suites = ET.Element("testsuites", tests=str(len(results)), failures=str(failures), time=f"{total:.3f}")
    suite = ET.SubElement(suites, "testsuite", name=suite_name, tests=str(len(results)),
                          failures=str(failures), errors="0", skipped="0", time=f"{total:.3f}")
    ET.SubElement(ET.SubElement(suite, "properties"), "property", name="backend", value=str(backend))
    for result in results:
        case = ET.SubElement(suite, "testcase", classname=suite_name.replace("mixle-parallel ", "mixle_parallel."),
                             name=result.name,
                             time=f"{result.seconds:.3f}")
        if result.passed:
            ET.SubElement(ET.SubElement(case, "properties"), "property", name="measured", value=result.detail)
            ET.SubElement(case, "system-out").text = result.detail
        else:
            first = result.detail.splitlines()[0] if result.detail else "failed"
            ET.SubElement(case, "failure", message=first).text = result.detail
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)
