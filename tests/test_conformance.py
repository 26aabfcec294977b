"""The public conformance suite (langgraph-checkpoint-conformance): both index modes on
moto, and the manifest mode on a real S3-compatible server (SeaweedFS)."""

from __future__ import annotations

from collections.abc import Callable

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from conftest import make_saver, seaweedfs_saver


async def _passes(make: Callable[[], object]) -> None:
    @checkpointer_test(name="S3Saver")
    async def s3_saver_factory():
        saver = make()
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
    # All 8: the 5 base capabilities and the 3 extended ones (copy, prune, delete_for_runs).
    for capability in ALL_CAPABILITIES:
        result = report.results[capability.value]
        assert result.detected and result.passed, (capability.value, result)
        assert result.tests_passed > 0


async def test_base_capabilities_pass_on_moto(endpoint: str, index_mode: str) -> None:
    await _passes(lambda: make_saver(endpoint, index_mode))


async def test_base_capabilities_pass_on_seaweedfs_in_manifest_mode(seaweedfs_bucket: tuple[str, str]) -> None:
    endpoint, bucket = seaweedfs_bucket
    await _passes(lambda: seaweedfs_saver(endpoint, bucket))
