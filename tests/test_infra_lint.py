"""cfn-lint and checkov on infra/template.yaml and infra/replica.yaml.

Both tools come from the Makefile's separate virtualenv (.venv-infra): checkov
pins an older boto3 than aioboto3 allows in the dev environment. Neither may
reach the network (checkov runs with --skip-download).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from infra_support import REPLICA_TEMPLATE, REPO, TEMPLATE, infra_tool, load_template

# The linters live in a virtualenv of their own (checkov alone is ~500 MB to install): make
# test-all and CI (make test-slow) install it and run these; make test does neither.
pytestmark = pytest.mark.slow

TIMEOUT = 300
TEMPLATES = pytest.mark.parametrize("template", [TEMPLATE, REPLICA_TEMPLATE], ids=lambda p: p.name)


def run(*command: str) -> subprocess.CompletedProcess[str]:
    # checkov: no mapping download from its vendor, no version check against PyPI.
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CKV_SKIP_PACKAGE_UPDATE_CHECK": "TRUE"}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT, env=env)


@TEMPLATES
def test_cfn_lint_reports_nothing(template: Path) -> None:
    result = run(infra_tool("cfn-lint"), "--", str(template.relative_to(REPO)))
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@TEMPLATES
def test_checkov_passes_and_every_suppression_is_in_the_template_with_a_reason(template: Path) -> None:
    result = run(
        infra_tool("checkov"),
        "--file",
        str(template.relative_to(REPO)),
        "--framework",
        "cloudformation",
        "--skip-download",
        "--output",
        "json",
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads(result.stdout)
    summary = report["summary"]
    failed = [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
    assert (summary["failed"], failed, summary["parsing_errors"]) == (0, [], 0)
    resources = load_template(template)["Resources"]
    assert summary["resource_count"] == len(resources), "checkov saw every resource"
    assert summary["passed"] > 0

    in_template = {
        (name, skip["id"]): skip.get("comment", "")
        for name, resource in resources.items()
        for skip in resource.get("Metadata", {}).get("checkov", {}).get("skip", [])
    }
    for (name, check), comment in in_template.items():
        assert len(comment.split()) >= 5, f"{name}: suppression of {check} needs its reason"
    skipped = {
        (c["resource"].split(".", 1)[1], c["check_id"]): c["check_result"].get("suppress_comment", "")
        for c in report["results"]["skipped_checks"]
    }
    # Every skip checkov applied is one the template declares next to its resource
    # (none from a CLI flag or a config file). A resource checkov runs no check on (the
    # key store, KeyBucket: checkov 3.3 evaluates nothing of it) keeps its suppressions,
    # with their reasons, for a version that does.
    checked = {c["resource"].split(".", 1)[1] for kind in ("passed_checks", "failed_checks", "skipped_checks") for c in report["results"][kind]}
    assert skipped == {k: v for k, v in in_template.items() if k[0] in checked}
    assert {name for name, _ in in_template} - checked <= {"KeyBucket"}
