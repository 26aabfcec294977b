"""The public conformance suite (langgraph-checkpoint-conformance) against S3Saver on moto."""

from __future__ import annotations

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import BASE_CAPABILITIES, Capability

from conftest import make_saver


async def test_base_capabilities_pass(endpoint: str) -> None:
    @checkpointer_test(name="S3Saver")
    async def s3_saver_factory():
        saver = make_saver(endpoint)
        await saver.asetup()
        yield saver
        await saver.aclose()

    report = await validate(s3_saver_factory)
    failures = {
        name: [str(f) for f in result.failures]
        for name, result in report.results.items()
        if result.passed is False
    }
    assert not failures, failures
    for capability in (*BASE_CAPABILITIES, Capability.COPY_THREAD):
        result = report.results[capability.value]
        assert result.detected and result.passed, (capability.value, result)
        assert result.tests_passed > 0
