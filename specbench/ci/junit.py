"""JUnit XML of a report's checks (gate.py), the test-report format every CI system shows: one test case per
method x dataset x check, a failed check as <failure>, a skipped one (not judged: disturbed timing, lossy method,
no baseline row) as <skipped> with the reason."""

from __future__ import annotations

import os
import socket
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

from ..errors import SpecbenchError
from .gate import GateOutcome


def check_writable(path: Path, option: str) -> None:
    """Refuse early (before any work) a path that cannot be written: its folder is created, like pytest does."""
    path = Path(path)
    if path.is_dir():
        raise SpecbenchError(f"{option} {path}: is a folder; give a file name such as {path / 'specbench.xml'}")
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise SpecbenchError(f"{option} {path}: {blocker} is a file, not a folder; choose another path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecbenchError(f"{option} {path}: cannot create its folder ({exc.strerror or exc})") from exc
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SpecbenchError(f"{option} {path}: not writable; choose another path")


def write(path: Path, checks: list[GateOutcome], suite: str, properties: dict) -> None:
    """One <testsuite> named `suite`; `properties` (model, hardware, dtype, git, baseline, ...) as <properties>."""
    counts = {"tests": len(checks), "failures": sum(c.status == "failed" for c in checks),
              "skipped": sum(c.status == "skipped" for c in checks), "errors": 0}
    root = ET.Element("testsuites", name="specbench", **{k: str(v) for k, v in counts.items()}, time="0")
    node = ET.SubElement(root, "testsuite", name=suite, **{k: str(v) for k, v in counts.items()}, time="0",
                         timestamp=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
                         hostname=socket.gethostname())
    props = ET.SubElement(node, "properties")
    for key, value in properties.items():
        if value not in (None, ""):
            ET.SubElement(props, "property", name=str(key), value=str(value))
    for c in checks:
        case = ET.SubElement(node, "testcase", classname=f"specbench.{c.method}", name=f"{c.name} on {c.dataset}",
                             time="0")
        if c.status == "failed":
            ET.SubElement(case, "failure", message=c.message, type=c.name).text = c.message
        elif c.status == "skipped":
            ET.SubElement(case, "skipped", message=c.message)
        else:
            ET.SubElement(case, "system-out").text = c.message
    ET.indent(root)
    try:
        Path(path).write_bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n")
    except OSError as exc:
        raise SpecbenchError(f"--junit {path}: cannot write it ({exc.strerror or exc})") from exc
